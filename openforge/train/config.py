"""The one typed config of ``openforge train``: sections of fields, each with a default and a
one-line description, read from TOML and ``--set section.key=value`` overrides.

    cfg = load_config(Path("examples/cpu-demo.toml"), ["trainer.lr=0", "run.seed=2"])

Unknown sections or keys are an error naming the nearest valid one; values are checked against
the field's type (enums list their choices) when the config is built, before anything starts.
``describe()`` prints every field (``openforge train --show-config``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, TypeVar

from infra.eventlog.urls import absolute_location
from infra.images import DEFAULT_FALLBACKS
from orchestrator.backend import RolloutBackendName
from orchestrator.environments import SandboxMode
from orchestrator.kube_pod import check_cpu_request
from pipeline.rewards import MissingRewards, RewardPolicy
from schemas.errors import ConfigError
from schemas.registry import choose
from trainer.algorithm_names import AdvantageEstimator, PolicyLoss
from trainer.backends import BackendName
from trainer.stream import StalePolicy


def _f(default: Any, doc: str, *, path: bool = False) -> Any:
    """A field with its default and its one-line description; ``path``: its value is a path or
    a location (``local:DIR``), made absolute by :func:`load_config`."""
    metadata = {"doc": doc, "path": path}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


TINY = "tiny"  # model.base: the tiny model built locally, not a path


class WarmStartRecipe(StrEnum):
    NONE = "none"  # start RL from the base model as it is
    ECHO_WORDS = "echo-words"  # SFT on generated echo-words conversations (the demo's tasks)


@dataclass
class ModelSection:
    base: str = _f(
        TINY, "'tiny' (built locally, seed model.seed) or a Hugging Face model dir", path=True
    )
    seed: int = _f(0, "seed of the tiny model's tokenizer and weights")
    context: int = _f(4096, "context window served by vLLM and checked by the proxy (tokens)")


@dataclass
class WarmStartSection:
    recipe: WarmStartRecipe = _f(
        WarmStartRecipe.ECHO_WORDS, "supervised warm start: none, echo-words"
    )
    steps: int = _f(1000, "SFT steps at most on the exact demonstrator (ends once it copies)")
    noisy_steps: int = _f(100, "then SFT steps on the noisy one (see correct_fraction)")
    correct_fraction: float = _f(0.25, "how often the noisy one writes to the instructed file")
    lr: float = _f(3e-3, "SFT learning rate")
    batch: int = _f(16, "SFT examples per step")
    seed: int = _f(0, "seed of the SFT data and model")


@dataclass
class TasksSection:
    dataset: str = _f(
        "examples/echo-words",
        "Harbor dataset: a task dir, a dir of tasks or a manifest",
        path=True,
    )
    train_split: str = _f("train", "the split trained on")
    heldout_split: str = _f("heldout", "the split evaluated on (never trained on)")
    per_step: int = _f(4, "training tasks per update (each played rollouts.samples_per_task times)")


@dataclass
class HarnessSection:
    name: str = _f("agent", "harness playing the tasks: agent, codex, claude-code, openclaw, ...")
    max_turns: int = _f(2, "model calls per rollout at most (agent harness)")
    max_tokens: int = _f(48, "tokens per model answer at most (agent harness)")


@dataclass
class RolloutsSection:
    samples_per_task: int = _f(4, "rollouts per task and update: one GRPO group")
    concurrency: int = _f(4, "rollouts running at once")
    backend: RolloutBackendName = _f(
        RolloutBackendName.LOCAL,
        "where rollouts run: local (sandboxes) or kubernetes (a pod each; see [kubernetes])",
    )
    max_attempts: int = _f(3, "attempts per rollout when infrastructure fails")
    sandbox: SandboxMode = _f(
        SandboxMode.AUTO, "auto: tasks with a Dockerfile in a container of their image"
    )
    strict_images: bool = _f(False, "refuse a FROM with no exact local image (no stand-in)")
    image_fallbacks: dict[str, str] = _f(
        dict(DEFAULT_FALLBACKS), "FROM pattern -> local stand-in image, tried in order"
    )


@dataclass
class KubernetesSection:
    kubeconfig: str = _f(
        "", "the cluster ('': start the local one, a real kubelet node, as root)", path=True
    )
    namespace: str = _f("openforge-rollouts", "where rollout pods run (created if missing)")
    proxy_host: str = _f(
        "", "an address of this machine pods reach; the proxy listens there ('': the node's)"
    )
    image_sink: str = _f("", "where task images go (containerd:///SOCK; '': the node's)")
    egress_canary: str = _f("", "HOST:PORT no NetworkPolicy allows ('': the node's)")
    cpu_request: float = _f(
        1.0, "share of a task's cpus a pod requests (0.01..1; 1: requests = limits)"
    )


MAX_PROXY_WORKERS = 64


@dataclass
class ProxySection:
    max_tokens_cap: int = _f(512, "cap on max_tokens of any call")
    workers: int = _f(
        1, "proxy worker processes (1..64); >1: each rollout's harness calls its own worker"
    )
    extra_args: list[str] = _f([], "more `openforge proxy` flags")


@dataclass
class EventLogSection:
    url: str = _f(
        "", "event log: '' (embedded, under the run dir), kafka://HOST:PORT or local:DIR", path=True
    )


@dataclass
class PipelineSection:
    lateness_s: float = _f(60.0, "seconds a rollout's episode waits for its reward")
    beam_args: list[str] = _f(
        [], "Beam pipeline options (default runner FnApiRunner), e.g. ['--runner=PrismRunner']"
    )
    reward_weights: list[str] = _f(
        [], "NAME=WEIGHT: the reward is the weighted sum of named reward values ([]: the newest)"
    )
    reward_required: list[str] = _f([], "reward names an episode waits for")
    on_missing_reward: MissingRewards = _f(
        MissingRewards.DEAD_LETTER, "at the deadline, missing required rewards: dead_letter, train"
    )

    def reward_policy(self) -> RewardPolicy:
        """The rewards' combination (:mod:`pipeline.rewards`); ConfigError if malformed."""
        return RewardPolicy.of_options(
            self.reward_weights, self.reward_required, self.on_missing_reward.value
        )


@dataclass
class TrainerSection:
    backend: BackendName = _f(BackendName.CPU, "trainer backend: cpu (reference) or verl (GPUs)")
    advantage: AdvantageEstimator = _f(
        AdvantageEstimator.GRPO, "veRL advantage estimator: grpo, rloo, gpg, opo, ..."
    )
    policy_loss: PolicyLoss = _f(
        PolicyLoss.VANILLA, "veRL policy loss: vanilla (PPO clip), gspo, cispo, ..."
    )
    lora_rank: int = _f(8, "LoRA rank of the trained adapter (0: full weights)")
    lr: float = _f(3e-3, "AdamW learning rate (0: a control run that never changes the policy)")
    steps: int = _f(12, "updates in the run")
    max_staleness: int = _f(0, "policy versions a rollout may lag the trainer (admission and drop)")
    stale: StalePolicy = _f(StalePolicy.DROP, "episodes beyond max_staleness: drop or keep")
    seed: int = _f(0, "seed of the trainer (adapter init)")


@dataclass
class EvaluationSection:
    every: int = _f(4, "evaluate the held-out split every this many updates (and at 0 and the end)")
    samples_per_task: int = _f(3, "rollouts per held-out task and evaluation")
    tasks: int = _f(0, "held-out tasks evaluated: the split's first N, in its order (0: all)")


@dataclass
class RunSection:
    output_dir: str = _f(
        "runs/cpu-demo", "run directory (rerunning resumes from its checkpoint)", path=True
    )


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    warm_start: WarmStartSection = field(default_factory=WarmStartSection)
    tasks: TasksSection = field(default_factory=TasksSection)
    harness: HarnessSection = field(default_factory=HarnessSection)
    rollouts: RolloutsSection = field(default_factory=RolloutsSection)
    kubernetes: KubernetesSection = field(default_factory=KubernetesSection)
    proxy: ProxySection = field(default_factory=ProxySection)
    event_log: EventLogSection = field(default_factory=EventLogSection)
    pipeline: PipelineSection = field(default_factory=PipelineSection)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    run: RunSection = field(default_factory=RunSection)

    def check(self) -> None:
        """Ranges that types cannot say."""
        self.pipeline.reward_policy()
        if self.warm_start.steps < 0 or self.warm_start.noisy_steps < 0:
            raise ConfigError("warm_start.steps and warm_start.noisy_steps must be >= 0")
        positive = {
            "tasks.per_step": self.tasks.per_step,
            "rollouts.samples_per_task": self.rollouts.samples_per_task,
            "rollouts.concurrency": self.rollouts.concurrency,
            "rollouts.max_attempts": self.rollouts.max_attempts,
            "trainer.steps": self.trainer.steps,
            "evaluation.every": self.evaluation.every,
            "evaluation.samples_per_task": self.evaluation.samples_per_task,
            "harness.max_turns": self.harness.max_turns,
            "harness.max_tokens": self.harness.max_tokens,
        }
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, not {value}")
        if self.evaluation.tasks < 0:
            n = self.evaluation.tasks
            raise ConfigError(f"evaluation.tasks must be >= 0 (0: every held-out task), not {n}")
        if self.trainer.lr < 0 or self.warm_start.lr <= 0:
            raise ConfigError("trainer.lr must be >= 0 and warm_start.lr > 0")
        if not 0.0 <= self.warm_start.correct_fraction <= 1.0:
            raise ConfigError("warm_start.correct_fraction must be within [0, 1]")
        if self.trainer.max_staleness < 0 or self.trainer.lora_rank < 0:
            raise ConfigError("trainer.max_staleness and trainer.lora_rank must be >= 0")
        if not 1 <= self.proxy.workers <= MAX_PROXY_WORKERS:
            raise ConfigError(
                f"proxy.workers must be from 1 to {MAX_PROXY_WORKERS}, not {self.proxy.workers}: "
                "1 runs one proxy process, N runs N workers behind a front"
            )
        if "--workers" in self.proxy.extra_args:
            raise ConfigError("set proxy.workers (or --proxy-workers), not --workers in extra_args")
        if self.rollouts.backend is RolloutBackendName.KUBERNETES:
            self._check_kubernetes()

    def _check_kubernetes(self) -> None:
        kube = self.kubernetes
        if self.proxy.workers != 1:
            raise ConfigError(
                "rollouts.backend = 'kubernetes' runs one proxy worker: set proxy.workers = 1 "
                "(pods reach the proxy at one address)"
            )
        if kube.kubeconfig and not kube.proxy_host:
            raise ConfigError(
                "with kubernetes.kubeconfig, set kubernetes.proxy_host: an address of this "
                "machine that the cluster's pods reach (the proxy listens there)"
            )
        check_cpu_request(kube.cpu_request)

    def to_toml(self) -> str:
        """The resolved config as TOML (written to the run directory)."""
        lines: list[str] = []
        for section in dataclasses.fields(self):
            lines.append(f"[{section.name}]")
            for f in dataclasses.fields(getattr(self, section.name)):
                value = getattr(getattr(self, section.name), f.name)
                lines.append(f"{f.name} = {_toml_value(value)}")
            lines.append("")
        return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, str):  # JSON's string escapes are TOML's (and DEL must be escaped too)
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table; keys quoted (patterns hold '*' and ':')
        items = (f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    return repr(value)


T = TypeVar("T")


def _nearest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}valid: {', '.join(choices)}"


def _coerce(where: str, kind: Any, value: Any) -> Any:
    origin = typing.get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        return choose(kind, value, where)
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
    elif origin is list:
        (item,) = typing.get_args(kind)
        if isinstance(value, list):
            return [_coerce(f"{where}[{i}]", item, v) for i, v in enumerate(value)]
    elif origin is dict:
        key_kind, item = typing.get_args(kind)
        if isinstance(value, dict):
            return {
                _coerce(f"{where} key", key_kind, k): _coerce(f"{where}[{k!r}]", item, v)
                for k, v in value.items()
            }
    elif origin in (typing.Union, types.UnionType):
        for option in typing.get_args(kind):
            if option is type(None) and value is None:
                return None
        return _coerce(where, next(a for a in typing.get_args(kind) if a is not type(None)), value)
    else:  # pragma: no cover - a field type this loader does not know is a bug here
        raise TypeError(f"unsupported config type {kind} for {where}")
    name = getattr(kind, "__name__", str(kind))
    raise ConfigError(f"{where} must be a {name}, not {value!r}")


def _section(cls: type[T], where: str, data: dict[str, Any]) -> T:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"unknown key {where}.{key}: {_nearest(key, names)}")
        values[key] = _coerce(f"{where}.{key}", hints[key], value)
    return cls(**values)


def _parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set takes section.key=value, not {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string
    return key.strip().split("."), value


def build_config(data: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """A checked config from parsed TOML and ``section.key=value`` overrides."""
    merged: dict[str, dict[str, Any]] = {}
    sections = [f.name for f in dataclasses.fields(TrainConfig)]
    for name, body in data.items():
        if name not in sections:
            raise ConfigError(f"unknown section [{name}]: {_nearest(name, sections)}")
        if not isinstance(body, dict):
            raise ConfigError(f"[{name}] must be a table of keys")
        merged[name] = dict(body)
    for text in overrides:
        path, value = _parse_override(text)
        if len(path) != 2:
            raise ConfigError(f"--set takes section.key=value, not {text!r}")
        if path[0] not in sections:
            raise ConfigError(
                f"unknown section {path[0]!r} in --set: {_nearest(path[0], sections)}"
            )
        merged.setdefault(path[0], {})[path[1]] = value
    hints = typing.get_type_hints(TrainConfig)
    cfg = TrainConfig(**{name: _section(hints[name], name, body) for name, body in merged.items()})
    cfg.check()
    return cfg


def load_config(path: Path | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read ``path`` (None: the defaults) and apply ``overrides``. Every path field comes back
    absolute: a relative one written in the file against the file's directory, one given by an
    override or left at its default against the working directory."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read the config {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
        _absolute_in_file(data, path.absolute().parent)
    return _absolute(build_config(data, overrides), Path.cwd())


def _path_fields() -> Iterator[tuple[str, str]]:
    hints = typing.get_type_hints(TrainConfig)
    for section in dataclasses.fields(TrainConfig):
        for f in dataclasses.fields(hints[section.name]):
            if f.metadata.get("path"):
                yield section.name, f.name


def _absolute_path(value: str, base: Path) -> str:
    return value if value == TINY else absolute_location(value, base)


def _absolute_in_file(data: dict[str, Any], base: Path) -> None:
    for section, name in _path_fields():
        body = data.get(section)
        if isinstance(body, dict) and isinstance(body.get(name), str):
            body[name] = _absolute_path(body[name], base)


def _absolute(cfg: TrainConfig, base: Path) -> TrainConfig:
    for section, name in _path_fields():
        part = getattr(cfg, section)
        setattr(part, name, _absolute_path(getattr(part, name), base))
    return cfg


def describe() -> str:
    """Every field with its default and description, as commented TOML."""
    lines: list[str] = []
    hints = typing.get_type_hints(TrainConfig)
    for section in dataclasses.fields(TrainConfig):
        lines.append(f"[{section.name}]")
        cls = hints[section.name]
        for f in dataclasses.fields(cls):
            factory: Any = f.default_factory
            default = f.default if f.default is not dataclasses.MISSING else factory()
            lines.append(f"{f.name} = {_toml_value(default)}  # {f.metadata.get('doc', '')}")
        lines.append("")
    return "\n".join(lines)
