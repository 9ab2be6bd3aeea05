"""A non-root user's commands that run containers re-run themselves in a user namespace of the
user's subordinate ids (:mod:`infra.rootless`), before anything starts."""

from __future__ import annotations

from orchestrator.environments import SandboxMode


def enter_for_containers(sandbox: SandboxMode = SandboxMode.AUTO) -> None:
    """This command again, in the user's namespace, where its tasks may run in containers.

    Nothing happens as root, inside already, with ``--sandbox bubblewrap``, with
    ``OPENFORGE_ROOTLESS=0``, or where the namespace cannot be had (no subordinate ids, no
    ``newuidmap``): the container sandbox's preflight then says why, and ``auto`` runs the tasks
    in bubblewrap.
    """
    from infra import rootless

    if sandbox is SandboxMode.BUBBLEWRAP or not rootless.wanted():
        return
    if rootless.unavailable() is None:
        rootless.reexec()
