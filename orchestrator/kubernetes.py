"""The Kubernetes rollout backend: one pod per rollout, watched to its verified end.

What a rollout's pod holds and how it keeps the tests from the agent: :mod:`orchestrator.kube_pod`.
Per run, the backend makes (all owned by the run's anchor ConfigMap, so that deleting the anchor
deletes the run): the task ConfigMaps (content-addressed, once per task), and per rollout a
Secret and a Pod. It makes sure the namespace's NetworkPolicy exists (no ingress; egress only to
the proxy and DNS).

One :class:`~infra.kube.PodWatcher` per backend (list, then watch; 410 Gone: list again) feeds
every rollout's state; :meth:`run` waits on it:

- the ``agent`` container's exit is the agent's end (``on_agent_end``): its termination log says
  the harness's exit code (124: the task's agent timeout struck);
- the ``verifier`` container's termination log carries the reward file, read by the rule of
  :mod:`infra.tasks.reward`;
- an image that cannot be pulled, a container that cannot be created, or a pod the scheduler
  cannot place for ``startup_grace_s`` is an :class:`InfrastructureError` (the orchestrator
  retries it as a new attempt); so is a pod that fails, is evicted or disappears.

After the verifier (or a failure), the rollout's Pod and Secret are deleted. :meth:`cancel`
deletes every pod and secret of the run; :meth:`close` deletes the run's anchor, and with it,
by garbage collection, whatever is left. A run's anchor carries an expiry: a later backend in
the same namespace deletes expired anchors (strays of a run that died with its orchestrator).

Not done here: saving the final workspace (:mod:`orchestrator.final_workspace`, which the local
backend does), so rollouts of this backend cannot be re-scored by ``openforge replay rescore``.
The workspace lives in the pod's ``emptyDir`` and dies with the pod; the only channel back is
the termination message (4 KiB). What it needs: a container between ``agent`` and ``verifier``
that tars the workspace to storage the orchestrator can read (an object-store bucket or a
``PersistentVolumeClaim`` shared with it, with its credentials in that container alone), or a
``pods/exec`` grant in the orchestrator's Role to stream the tar out before the pod is deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infra.harnesses import Harness
from infra.harnesses.base import Endpoint, RolloutDirs
from infra.kube import PodWatcher, WatchStats, api_client
from infra.tasks import Task, VerifierReward
from orchestrator import kube_status as status
from orchestrator.backend import AgentEnd, BackendName, RolloutBackend, RolloutJob, Verified
from orchestrator.kube_objects import (
    EXPIRES,
    MANAGED,
    ROLE,
    RUN,
    TaskObjects,
    dns_name,
    network_policy,
    owner_of,
    run_anchor,
    task_objects,
)
from orchestrator.kube_pod import PodSettings, rollout_pod, rollout_secret
from orchestrator.workspace import image_plan
from schemas.errors import ConfigError, InfrastructureError, TaskError

log = logging.getLogger(__name__)


@dataclass
class _State:
    """What the watch has said about one rollout's pod."""

    pod: dict[str, Any] | None = None
    created: float | None = None  # monotonic time the create call returned
    deadline: float | None = None  # monotonic time by which the pod must have ended
    deleted: bool = False
    stuck_since: float | None = None
    changed: threading.Condition = field(default_factory=threading.Condition)


@dataclass(frozen=True)
class KubeOptions:
    """The Kubernetes backend's options (``--kube-*`` on the command line).

    Attributes:
        kubeconfig: the cluster (None: ``$KUBECONFIG``, ``~/.kube/config`` or in-cluster).
        pod: how pods are made (namespace, proxy URL, images, security).
        proxy_namespace, proxy_labels, proxy_port: the proxy's pods, the only egress allowed.
        proxy_ports: how many consecutive ports from ``proxy_port`` egress may reach: 1 for
            one proxy; ``1 + N`` for a pool of N workers run with ``--worker-port-base
            PORT+1`` and ``--advertise-host`` set to the name pods reach it by (each rollout's
            pod then calls its own worker, whose URL the registration answer carries).
        run: a name for this run's objects (default: a fresh one).
        startup_grace_s: how long an image-pull failure or an unschedulable pod may last
            before the attempt is an infrastructure failure.
        watch_timeout_s: the server-side timeout of each watch request (then it resumes).
    """

    kubeconfig: Path | None = None
    pod: PodSettings = field(default_factory=PodSettings)
    proxy_namespace: str = "openforge"
    proxy_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "openforge-proxy"}
    )
    proxy_port: int = 8000
    proxy_ports: int = 1
    run: str | None = None
    startup_grace_s: float = 20.0
    watch_timeout_s: int = 60


class KubernetesBackend(RolloutBackend):
    """Rollouts as pods on a Kubernetes cluster (see the module docstring)."""

    name = BackendName.KUBERNETES

    def __init__(self, options: KubeOptions = KubeOptions(), api: Any = None) -> None:
        from kubernetes import client

        self.options = options
        self.settings = options.pod
        self.ns = options.pod.namespace
        self.run_id = options.run or f"run-{uuid.uuid4().hex[:10]}"
        self.api = api if api is not None else api_client(options.kubeconfig)
        self.core: Any = client.CoreV1Api(self.api)
        self.net: Any = client.NetworkingV1Api(self.api)
        self.labels = {**MANAGED, RUN: dns_name("r", self.run_id)}
        self.selector = ",".join(f"{k}={v}" for k, v in self.labels.items()) + f",{ROLE}=rollout"
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}
        self._tasks: dict[tuple[str, bool], TaskObjects] = {}
        self._anchor: dict[str, Any] | None = None
        self._watcher: PodWatcher | None = None
        self._last_stats = WatchStats()
        self._cancelled = threading.Event()
        # As many calls at once as the client keeps connections (less the watch's): a call
        # beyond that would open (and then drop) a new TLS connection, a handshake each time.
        pool = int(getattr(self.api.configuration, "connection_pool_maxsize", 32) or 32)
        self._slots = threading.BoundedSemaphore(max(1, pool - 1))
        self.api_calls = 0  # writes and reads this backend made (the watch's not included)
        self.watch_lags: list[float] = []  # per pod: its create call's return to its first event

    @classmethod
    def create(cls, sandbox: Any = None, proxy: Any = None, **options: Any) -> KubernetesBackend:
        """The registry's factory: ``sandbox`` and the local ``proxy`` endpoint are not used
        (pods reach the proxy at ``options['pod'].proxy_url``)."""
        return cls(KubeOptions(**options))

    # -- set-up ---------------------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        self.api_calls += 1
        try:
            with self._slots:
                return fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise InfrastructureError(
                f"Kubernetes API: {fn.__name__} failed ({exc.status} {exc.reason}): "
                f"{(exc.body or b'')[:300]!r}"
            ) from exc
        except (HTTPError, OSError) as exc:
            raise InfrastructureError(f"Kubernetes API unreachable ({fn.__name__}): {exc}") from exc

    def _create(self, fn: Callable[..., Any], body: dict[str, Any]) -> dict[str, Any]:
        """Create ``body`` (an existing object of that name is fine: returned as it is)."""
        from kubernetes.client.exceptions import ApiException

        self.api_calls += 1
        try:
            with self._slots:
                return dict(json.loads(fn(self.ns, body, _preload_content=False).data))
        except ApiException as exc:
            if exc.status != 409:
                raise InfrastructureError(
                    f"Kubernetes API: creating {body['kind']} {body['metadata']['name']} failed "
                    f"({exc.status} {exc.reason}): {(exc.body or b'')[:300]!r}"
                ) from exc
        read = getattr(self.core, f"read_namespaced_{body['kind'].lower().replace('map', '_map')}")
        return dict(json.loads(self._call(read, body["metadata"]["name"], self.ns).data))

    def prepare(self) -> dict[str, Any]:
        """Make the run's anchor and the NetworkPolicy, delete expired strays, start the watch
        (the first :meth:`run` does it otherwise); returns the anchor."""
        with self._lock:
            if self._anchor is not None:
                return self._anchor
            self._sweep_strays()
            self._ensure_policy()
            self._anchor = self._create(
                self.core.create_namespaced_config_map,
                run_anchor(self.run_id, self.ns, self.settings.stray_ttl_s),
            )
            self._watcher = PodWatcher(
                self.api, self.ns, self.selector, self._on_pod,
                watch_timeout_s=self.options.watch_timeout_s,
            )  # fmt: skip
            self._watcher.start()
            self._watcher.wait_synced(30)
            return self._anchor

    def _ensure_policy(self) -> None:
        from kubernetes.client.exceptions import ApiException

        body = network_policy(
            self.ns, self.options.proxy_namespace, self.options.proxy_labels,
            self.options.proxy_port, self.options.proxy_ports,
        )  # fmt: skip
        self.api_calls += 1
        try:
            self.net.create_namespaced_network_policy(self.ns, body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise InfrastructureError(
                    f"cannot create the rollout NetworkPolicy in {self.ns} ({exc.status}): "
                    f"{(exc.body or b'')[:300]!r}; the orchestrator needs create/patch on "
                    "networkpolicies there (infra/k8s)"
                ) from exc
            self._call(self.net.patch_namespaced_network_policy, "openforge-rollouts",
                       self.ns, body)  # fmt: skip

    def _sweep_strays(self) -> None:
        """Delete the anchors (and so everything) of runs whose expiry has passed."""
        anchors = json.loads(self._call(
            self.core.list_namespaced_config_map, self.ns, label_selector=f"{ROLE}=run"
        ).data)["items"]  # fmt: skip
        now = time.time()
        for anchor in anchors:
            expires = (anchor["metadata"].get("annotations") or {}).get(EXPIRES, "")
            if expires.isdigit() and int(expires) < now:
                log.info("deleting stray run %s (expired)", anchor["metadata"]["name"])
                with contextlib.suppress(InfrastructureError):
                    self._call(self.core.delete_namespaced_config_map,
                               anchor["metadata"]["name"], self.ns,
                               propagation_policy="Background")  # fmt: skip

    def _task(self, task: Task, harness: Harness, owner: dict[str, Any]) -> TaskObjects:
        key = (task.id, harness.name == "oracle")
        with self._lock:
            if key in self._tasks:
                return self._tasks[key]
        try:
            objects = task_objects(
                task, image_plan(task), self.ns, self.labels, owner, solution=key[1]
            )
        except TaskError as exc:
            raise ConfigError(str(exc)) from exc
        create = self.core.create_namespaced_config_map
        made = replace(
            objects,
            tests=self._create(create, objects.tests),
            environment=None if objects.environment is None else self._create(
                create, objects.environment),
            solution=None if objects.solution is None else self._create(
                create, objects.solution),
        )  # fmt: skip
        with self._lock:
            self._tasks[key] = made
        return made

    # -- the interface ----------------------------------------------------------------------
    def check(self, task: Task, harness: Harness) -> list[str]:
        if harness.name == "oracle" and task.solution_dir is None:
            raise ConfigError(
                f"task {task.id} has no solution/solve.sh for the oracle: add one or pick "
                "another harness"
            )
        try:
            plan = image_plan(task)
            task_objects(
                task,
                plan,
                self.ns,
                self.labels,
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "x"},
            )
        except TaskError as exc:
            raise ConfigError(str(exc)) from exc  # fmt: skip
        image = task.environment.docker_image or (plan.base if plan else None)
        where = image or self.settings.harness_image
        return [f"{task.id}: pods in {self.ns}, image {where}"]

    def run(self, job: RolloutJob, on_agent_end: Callable[[AgentEnd], None]) -> Verified:
        if self._cancelled.is_set():
            raise InfrastructureError("cancelled")
        anchor = self.prepare()
        owner = owner_of(anchor)
        objects = self._task(job.task, job.harness, owner)
        name = dns_name("ro", job.rollout_id)
        state = _State()
        with self._lock:
            self._states[name] = state
        home = job.root / "home"
        try:
            home.mkdir(parents=True, exist_ok=True)
            # Behind a proxy pool: the rollout's own worker (no hop through the front).
            proxy_url = job.proxy_url or self.settings.proxy_url
            endpoint = Endpoint(proxy_url, job.rollout_id, job.api_key, job.model)
            inv = job.harness.invocation(
                job.task.instruction, endpoint, RolloutDirs(home, Path(objects.workdir)),
                job.task.agent.timeout_sec,
            )  # fmt: skip
            secret = rollout_secret(name, self.ns, inv.env, home, self.labels, owner)
            pod = rollout_pod(
                name=name, rollout_id=job.rollout_id, task=job.task, harness=job.harness,
                objects=objects, invocation=inv, home=home, secret_name=name,
                settings=self.settings, labels=self.labels, owner=owner,
            )  # fmt: skip
            self._create(self.core.create_namespaced_secret, secret)
            self._create(self.core.create_namespaced_pod, pod)
            with state.changed:
                state.created = time.monotonic()
                state.deadline = state.created + pod["spec"]["activeDeadlineSeconds"] + 60
                if state.pod is not None:  # the watch was faster than the create's answer
                    self.watch_lags.append(0.0)
            agent = self._wait_agent(name, state, job)
            on_agent_end(agent)
            reward, code, took = self._wait_verifier(name, state)
            return Verified(agent, reward, code, took, {})
        finally:
            self._delete(name)
            with self._lock:
                self._states.pop(name, None)

    def cancel(self) -> None:
        self._cancelled.set()
        with contextlib.suppress(InfrastructureError):
            self._call(self.core.delete_collection_namespaced_pod, self.ns,
                       label_selector=self.selector, grace_period_seconds=0)  # fmt: skip
            self._call(self.core.delete_collection_namespaced_secret, self.ns,
                       label_selector=self.selector)  # fmt: skip
        with self._lock:
            states = list(self._states.values())
        for state in states:
            with state.changed:
                state.changed.notify_all()

    def close(self) -> None:
        """Stop watching and delete the run's anchor: garbage collection deletes the rest. Runs
        still waiting are cancelled first."""
        with self._lock:
            waiting = bool(self._states)
        if waiting:
            self.cancel()
        if self._watcher is not None:
            self._watcher.stop()
            self._last_stats = self._watcher.stats
            self._watcher = None
        if self._anchor is not None:
            with contextlib.suppress(InfrastructureError):
                self._call(self.core.delete_namespaced_config_map,
                           self._anchor["metadata"]["name"], self.ns,
                           propagation_policy="Background")  # fmt: skip
            self._anchor = None

    @property
    def watch_stats(self) -> WatchStats:
        """The pod watch's counters (lists, watches, 410s, errors, events)."""
        return self._watcher.stats if self._watcher is not None else self._last_stats

    # -- the watch --------------------------------------------------------------------------
    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        with self._lock:
            state = self._states.get(pod["metadata"]["name"])
        if state is None:
            return
        with state.changed:
            if kind == "DELETED":
                state.deleted = True
            else:
                if state.pod is None and state.created is not None:
                    self.watch_lags.append(time.monotonic() - state.created)
                state.pod = pod
            state.changed.notify_all()

    def _wait(self, name: str, state: _State, done: Callable[[dict[str, Any]], Any]) -> Any:
        """Wait until ``done(pod)`` returns something, or the pod is stuck, failed or gone, or
        past its deadline (plus a minute) without its node having ended it."""
        grace = self.options.startup_grace_s
        with state.changed:
            while True:
                if self._cancelled.is_set():
                    raise InfrastructureError("cancelled")
                if state.deadline is not None and time.monotonic() > state.deadline:
                    raise InfrastructureError(
                        f"pod {self.ns}/{name} is past its activeDeadlineSeconds and its node "
                        "has not ended it (is the node's kubelet down?)"
                    )
                if state.deleted:
                    raise InfrastructureError(f"pod {self.ns}/{name} was deleted")
                pod = state.pod
                if pod is not None:
                    result = done(pod)
                    if result is not None:
                        return result
                    seen = pod.get("status") or {}
                    if seen.get("phase") == "Failed":
                        raise InfrastructureError(
                            f"pod {self.ns}/{name} failed: {seen.get('reason') or ''} "
                            f"{seen.get('message') or ''}".strip()
                        )
                    why = status.stuck(pod)
                    if why is None:
                        state.stuck_since = None
                    elif state.stuck_since is None:
                        state.stuck_since = time.monotonic()
                    elif time.monotonic() - state.stuck_since >= grace:
                        raise InfrastructureError(f"pod {self.ns}/{name}: {why}")
                state.changed.wait(timeout=1.0)

    def _wait_agent(self, name: str, state: _State, job: RolloutJob) -> AgentEnd:
        terminated = self._wait(name, state, lambda pod: status.terminated(pod, "agent", init=True))
        # A harness that calls no model has nothing to report: no call for its log.
        wants_report = job.harness.dialect is not None and status.agent_ran(terminated)
        report = self._agent_report(name, job.harness) if wants_report else None
        return status.agent_end(terminated, job.task.agent.timeout_sec, report)

    def _agent_report(self, name: str, harness: Harness) -> Any:
        """The harness's report from the agent container's log (None if the cluster keeps no
        log, as with kwok)."""
        with contextlib.suppress(InfrastructureError):
            resp = self._call(
                self.core.read_namespaced_pod_log, name, self.ns, container="agent",
                limit_bytes=4 << 20,
            )  # fmt: skip
            text = resp.data.decode("utf-8", "replace")
            return harness.report(text) if text else None
        return None

    def _wait_verifier(self, name: str, state: _State) -> tuple[VerifierReward, int, float]:
        terminated = self._wait(
            name, state, lambda pod: status.terminated(pod, "verifier", init=False)
        )
        return status.verifier_result(terminated)

    def _delete(self, name: str) -> None:
        with contextlib.suppress(InfrastructureError):
            self._call(self.core.delete_namespaced_pod, name, self.ns, grace_period_seconds=0)
        with contextlib.suppress(InfrastructureError):
            self._call(self.core.delete_namespaced_secret, name, self.ns)
