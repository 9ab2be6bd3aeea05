"""The Kubernetes manifests (``infra/k8s``), rendered by kustomize: what every pod may do (least
privilege, no tokens, no way out of a rollout pod but the proxy and DNS), that the command lines
are ones the CLI accepts and name the Services that exist, GPUs where they are used, and that a
real API server accepts every built-in kind (server-side dry run, Pod Security ``restricted``).
"""

from __future__ import annotations

import base64
import copy
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from infra.eventlog.base import DEAD_LETTER_TOPIC, EPISODES_TOPIC, EVENTS_TOPIC
from infra.eventlog.kafka import MAX_MESSAGE_BYTES
from infra.paths import versions
from openforge.cli import app

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "infra" / "k8s"
SERVICES, ROLLOUTS = "openforge", "openforge-rollouts"
OPERATOR_GROUPS = {"kafka.strimzi.io", "flink.apache.org"}
BUILTIN_GROUPS = {"", "apps", "batch", "rbac.authorization.k8s.io", "networking.k8s.io"}
ROLLOUT_POD = {"openforge.dev/role": "rollout"}
# What the orchestrator's token may do, all of it in the rollout namespace: exactly the calls
# orchestrator/kubernetes.py makes (pods/log: the harness's report from the agent's log).
ORCHESTRATOR_RULES = {
    ("", "pods"): {"create", "get", "list", "watch", "delete", "deletecollection"},
    ("", "pods/log"): {"get"},
    ("", "secrets"): {"create", "get", "delete", "deletecollection"},
    ("", "configmaps"): {"create", "get", "list", "delete"},
    ("networking.k8s.io", "networkpolicies"): {"create", "patch"},
}
ADMIN_TOKEN_PLACEHOLDER = "REPLACE-ME-openforge-admin-token"  # README.md, "Admin token"

Doc = dict[str, Any]


def _kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) is needed to render infra/k8s"
    return subprocess.run(
        [kubectl, *args], input=stdin, capture_output=True, text=True, timeout=300
    )


def _render(path: Path) -> list[Doc]:
    done = _kubectl("kustomize", str(path))
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return _render(K8S)


def _group(doc: Doc) -> str:
    api = doc["apiVersion"]
    return api.rpartition("/")[0] if "/" in api else ""


def _key(doc: Doc) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def _one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _workloads(docs: list[Doc]) -> Iterator[tuple[str, Doc, dict[str, str]]]:
    """(name, pod spec, pod labels) of every Deployment's, StatefulSet's and Job's pod
    template."""
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            template = d["spec"]["template"]
            yield d["metadata"]["name"], template["spec"], template["metadata"]["labels"]


def _containers(spec: Doc) -> list[Doc]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def _selects(selector: Doc, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"only matchLabels is understood here: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _pods(docs: list[Doc], name: str) -> tuple[Doc, dict[str, str]]:
    for wname, spec, labels in _workloads(docs):
        if wname == name:
            return spec, labels
    raise AssertionError(f"no workload {name}")


def _openforge_argv(container: Doc) -> list[str] | None:
    """The ``openforge ...`` argument list a container runs (directly or under torchrun)."""
    argv = [*container.get("command", []), *container.get("args", [])]
    if argv[:1] == ["openforge"]:
        return argv[1:]
    if argv[:1] == ["torchrun"]:
        i = argv.index("-m")
        assert argv[i + 1] == "openforge"
        return argv[i + 2 :]
    return None


def _option(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    assert len(values) == 1, f"{name}: {values} in {argv}"
    return values[0]


# -- layout --------------------------------------------------------------------------------------


def test_base_holds_the_builtin_kinds_and_operators_the_rest(docs: list[Doc]) -> None:
    base, operators = _render(K8S / "base"), _render(K8S / "operators")
    assert {_group(d) for d in base} <= BUILTIN_GROUPS
    assert {_group(d) for d in operators} <= OPERATOR_GROUPS | {"batch"}
    assert {_group(d) for d in operators} >= OPERATOR_GROUPS
    assert sorted(map(_key, docs)) == sorted(map(_key, base + operators))
    assert len({_key(d) for d in docs}) == len(docs)


def test_two_namespaces_and_nothing_runs_in_the_rollout_one(docs: list[Doc]) -> None:
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert namespaces == {SERVICES, ROLLOUTS}
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") in namespaces, _key(d)
    in_rollouts = {d["kind"] for d in docs if d["metadata"].get("namespace") == ROLLOUTS}
    assert in_rollouts == {"Role", "RoleBinding", "NetworkPolicy", "ServiceAccount"}


# -- pods ----------------------------------------------------------------------------------------


def test_every_container_is_bounded_and_unprivileged(docs: list[Doc]) -> None:
    workloads = list(_workloads(docs))
    assert {n for n, _, _ in workloads} == {
        "openforge-proxy",
        "openforge-vllm",
        "openforge-orchestrator",
        "openforge-trainer",
        "openforge-pipeline-submit",
    }
    for name, spec, _ in workloads:
        _check_bounded(name, spec)


def _check_bounded(name: str, spec: Doc) -> None:
    """Requests and limits, non-root, no escalation, a read-only root, no capabilities, the
    runtime's seccomp profile, nothing of the host's."""
    pod_sc = spec.get("securityContext", {})
    assert not spec.get("hostNetwork") and not spec.get("hostPID"), name
    assert not [v for v in spec.get("volumes", []) if "hostPath" in v], name
    for c in _containers(spec):
        where = f"{name}/{c['name']}"
        res = c.get("resources", {})
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res.get(kind, {})), f"{where}: {kind}"
        sc = c.get("securityContext", {})
        assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where
        assert sc.get("allowPrivilegeEscalation") is False, where
        assert sc.get("readOnlyRootFilesystem") is True, where
        assert sc.get("privileged", False) is False, where
        assert sc.get("capabilities") == {"drop": ["ALL"]}, where
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile"))
        assert seccomp == {"type": "RuntimeDefault"}, where


def test_only_the_orchestrator_gets_a_service_account_token(docs: list[Doc]) -> None:
    for name, spec, _ in _workloads(docs):
        if name == "openforge-orchestrator":
            assert spec["serviceAccountName"] == "openforge-orchestrator"
            assert spec["automountServiceAccountToken"] is True
        else:
            assert spec["automountServiceAccountToken"] is False, name
            assert spec.get("serviceAccountName", "default") == "default", name
    for sa in (d for d in docs if d["kind"] == "ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False, _key(sa)
    flink = _one(docs, "FlinkDeployment", "openforge-pipeline")
    assert flink["spec"]["taskManager"]["podTemplate"]["spec"]["automountServiceAccountToken"] is (
        False
    )


def test_the_admin_token_is_one_placeholder_secret_read_by_who_needs_it(docs: list[Doc]) -> None:
    secrets = [d for d in docs if d["kind"] == "Secret"]
    assert len(secrets) == 1 and secrets[0]["metadata"]["namespace"] == SERVICES
    secret = secrets[0]
    assert base64.b64decode(secret["data"]["token"]).decode() == ADMIN_TOKEN_PLACEHOLDER
    readers = set()
    for name, spec, _ in _workloads(docs):
        for c in _containers(spec):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert env["name"] == "OPENFORGE_ADMIN_TOKEN", name
                    assert ref == {"name": secret["metadata"]["name"], "key": "token"}, name
                    readers.add(name)
    assert readers == {"openforge-proxy", "openforge-orchestrator", "openforge-trainer"}


def test_volumes_exist_and_adapters_are_where_vllm_reads_them(docs: list[Doc]) -> None:
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for name, spec, _ in _workloads(docs):
        for v in spec.get("volumes", []):
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, name

    def mounts(name: str) -> dict[str, tuple[str, bool]]:
        """Mount path -> (claim, read-only) of the workload's first container."""
        spec, _ = _pods(docs, name)
        by_volume = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in spec["volumes"]
            if "persistentVolumeClaim" in v
        }
        return {
            m["mountPath"]: (by_volume[m["name"]], m.get("readOnly", False))
            for m in spec["containers"][0]["volumeMounts"]
            if m["name"] in by_volume
        }

    # The trainer hands vLLM the paths it exported to: the same claim, at the same path.
    trainer_spec, _ = _pods(docs, "openforge-trainer")
    out = Path(_option(_openforge_argv(trainer_spec["containers"][0]) or [], "--out"))
    trainer, vllm = mounts("openforge-trainer"), mounts("openforge-vllm")
    runs = next(p for p in trainer if out.is_relative_to(p))
    assert trainer[runs] == ("openforge-runs", False)
    assert vllm[runs] == ("openforge-runs", True)
    # vLLM and the proxy see one model (the proxy tokenizes with the model's tokenizer).
    proxy_spec, _ = _pods(docs, "openforge-proxy")
    tokenizer = Path(_option(_openforge_argv(proxy_spec["containers"][0]) or [], "--tokenizer"))
    vllm_model = Path(_pods(docs, "openforge-vllm")[0]["containers"][0]["args"][0])
    assert tokenizer == vllm_model
    proxy = mounts("openforge-proxy")
    models = next(p for p in proxy if tokenizer.is_relative_to(p))
    assert proxy[models] == vllm[models] == ("openforge-models", True)


def test_images_are_the_placeholder_or_pinned(docs: list[Doc]) -> None:
    images = set()
    for _, spec, _ in _workloads(docs):
        images |= {c["image"] for c in _containers(spec)}
    flink = _one(docs, "FlinkDeployment", "openforge-pipeline")
    images.add(flink["spec"]["image"])
    for pod in ("jobManager", "taskManager"):
        containers = flink["spec"][pod]["podTemplate"]["spec"]["containers"]
        images |= {c["image"] for c in containers if "image" in c}
    assert images == {
        "ghcr.io/openforge/openforge:latest",
        f"vllm/vllm-openai:v{versions()['VLLM_CPU_VERSION']}",
        "flink:1.20.1",
    }


# -- the orchestrator's privileges ---------------------------------------------------------------


def test_the_orchestrator_role_is_least_privilege_in_the_rollout_namespace(
    docs: list[Doc],
) -> None:
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}
    roles = [d for d in docs if d["kind"] == "Role"]
    assert [(r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles] == [
        (ROLLOUTS, "openforge-orchestrator")
    ]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in roles[0]["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames/URLs
        for field in rule.values():
            assert "*" not in field, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == ORCHESTRATOR_RULES
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    assert len(bindings) == 1
    binding = bindings[0]
    assert binding["metadata"]["namespace"] == ROLLOUTS
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "openforge-orchestrator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "openforge-orchestrator", "namespace": SERVICES}
    ]


# -- network -------------------------------------------------------------------------------------


def test_rollout_pods_reach_the_proxy_and_dns_and_nothing_reaches_them(docs: list[Doc]) -> None:
    policies = [
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == ROLLOUTS
    ]
    # A pod of the namespace that is no rollout pod is cut off both ways.
    default_deny = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert len(default_deny) == 1
    assert sorted(default_deny[0]["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in default_deny[0]["spec"] and "egress" not in default_deny[0]["spec"]

    applying = [p for p in policies if _selects(p["spec"]["podSelector"], ROLLOUT_POD)]
    assert any(p["spec"]["podSelector"] == {"matchLabels": ROLLOUT_POD} for p in applying)
    allowed = set()
    for p in applying:
        assert sorted(p["spec"]["policyTypes"]) == ["Egress", "Ingress"], p["metadata"]
        assert not p["spec"].get("ingress"), p["metadata"]
        for rule in p["spec"].get("egress", []):
            assert rule.get("to") and rule.get("ports"), f"an unbounded egress rule: {rule}"
            for peer in rule["to"]:
                assert set(peer) == {"namespaceSelector", "podSelector"}, peer  # no ipBlock
                ns = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                pods = tuple(sorted(peer["podSelector"]["matchLabels"].items()))
                for port in rule["ports"]:
                    allowed.add((ns, pods, port["protocol"], port["port"]))
    proxy = (SERVICES, (("app.kubernetes.io/name", "openforge-proxy"),))
    dns = ("kube-system", (("k8s-app", "kube-dns"),))
    assert allowed == {(*proxy, "TCP", 8000), (*dns, "UDP", 53), (*dns, "TCP", 53)}

    # ... and that peer is the proxy's pods, listening on that port.
    spec, labels = _pods(docs, "openforge-proxy")
    assert _selects({"matchLabels": dict(proxy[1])}, labels)
    assert 8000 in {p["containerPort"] for p in spec["containers"][0]["ports"]}


def test_only_the_proxy_and_the_trainer_reach_vllm(docs: list[Doc]) -> None:
    _, vllm_labels = _pods(docs, "openforge-vllm")
    policies = [
        d
        for d in docs
        if d["kind"] == "NetworkPolicy"
        and d["metadata"]["namespace"] == SERVICES
        and _selects(d["spec"]["podSelector"], vllm_labels)
    ]
    assert len(policies) == 1
    spec = policies[0]["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    reach = {
        name
        for name, _, labels in _workloads(docs)
        if any(
            set(peer) == {"podSelector"} and _selects(peer["podSelector"], labels)
            for peer in rule["from"]
        )
    }
    assert reach == {"openforge-proxy", "openforge-trainer"}


def test_services_select_one_workload_and_a_port_it_has(docs: list[Doc]) -> None:
    for svc in (d for d in docs if d["kind"] == "Service"):
        selected = [
            (name, spec)
            for name, spec, labels in _workloads(docs)
            if _selects({"matchLabels": svc["spec"]["selector"]}, labels)
        ]
        assert [n for n, _ in selected] == [svc["metadata"]["name"]]
        ports = {p.get("name") for c in selected[0][1]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, svc["metadata"]["name"]


# -- command lines -------------------------------------------------------------------------------


def _parse(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse ``openforge ARGV`` with the real CLI (nothing is run): the command's path
    (``trainer run``) and its parameters as the command would get them."""
    cmd: Any = typer.main.get_command(app)  # typer's own click, not the click package
    path, args = [], list(argv)
    while isinstance(cmd, typer.core.TyperGroup):
        name, *args = args
        sub = cmd.commands.get(name)
        assert sub is not None, f"no command {name!r} in `openforge {' '.join(argv)}`"
        cmd, path = sub, [*path, name]
    return " ".join(path), cmd.make_context(" ".join(path), args).params


def test_every_command_line_is_one_the_cli_accepts(docs: list[Doc]) -> None:
    commands = {}
    for name, spec, _ in _workloads(docs):
        for c in _containers(spec):
            argv = _openforge_argv(c)
            if argv is not None:
                commands[name] = _parse(argv)
    assert set(commands) == {
        "openforge-proxy",
        "openforge-orchestrator",
        "openforge-trainer",
        "openforge-pipeline-submit",
    }
    assert commands["openforge-proxy"][0] == "proxy"
    assert commands["openforge-proxy"][1]["port"] == 8000
    assert commands["openforge-orchestrator"][0] == "rollouts run"
    assert commands["openforge-trainer"][0] == "trainer run"
    assert commands["openforge-pipeline-submit"][0] == "pipeline run"
    assert commands["openforge-trainer"][1]["backend"] == "verl"
    beam = commands["openforge-pipeline-submit"][1]["beam_arg"]
    assert "--runner=FlinkRunner" in beam
    # A bad line is refused, so the checks above mean something.
    with pytest.raises(Exception, match="unexpected extra argument"):
        _parse(["proxy", "serve", "--upstream=http://x"])
    with pytest.raises(typer.BadParameter, match="'gpu' is not one of"):
        _parse(["trainer", "run", "--episodes=x", "--model=m", "--backend=gpu"])


def test_every_in_cluster_url_names_a_service_and_its_port(docs: list[Doc]) -> None:
    known = {
        (d["metadata"]["name"], d["metadata"]["namespace"], p["port"])
        for d in docs
        if d["kind"] == "Service"
        for p in d["spec"]["ports"]
    }
    # Services the operators make of our resources: Strimzi's bootstrap, Flink's REST.
    for kafka in (d for d in docs if d["kind"] == "Kafka"):
        for listener in kafka["spec"]["kafka"]["listeners"]:
            known.add((f"{kafka['metadata']['name']}-kafka-bootstrap", SERVICES, listener["port"]))
    for flink in (d for d in docs if d["kind"] == "FlinkDeployment"):
        known.add((f"{flink['metadata']['name']}-rest", SERVICES, 8081))
    url = re.compile(r"(?:https?|kafka)://([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)")
    used = set()
    for name, spec, _ in _workloads(docs):
        for c in _containers(spec):
            for arg in [*c.get("command", []), *c.get("args", [])]:
                for m in url.finditer(arg):
                    target = (m[1], m[2], int(m[3]))
                    assert target in known, f"{name}: {arg} names no Service"
                    used.add((name, m[1]))
    assert used == {
        ("openforge-proxy", "openforge-vllm"),
        ("openforge-proxy", "openforge-kafka-bootstrap"),
        ("openforge-orchestrator", "openforge-proxy"),
        ("openforge-trainer", "openforge-kafka-bootstrap"),
        ("openforge-trainer", "openforge-vllm"),
        ("openforge-trainer", "openforge-proxy"),
        ("openforge-pipeline-submit", "openforge-kafka-bootstrap"),
        ("openforge-pipeline-submit", "openforge-pipeline-rest"),
    }


# -- live traffic (serve/) ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def serve() -> list[Doc]:
    return _render(K8S / "serve")


def test_serve_is_the_three_services_apart_beside_vllm_and_nothing_orchestrated(
    serve: list[Doc],
) -> None:
    workloads = {name: spec for name, spec, _ in _workloads(serve)}
    assert set(workloads) == {
        "openforge-proxy", "openforge-vllm", "openforge-pipeline", "openforge-trainer"
    }  # fmt: skip
    for name, spec in workloads.items():
        _check_bounded(name, spec)
        assert spec.get("automountServiceAccountToken") is False, name
    assert not [d for d in serve if d["kind"] in ("Job", "Role", "RoleBinding", "ServiceAccount")]
    assert {d["metadata"]["name"] for d in serve if d["kind"] == "Namespace"} == {SERVICES}
    for kind, name in (("StatefulSet", "openforge-pipeline"), ("StatefulSet", "openforge-trainer")):
        governing = _one(serve, kind, name)["spec"]["serviceName"]
        assert _one(serve, "Service", governing)["spec"]["clusterIP"] == "None"
    # Every claim a pod mounts exists, and vLLM reads adapters where the trainer writes them.
    claims = {d["metadata"]["name"] for d in serve if d["kind"] == "PersistentVolumeClaim"}
    for name, spec in workloads.items():
        for v in spec.get("volumes", []):
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, name
    trainer = _openforge_argv(workloads["openforge-trainer"]["containers"][0]) or []
    assert _option(trainer, "--out").startswith("/runs/")
    vllm_mounts = {
        m["mountPath"] for m in workloads["openforge-vllm"]["containers"][0]["volumeMounts"]
    }
    assert "/runs" in vllm_mounts


def test_serve_command_lines_are_the_cli_s_and_agree(serve: list[Doc]) -> None:
    commands = {}
    for name, spec, _ in _workloads(serve):
        argv = _openforge_argv(spec["containers"][0])
        if argv is not None:
            commands[name] = _parse(argv)
    assert {n: c[0] for n, c in commands.items()} == {
        "openforge-proxy": "proxy", "openforge-pipeline": "pipeline run",
        "openforge-trainer": "trainer run",
    }  # fmt: skip
    proxy, pipeline, trainer = (
        commands[f"openforge-{n}"][1] for n in ("proxy", "pipeline", "trainer")
    )
    assert proxy["open_mode"] is True and proxy["require_keys"] is False
    assert trainer["serve_at_start"] is True and trainer["group_size"] == 1
    # The pipeline's workers: one per replica, each its index of the pod-index label.
    sts = _one(serve, "StatefulSet", "openforge-pipeline")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    index, count = pipeline["worker"].split("/")
    assert index == "$(WORKER)" and int(count) == sts["spec"]["replicas"] >= 2
    (worker,) = [e for e in c["env"] if e["name"] == "WORKER"]
    label = "metadata.labels['apps.kubernetes.io/pod-index']"
    assert worker["valueFrom"]["fieldRef"]["fieldPath"] == label
    # Sessions end before the pipeline's deadline runs out; feedback is what trains.
    assert pipeline["lateness"] > proxy["session_idle"]
    assert pipeline["reward_required"] == ["feedback"]
    # The trainer's ranks are its GPUs.
    t = _one(serve, "StatefulSet", "openforge-trainer")["spec"]["template"]["spec"]["containers"][0]
    nproc = int(_option(t["command"], "--nproc_per_node"))
    assert int(t["resources"]["limits"]["nvidia.com/gpu"]) == nproc >= 1
    # Users' feedback credential: a placeholder secret, read by the proxy only.
    feedback = [d for d in serve if d["kind"] == "Secret" and "feedback" in d["metadata"]["name"]]
    (secret,) = feedback
    readers = {
        name for name, spec, _ in _workloads(serve) for e in spec["containers"][0].get("env", [])
        if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == secret["metadata"]["name"]
    }  # fmt: skip
    assert readers == {"openforge-proxy"}


# -- GPUs ----------------------------------------------------------------------------------------


def test_the_trainer_runs_verl_under_torchrun_one_rank_per_gpu(docs: list[Doc]) -> None:
    job = _one(docs, "Job", "openforge-trainer")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["command"][0] == "torchrun"
    nproc = int(_option(c["command"], "--nproc_per_node"))
    gpus = {k: int(c["resources"][k]["nvidia.com/gpu"]) for k in ("requests", "limits")}
    assert gpus == {"requests": nproc, "limits": nproc} and nproc >= 1
    argv = _openforge_argv(c) or []
    assert argv[:2] == ["trainer", "run"] and _option(argv, "--backend") == "verl"
    # Its LoRA adapters fit what vLLM was started to take.
    vllm = _pods(docs, "openforge-vllm")[0]["containers"][0]
    assert "--enable-lora" in vllm["args"]
    assert int(_option(argv, "--lora-rank")) <= int(_option(vllm["args"], "--max-lora-rank"))
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # The group size the trainer waits for is the number of samples per task played.
    orch = _pods(docs, "openforge-orchestrator")[0]["containers"][0]
    assert _option(argv, "--group-size") == _option(orch["args"], "--n")


# -- operators -----------------------------------------------------------------------------------


def test_kafka_is_kraft_with_the_topics_openforge_uses(docs: list[Doc]) -> None:
    kafka = _one(docs, "Kafka", "openforge")
    assert kafka["apiVersion"] == "kafka.strimzi.io/v1beta2"
    assert "zookeeper" not in kafka["spec"]
    config = kafka["spec"]["kafka"]["config"]
    assert config["auto.create.topics.enable"] is False
    assert config["message.max.bytes"] >= MAX_MESSAGE_BYTES
    pools = [d for d in docs if d["kind"] == "KafkaNodePool"]
    assert pools and all(
        p["metadata"]["labels"]["strimzi.io/cluster"] == "openforge" for p in pools
    )
    roles = {r for p in pools for r in p["spec"]["roles"]}
    assert roles == {"controller", "broker"}
    brokers = sum(p["spec"]["replicas"] for p in pools if "broker" in p["spec"]["roles"])
    topics = {d["metadata"]["name"]: d for d in docs if d["kind"] == "KafkaTopic"}
    assert set(topics) == {EVENTS_TOPIC, EPISODES_TOPIC, DEAD_LETTER_TOPIC}
    for name, topic in topics.items():
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == "openforge", name
        spec = topic["spec"]
        assert spec["config"]["max.message.bytes"] >= MAX_MESSAGE_BYTES, name
        assert 1 <= spec["config"]["min.insync.replicas"] < spec["replicas"] <= brokers, name
    # Episodes outlive the events they were made of (a restarted pipeline skips them).
    assert (
        topics[EPISODES_TOPIC]["spec"]["config"]["retention.ms"]
        >= topics[EVENTS_TOPIC]["spec"]["config"]["retention.ms"]
    )


def test_the_pipeline_is_submitted_to_the_flink_session_with_a_beam_worker_pool(
    docs: list[Doc],
) -> None:
    flink = _one(docs, "FlinkDeployment", "openforge-pipeline")
    assert flink["apiVersion"] == "flink.apache.org/v1beta1"
    assert "job" not in flink["spec"]  # a session cluster: the Job below submits to it
    major_minor = flink["spec"]["flinkVersion"].removeprefix("v").replace("_", ".")
    assert flink["spec"]["image"].split(":")[1].startswith(major_minor + ".")
    tm = flink["spec"]["taskManager"]["podTemplate"]["spec"]
    (pool,) = [c for c in tm["containers"] if c["name"] == "beam-worker-pool"]
    assert "apache_beam.runners.worker.worker_pool_main" in pool["command"]
    pool_port = int(_option(pool["args"], "--service_port"))
    assert pool_port in {p["containerPort"] for p in pool["ports"]}
    assert {"cpu", "memory"} <= set(pool["resources"]["requests"]) & set(
        pool["resources"]["limits"]
    )
    sc = pool["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}

    submit = _one(docs, "Job", "openforge-pipeline-submit")
    assert submit["spec"]["backoffLimit"] == 0  # a retry would run a second copy
    (c,) = submit["spec"]["template"]["spec"]["containers"]
    argv = _openforge_argv(c) or []
    assert argv[:2] == ["pipeline", "run"]
    beam = {}
    for a in argv:
        if a.startswith("--beam-arg="):
            key, _, value = a.removeprefix("--beam-arg=").partition("=")
            beam[key] = value
    assert beam["--runner"] == "FlinkRunner"
    assert beam["--flink_version"] == major_minor
    assert beam["--flink_master"].startswith(f"http://{flink['metadata']['name']}-rest.")
    assert "--flink_submit_uber_jar" in beam
    assert beam["--environment_type"] == "EXTERNAL"
    assert beam["--environment_config"] == f"localhost:{pool_port}"
    assert int(beam["--job_server_timeout"]) > 365 * 24 * 3600  # a streaming job runs on


# -- a real API server ---------------------------------------------------------------------------


def test_a_real_api_server_accepts_every_builtin_kind(tmp_path: Path, docs: list[Doc]) -> None:
    """Server-side dry run of every built-in kind against a local control plane: schemas,
    defaulting, validation and admission (Pod Security warns on anything short of
    ``restricted``, and it says nothing here). The operators' kinds need their CRDs: not here."""
    from infra.local.kube import LocalKube

    builtin = [d for d in docs if _group(d) not in OPERATOR_GROUPS]
    assert {_group(d) for d in builtin} <= BUILTIN_GROUPS
    namespaces = [d for d in builtin if d["kind"] == "Namespace"]
    with LocalKube(tmp_path / "kube", ready_timeout=180) as kube:
        cfg = f"--kubeconfig={kube.kubeconfig}"
        # A dry run of a Namespace creates none, and the other objects need theirs.
        made = _kubectl(cfg, "apply", "-f", "-", stdin=yaml.safe_dump_all(namespaces))
        assert made.returncode == 0, made.stderr
        done = _kubectl(
            cfg, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(builtin)
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", done.stderr  # no warnings, Pod Security's included
        lines = done.stdout.splitlines()
        assert len(lines) == len(builtin) and all(
            line.endswith("(server dry run)") for line in lines
        )

        # The same server does warn about a container that may run as root.
        proxy = copy.deepcopy(_one(builtin, "Deployment", "openforge-proxy"))
        pod = proxy["spec"]["template"]["spec"]
        del pod["securityContext"]["runAsNonRoot"]
        del pod["containers"][0]["securityContext"]["runAsNonRoot"]
        warned = _kubectl(cfg, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(proxy))
        assert warned.returncode == 0, warned.stderr
        assert 'would violate PodSecurity "restricted' in warned.stderr
        assert "runAsNonRoot" in warned.stderr
