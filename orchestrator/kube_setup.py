"""What a run makes sure of in its namespace before its first pod: the namespace itself, the
rollout NetworkPolicy, and no expired strays of earlier runs.

The namespace is made when it is not there and the backend's account may make it (an admin
kubeconfig, as ``openforge services up --kube`` prints). An account limited to the namespace
(the manifests' Role in ``infra/k8s/base/orchestrator.yaml``: no cluster-scoped rights) can
neither read nor make a Namespace; the manifests make it (``namespaces.yaml``), so a 403 on the
read is taken as "made by whoever granted the Role".
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from orchestrator.kube_api import KubeApi
from orchestrator.kube_objects import EXPIRES, MANAGED, ROLE, network_policy
from schemas.errors import InfrastructureError, SetupError

log = logging.getLogger(__name__)
POLICY_HINT = "; the orchestrator needs create/patch on networkpolicies there (infra/k8s)"


def ensure_namespace(k8s: KubeApi, ns: str) -> None:
    """Make namespace ``ns`` if it is not there; a SetupError saying what to run if it is
    missing and this account may not make it."""
    found = k8s.status(k8s.core.read_namespace, ns)
    if found in (200, 403):  # there, or not ours to see (a namespaced Role: the manifests made it)
        return
    if found != 404:
        raise InfrastructureError(f"Kubernetes API: reading namespace {ns} answered {found}")
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": MANAGED}}
    made = k8s.status(k8s.core.create_namespace, body)
    if made in (201, 409):  # 409: another run made it meanwhile
        log.info("namespace %s made", ns)
        return
    raise SetupError(
        f"namespace {ns} does not exist and this account may not create it ({made}): create it "
        f"with `kubectl create namespace {ns}` (or apply infra/k8s/base/namespaces.yaml), or "
        "give the account create on namespaces"
    )


def ensure_policy(k8s: KubeApi, ns: str, options: Any) -> None:
    """The rollout NetworkPolicy of ``ns`` as the backend's ``options`` (its KubeOptions, not
    imported here: kubernetes.py imports this module) need it: made, or patched when there."""
    body = network_policy(
        ns, options.proxy_namespace, options.proxy_labels,
        options.proxy_port, options.proxy_ports, options.proxy_cidr,
    )  # fmt: skip
    what = f"creating the rollout NetworkPolicy in {ns}"
    made = k8s.call(k8s.net.create_namespaced_network_policy, ns, body,
                    what=what, hint=POLICY_HINT, conflict_ok=True)  # fmt: skip
    if made is None:  # there already: make it say what this run needs
        k8s.call(k8s.net.patch_namespaced_network_policy, "openforge-rollouts",
                 ns, body, hint=POLICY_HINT)  # fmt: skip


def sweep_strays(k8s: KubeApi, ns: str) -> None:
    """Delete the anchors (and so everything) of runs whose expiry has passed."""
    anchors = k8s.read(k8s.core.list_namespaced_config_map, ns, label_selector=f"{ROLE}=run")
    now = time.time()
    for anchor in anchors["items"]:
        expires = (anchor["metadata"].get("annotations") or {}).get(EXPIRES, "")
        if expires.isdigit() and int(expires) < now:
            log.info("deleting stray run %s (expired)", anchor["metadata"]["name"])
            with contextlib.suppress(InfrastructureError):
                k8s.call(k8s.core.delete_namespaced_config_map, anchor["metadata"]["name"], ns,
                         propagation_policy="Background")  # fmt: skip
