"""The Kubernetes rollout backend: one pod per rollout, watched to its verified end.

A rollout's pod: :mod:`orchestrator.kube_pod`; the namespace and its NetworkPolicy:
:mod:`orchestrator.kube_setup`. Per run, the backend makes (all owned by the run's anchor
ConfigMap: deleting it deletes the run) the task ConfigMaps (once per task) and per rollout a
Secret and a Pod; every API call goes through :class:`~orchestrator.kube_api.KubeApi`.

One :class:`~infra.kube.PodWatcher` per backend (list, then watch; 410 Gone: list again) feeds
every rollout's state (:mod:`orchestrator.kube_wait`); :meth:`run` waits on it:

- the ``agent`` container's exit is the agent's end (``on_agent_end``): its termination log says
  the harness's exit code (124: the task's agent timeout struck);
- the ``verifier`` container's termination log carries the reward file, read by the rule of
  :mod:`infra.tasks.reward`;
- each of the two also reports what its own cgroup counted: the rollout's ``agent_cpu_s``,
  ``agent_peak_mib``, ``verifier_cpu_s`` and ``verifier_peak_mib`` (``RolloutEvent.costs``;
  its ``*_start_s`` and ``save_s`` are left out: the API's timestamps are whole seconds, and
  the workspace is archived inside the verifier's container);
- an image that cannot be pulled, a container that cannot be created, or a pod the scheduler
  cannot place for ``startup_grace_s`` is an :class:`InfrastructureError` (the orchestrator
  retries it as a new attempt); so is a pod that fails, is evicted or disappears.

After the verifier, the rollout's Pod and Secret are deleted in a batch with other verified
rollouts' (:mod:`orchestrator.kube_reaper`); after a failure, at once. :meth:`cancel`
deletes every pod and secret of the run; :meth:`close` deletes the run's anchor, and with it,
by garbage collection, whatever is left. A run's anchor carries an expiry: a later backend in
the same namespace deletes expired anchors (strays of a run that died with its orchestrator).

The agent's and the verifier's logs are kept in the rollout's directory (``agent.out``,
``verifier.out``); the verifier's log also carries the final workspace, as the agent left it,
saved there as the local backend saves it (:mod:`orchestrator.kube_workspace`), so
``openforge replay rescore`` scores this backend's rollouts again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infra.harnesses import Harness
from infra.harnesses.base import Endpoint, Report, RolloutDirs
from infra.images import ImagePolicy
from infra.kube import PodWatcher, WatchStats, api_client
from infra.tasks import Task, VerifierReward, harbor
from orchestrator import final_workspace, kube_workspace
from orchestrator import kube_status as status
from orchestrator.backend import (
    AgentEnd,
    RolloutBackend,
    RolloutBackendName,
    RolloutJob,
    RunProxy,
    Verified,
    require_solution,
)
from orchestrator.kube_api import KubeApi
from orchestrator.kube_images import TaskImages
from orchestrator.kube_objects import (
    MANAGED,
    ROLE,
    ROLLOUT,
    RUN,
    TaskObjects,
    dns_name,
    owner_of,
    run_anchor,
    task_objects,
)
from orchestrator.kube_pod import PodSettings, rollout_pod, rollout_secret
from orchestrator.kube_reaper import Reaper
from orchestrator.kube_setup import ensure_namespace, ensure_policy, sweep_strays
from orchestrator.kube_wait import PodState, RolloutPods
from orchestrator.workspace import image_plan
from schemas.errors import ConfigError, InfrastructureError, TaskError

log = logging.getLogger(__name__)
LOG_LIMIT = 4 << 20  # bytes of a container's log kept


@dataclass(frozen=True)
class KubeOptions:
    """The Kubernetes backend's section (``--kube-*`` on the command line).

    Attributes:
        kubeconfig: the cluster (None: ``$KUBECONFIG``, ``~/.kube/config`` or in-cluster).
        pod: how pods are made (namespace, proxy URL, images, security).
        proxy_namespace, proxy_labels, proxy_port: the proxy's pods, the only egress allowed.
        proxy_cidr: the proxy's address block when it runs outside the cluster (e.g.
            ``10.88.5.1/32``, the local cluster's node gateway, where a proxy on this machine
            listens): egress goes there instead of to the proxy's pods.
        proxy_ports: how many consecutive ports from ``proxy_port`` egress may reach: 1 for
            one proxy; ``1 + N`` for a pool of N workers run with ``--worker-port-base
            PORT+1`` and ``--advertise-host`` set to the name pods reach it by (each rollout's
            pod then calls its own worker, whose URL the registration answer carries).
        run: a name for this run's objects (default: a fresh one).
        startup_grace_s: how long an image-pull failure or an unschedulable pod may last
            before the attempt is an infrastructure failure.
        image_sink: where task images built here go for the cluster to run them (a URL,
            :mod:`infra.images.sinks`: ``containerd:///path/containerd.sock`` for the local
            cluster's real node). With one, each task's own image is built (its whole
            Dockerfile, ``RUN`` lines included) and published when the task is checked, and its
            pods run it; without, pods run the Dockerfile's ``FROM`` image with the task's files
            laid out from ConfigMaps, and a ``RUN`` line is refused.
        images: how task images are resolved and built (the local backend's policy).
        watch_timeout_s: the server-side timeout of each watch request (then it resumes).
        delete_batch: verified rollouts' Pods and Secrets are deleted together, up to this
            many in one call per kind (:mod:`orchestrator.kube_reaper`); 1: each at once.
        max_workspace_bytes: a final workspace whose files add up to this much is saved (for
            re-scoring; its compressed archive also has to fit a container log,
            :data:`~orchestrator.kube_workspace.ARCHIVE_LIMIT`).
    """

    kubeconfig: Path | None = None
    pod: PodSettings = field(default_factory=PodSettings)
    proxy_namespace: str = "openforge"
    proxy_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "openforge-proxy"}
    )
    proxy_port: int = 8000
    proxy_ports: int = 1
    proxy_cidr: str | None = None
    run: str | None = None
    startup_grace_s: float = 20.0
    watch_timeout_s: int = 60
    image_sink: str | None = None
    images: ImagePolicy = field(default_factory=ImagePolicy)
    delete_batch: int = 64
    max_workspace_bytes: int = final_workspace.DEFAULT_LIMIT_BYTES


class KubernetesBackend(RolloutBackend):
    """Rollouts as pods on a Kubernetes cluster (see the module docstring)."""

    name = RolloutBackendName.KUBERNETES

    def __init__(self, options: KubeOptions = KubeOptions(), api: Any = None) -> None:
        self.options = options
        self.settings = options.pod
        self.ns = options.pod.namespace
        self.run_id = options.run or f"run-{uuid.uuid4().hex[:10]}"
        self.k8s = KubeApi(api if api is not None else api_client(options.kubeconfig))
        self.core, self.net = self.k8s.core, self.k8s.net
        self.labels = {**MANAGED, RUN: dns_name("r", self.run_id)}
        self.selector = ",".join(f"{k}={v}" for k, v in self.labels.items()) + f",{ROLE}=rollout"
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self.pods = RolloutPods(self.ns, options.startup_grace_s, self._cancelled)
        self.reaper = Reaper(self.k8s, self.ns, self.selector, batch=options.delete_batch)
        self._tasks: dict[tuple[str, bool], TaskObjects] = {}
        self.images = TaskImages(options.image_sink, options.images) if options.image_sink else None
        self._anchor: dict[str, Any] | None = None
        self._watcher: PodWatcher | None = None
        self._last_stats = WatchStats()

    @classmethod
    def from_config(cls, config: KubeOptions, proxy: RunProxy) -> KubernetesBackend:
        """Pods reach the proxy at ``config.pod.proxy_url``, the cluster's view of it (a
        Service), not at this machine's URL or socket in ``proxy``."""
        return cls(config)

    @property
    def api_calls(self) -> int:
        """Writes and reads this backend made (the watch's not included)."""
        return self.k8s.calls

    @property
    def api_writes(self) -> int:
        """Of :attr:`api_calls`, the writes (create, delete, patch, replace)."""
        return self.k8s.writes

    @property
    def watch_lags(self) -> list[float]:
        """Per pod: its create call's return to its first event."""
        return self.pods.watch_lags

    @property
    def watch_stats(self) -> WatchStats:
        """The pod watch's counters (lists, watches, 410s, errors, events)."""
        return self._watcher.stats if self._watcher is not None else self._last_stats

    # -- set-up ---------------------------------------------------------------------------------
    def prepare(self) -> dict[str, Any]:
        """Make the namespace if it is not there, delete expired strays, make the NetworkPolicy
        and the run's anchor, start the watch (the first :meth:`run` does it otherwise);
        returns the anchor (:mod:`orchestrator.kube_setup`)."""
        with self._lock:
            if self._anchor is not None:
                return self._anchor
            ensure_namespace(self.k8s, self.ns)
            sweep_strays(self.k8s, self.ns)
            ensure_policy(self.k8s, self.ns, self.options)
            self._anchor = self.k8s.create(
                self.ns, run_anchor(self.run_id, self.ns, self.settings.stray_ttl_s)
            )
            self._watcher = PodWatcher(
                self.k8s.api, self.ns, self.selector, self.pods.on_pod,
                watch_timeout_s=self.options.watch_timeout_s,
            )  # fmt: skip
            self._watcher.start()
            self._watcher.wait_synced(30)
            return self._anchor

    def _task(self, task: Task, harness: Harness, owner: dict[str, Any]) -> TaskObjects:
        key = (task.id, harness.capabilities.runs_solution)
        with self._lock:
            if key in self._tasks:
                return self._tasks[key]
        try:
            built = self.images.built(task, harness) if self.images else None
            objects = task_objects(
                task, None if built else image_plan(task), self.ns, self.labels, owner,
                solution=key[1], built=built,
            )  # fmt: skip
        except TaskError as exc:
            raise ConfigError(str(exc)) from exc
        made = replace(
            objects,
            tests=self.k8s.create(self.ns, objects.tests),
            environment=None if objects.environment is None else self.k8s.create(
                self.ns, objects.environment),
            solution=None if objects.solution is None else self.k8s.create(
                self.ns, objects.solution),
        )  # fmt: skip
        with self._lock:
            self._tasks[key] = made
        return made

    # -- the interface ----------------------------------------------------------------------
    def preflight(self, harness: Harness) -> None:
        """The cluster (the run's objects and the watch: credentials and permissions), and
        the harness's install, whose command the pods run."""
        self.prepare()
        harness.executable()

    def check(self, task: Task, harness: Harness) -> list[str]:
        require_solution(task, harness)
        harbor.check(task)
        if harbor.steps(task) or harbor.verifier_plan(task).mode is harbor.VerifierMode.SEPARATE:
            raise ConfigError(
                f"task {task.id}: multi-step tasks and a separate verifier environment run on "
                "the local backend only, not yet on Kubernetes: run it with --backend local"
            )
        try:
            built = self.images.publish(task, harness) if self.images else None
            plan = None if built else image_plan(task)
            task_objects(
                task, plan, self.ns, self.labels,
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "x"},
                solution=harness.capabilities.runs_solution, built=built,
            )  # fmt: skip
        except TaskError as exc:
            raise ConfigError(str(exc)) from exc
        image = (built.ref if built else None) or task.environment.docker_image
        image = image or (plan.base if plan else None)
        where = image or self.settings.harness_image
        how = f" (built, published to {self.images.sink.url})" if built and self.images else ""
        return [f"{task.id}: pods in {self.ns}, image {where}{how}"]

    def runs_in(self, task: Task) -> str:
        return "pod"

    def run(self, job: RolloutJob, on_agent_end: Callable[[AgentEnd], None]) -> Verified:
        if self._cancelled.is_set():
            raise InfrastructureError("cancelled")
        owner = owner_of(self.prepare())
        objects = self._task(job.task, job.harness, owner)
        name = dns_name("ro", job.rollout_id)
        verified = False
        with self.pods.track(name) as state:
            try:
                pod = self._create_pod(job, name, objects, owner)
                self.pods.created(state, pod["spec"]["activeDeadlineSeconds"])
                agent, no_verifier, costs = self._wait_agent(name, state, job)
                on_agent_end(agent)
                if no_verifier is not None:
                    raise no_verifier
                reward, code, took, verifier_costs = self._wait_verifier(name, state)
                verified = True
                return Verified(agent, reward, code, took, costs={**costs, **verifier_costs})
            finally:
                self._keep_logs(name, job.root, objects.workdir)
                if verified:  # its containers have exited: deleted with others (kube_reaper)
                    self.reaper.finished(dns_name("r", job.rollout_id))
                else:  # it may still run
                    self._delete(name)

    def _create_pod(
        self, job: RolloutJob, name: str, objects: TaskObjects, owner: dict[str, Any]
    ) -> dict[str, Any]:
        """The rollout's Secret (the harness's environment and home) and Pod, created."""
        home = job.root / "home"
        home.mkdir(parents=True, exist_ok=True)
        # Behind a proxy pool: the rollout's own worker (no hop through the front).
        proxy_url = job.proxy_url or self.settings.proxy_url
        endpoint = Endpoint(proxy_url, job.rollout_id, job.api_key, job.model)
        inv = job.harness.invocation(
            job.task.instruction, endpoint, RolloutDirs(home, Path(objects.workdir)),
            job.task.agent.timeout_sec,
        )  # fmt: skip
        labels = {**self.labels, ROLLOUT: dns_name("r", job.rollout_id)}
        secret = rollout_secret(name, self.ns, inv.env, home, labels, owner)
        pod = rollout_pod(
            name=name, rollout_id=job.rollout_id, task=job.task, harness=job.harness,
            objects=objects, invocation=inv, home=home, secret_name=name,
            settings=self.settings, labels=self.labels, owner=owner,
        )  # fmt: skip
        self.k8s.create(self.ns, secret)
        self.k8s.create(self.ns, pod)
        return pod

    def cancel(self) -> None:
        self._cancelled.set()
        with contextlib.suppress(InfrastructureError):
            self.k8s.call(self.core.delete_collection_namespaced_pod, self.ns,
                          label_selector=self.selector, grace_period_seconds=0)  # fmt: skip
            self.k8s.call(self.core.delete_collection_namespaced_secret, self.ns,
                          label_selector=self.selector)  # fmt: skip
        self.pods.wake_all()

    def close(self) -> None:
        """Stop watching and delete the run's anchor: garbage collection deletes the rest. Runs
        still waiting are cancelled first; verified rollouts' pods are deleted now."""
        if self.pods.waiting():
            self.cancel()
        self.reaper.close()
        if self._watcher is not None:
            self._watcher.stop()
            self._last_stats = self._watcher.stats
            self._watcher = None
        if self._anchor is not None:
            with contextlib.suppress(InfrastructureError):
                self.k8s.call(self.core.delete_namespaced_config_map,
                              self._anchor["metadata"]["name"], self.ns,
                              propagation_policy="Background")  # fmt: skip
            self._anchor = None

    # -- one rollout's pod ------------------------------------------------------------------
    def _wait_agent(
        self, name: str, state: PodState, job: RolloutJob
    ) -> tuple[AgentEnd, InfrastructureError | None, dict[str, float]]:
        """The agent's end; why no verifier will follow it (None: one will); what its
        container's cgroup counted."""
        terminated = self.pods.wait(
            name, state, lambda pod: status.terminated(pod, "agent", init=True)
        )
        # A harness that calls no model has no report worth a log read per pod.
        wants_report = job.harness.capabilities.calls_model and status.agent_ran(terminated)
        report = self._agent_report(name, job.harness) if wants_report else None
        end = status.agent_end(terminated, job.task.agent.timeout_sec, report)
        memory_mb = job.task.environment.memory_mb
        return end, status.oom_killed(terminated, memory_mb), status.usage(terminated, "agent")

    def _agent_report(self, name: str, harness: Harness) -> Report | None:
        """The harness's report from the agent container's log (None if the cluster keeps no
        log, as with kwok)."""
        text = self._log(name, "agent")
        return harness.report(text) if text else None

    def _log(self, name: str, container: str, limit: int = LOG_LIMIT) -> str | None:
        """A container's log (stdout and stderr, as the node keeps it; its first ``limit``
        bytes); None where there is none (kwok's nodes keep no log)."""
        with contextlib.suppress(InfrastructureError):
            resp = self.k8s.call(
                self.core.read_namespaced_pod_log, name, self.ns, container=container,
                limit_bytes=limit,
            )  # fmt: skip
            return str(resp.data.decode("utf-8", "replace"))
        return None

    def _keep_logs(self, name: str, root: Path, workdir: str) -> None:
        """The agent's and the verifier's logs into the rollout's directory (``agent.out``,
        ``verifier.out``, as on the local backend), and the final workspace the verifier's log
        carries, before the pod is deleted."""
        agent = self._log(name, "agent")
        if agent:
            (root / "agent.out").write_text(agent, encoding="utf-8")
        verifier = self._log(name, "verifier", LOG_LIMIT + kube_workspace.LOG_BYTES)
        if verifier:
            own = kube_workspace.keep(verifier, root, workdir, self.options.max_workspace_bytes)
            (root / "verifier.out").write_text(own, encoding="utf-8")

    def _wait_verifier(
        self, name: str, state: PodState
    ) -> tuple[VerifierReward, int, float, dict[str, float]]:
        terminated = self.pods.wait(
            name, state, lambda pod: status.terminated(pod, "verifier", init=False)
        )
        return (*status.verifier_result(terminated), status.usage(terminated, "verifier"))

    def _delete(self, name: str) -> None:
        with contextlib.suppress(InfrastructureError):
            self.k8s.call(self.core.delete_namespaced_pod, name, self.ns, grace_period_seconds=0)
        with contextlib.suppress(InfrastructureError):
            self.k8s.call(self.core.delete_namespaced_secret, name, self.ns)
