"""The one typed config of ``openforge train``: sections of fields, each with a default and a
one-line description (read from TOML and ``--set`` overrides by :mod:`openforge.train.config_io`).

Every cross-field rule is checked in :meth:`TrainConfig.__post_init__`, when the config is
built, before anything starts; :meth:`TrainConfig.to_toml` writes the resolved config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from infra.harnesses import HARNESSES, PromptProfile
from infra.harnesses.browser import Observation
from infra.images import DEFAULT_FALLBACKS
from openforge.train.config_field import setting as _f
from openforge.train.warm_start_config import WarmStartRecipe, WarmStartSection
from orchestrator.backend import RolloutBackendName
from orchestrator.environments import SandboxMode
from orchestrator.kube_pod import check_cpu_request
from pipeline.rewards import MissingRewards, RewardPolicy
from schemas.errors import ConfigError
from schemas.faults import ROLLOUT_FAULTS, FaultKind, FaultPlan, fault_kind
from schemas.registry import one_of
from trainer.algorithm_names import AdvantageEstimator, PolicyLoss
from trainer.backends import BackendName
from trainer.stream import StalePolicy

TINY = "tiny"  # model.base: the tiny model built locally, not a path
TINY_VLM = "tiny-vlm"  # model.base: the tiny vision-language model over it (infra/tiny_vlm.py)
BUILT = (TINY, TINY_VLM)  # model.base values that name a model built here, not a path
# The model name harnesses ask the proxy for, in training and in the warm start's recordings
# alike: a harness may print it in its prompt (OpenClaw's runtime line, OpenCode's system
# prompt), and a policy fine-tuned on prompts naming another model garbles its answers.
POLICY = "policy"


@dataclass
class ModelSection:
    base: str = _f(
        TINY,
        "'tiny' (built locally, seed model.seed), 'tiny-vlm' (the tiny vision-language model "
        "over it, for screenshots) or a Hugging Face model dir",
        path=True,
    )
    seed: int = _f(0, "seed of the tiny model's tokenizer and weights")
    context: int = _f(4096, "context window served by vLLM and checked by the proxy (tokens)")


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
    name: str = _f("agent", f"harness playing the tasks: {HARNESSES.listing()}")
    max_turns: int = _f(2, "model calls per rollout at most (agent and browser harnesses)")
    max_tokens: int = _f(48, "tokens per model answer at most (agent and browser harnesses)")
    prompt: PromptProfile = _f(
        PromptProfile.FULL,
        "the npm harnesses (codex, claude-code, openclaw, qwen-code, opencode): full (as "
        "shipped) or lean (their own documented settings cut their instructions and tools; "
        "deploy with the same)",
    )
    observation: Observation = _f(
        Observation.TEXT,
        "browser harnesses: what the model is shown of the page: text (the accessibility "
        "tree), screenshot or both (these two need a vision-language model.base)",
    )


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
    override_memory_mb: int = _f(
        0, "every task sandbox's memory in MB (Harbor's --override-memory-mb; 0: the task's own)"
    )
    agent_timeout_multiplier: float = _f(1.0, "agent deadlines times this (Harbor's flag)")
    warm_pool: bool = _f(False, "agents started ahead (off: no gain measured on 2 cores)")
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


class HeldOutFaults(StrEnum):
    """``faults.heldout``: how the held-out split is evaluated in a run with sandbox faults."""

    CLEAN = "clean"  # without them (the proxy's call faults, if any, hit every call)
    BOTH = "both"  # clean, and again with each of them in every rollout (eval-faulted.csv)


@dataclass
class FaultsSection:
    rates: dict[str, float] = _f(
        {},
        "probability of each fault injected on purpose, per model call (the proxy's) or per "
        f"rollout (command_fails_once, its sandbox's): {one_of(FaultKind)} (docs/rollouts.md; "
        "empty: none)",
    )
    seed: int = _f(0, "with the rollout and the call, decides which calls get a fault")
    retry_after_s: int = _f(1, "the Retry-After of an injected 429 or 503")
    cut_after_chunks: int = _f(2, "chunks of a stream_cut answer sent before the cut")
    delay_s: float = _f(3.0, "seconds a slow_first_byte answer waits before its first byte")
    heldout: HeldOutFaults = _f(
        HeldOutFaults.CLEAN,
        "held-out evaluation: clean (the sandbox faults only in training), or both: also with "
        "each sandbox fault of rates in every held-out rollout (eval-faulted.csv, the dashed "
        "curve)",
    )

    def plan(self) -> FaultPlan | None:
        """The fault plan (None: no fault); a bad kind or rate is a ConfigError."""
        if not self.rates:
            return None
        plan = FaultPlan(
            {fault_kind(k): v for k, v in self.rates.items()},
            self.seed,
            self.retry_after_s,
            self.cut_after_chunks,
            self.delay_s,
        )
        if self.heldout is HeldOutFaults.BOTH and not plan.in_sandbox:
            raise ConfigError(
                f'faults.heldout = "both" plays the held-out split with the sandbox faults of '
                f"faults.rates, and it has none: add one ({one_of(ROLLOUT_FAULTS)}) or set "
                'faults.heldout = "clean"'
            )
        return plan


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
    faults: FaultsSection = field(default_factory=FaultsSection)
    run: RunSection = field(default_factory=RunSection)

    def check(self) -> None:
        """Ranges that types cannot say."""
        from orchestrator.registry import ROLLOUT_BACKENDS

        self.pipeline.reward_policy()
        ROLLOUT_BACKENDS.get(self.rollouts.backend).check_faults(self.faults.plan())
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
        if self.rollouts.override_memory_mb < 0:
            raise ConfigError("rollouts.override_memory_mb must be >= 0 (0: each task's own)")
        if not (m := self.rollouts.agent_timeout_multiplier) > 0:
            raise ConfigError(f"rollouts.agent_timeout_multiplier must be above 0, not {m}")
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, not {value}")
        if self.evaluation.tasks < 0:
            n = self.evaluation.tasks
            raise ConfigError(f"evaluation.tasks must be >= 0 (0: every held-out task), not {n}")
        if self.trainer.lr < 0 or self.warm_start.lr <= 0:
            raise ConfigError("trainer.lr must be >= 0 and warm_start.lr > 0")
        self.warm_start.check()
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
        self._check_observation()

    def _check_observation(self) -> None:
        if self.model.base == TINY_VLM and self.warm_start.recipe is not WarmStartRecipe.NONE:
            raise ConfigError(
                "model.base = 'tiny-vlm' has no warm start: set warm_start.recipe = 'none'"
            )
        if self.harness.observation is Observation.TEXT:
            return
        if not self.harness.name.startswith("browser"):
            raise ConfigError(
                f"harness.observation = {self.harness.observation.value!r} is for the browser "
                f"harnesses (browser, browser-anthropic), not {self.harness.name!r}"
            )
        if self.model.base == TINY:
            raise ConfigError(
                "screenshots need a vision-language model: set model.base = 'tiny-vlm' (or a "
                "VLM's directory), or harness.observation = 'text' for the tiny text model"
            )
        if self.trainer.backend is not BackendName.CPU:
            raise ConfigError(
                "training on screenshots needs trainer.backend = 'cpu' (the veRL backend "
                "gets no pixels yet)"
            )

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
