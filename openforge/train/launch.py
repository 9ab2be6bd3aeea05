"""What one launch of a training run starts from: the run directory and its resolved config, the
task splits, the harness, the model RL starts from (the base, warm-started and cached), and the
weights and policy version vLLM serves first.

Rerunning with the same run directory resumes: the first weights are the latest checkpoint's
export at its policy version, and the driver goes on with the update after the checkpoint's.
Every launch gets a fresh tag (``l1``, ``l2``, ...), so rollout ids never repeat.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra import paths
from infra.harnesses import HARNESSES, Agent, Browser, Harness, NpmHarness
from infra.images import ImagePolicy
from infra.tasks import Task, load_dataset
from infra.tiny_vlm import build_tiny_vlm
from openforge.stack import tiny_model
from openforge.train.config import TINY, TINY_VLM, TrainConfig
from openforge.train.config_io import to_toml
from openforge.train.demonstrations import DemoSettings
from openforge.train.harness_warmstart import harness_warm_start
from openforge.train.warm_start_config import WarmStartRecipe
from openforge.train.warmstart import warm_start
from schemas.errors import ConfigError


@dataclass(frozen=True)
class Launch:
    """What one launch of a run directory starts from.

    Attributes:
        tag: fresh per launch (``l1``, ``l2``, ...): rollout ids never repeat on resume.
        train_tasks, heldout: the two splits of the dataset.
        harness: what plays the tasks.
        model_dir: the model RL starts from (the base, warm-started).
        log_url: the event log of the run.
        weights: what vLLM serves first: the latest checkpoint's export, or the untrained policy.
        version: the policy version those weights are served as.
        done_steps: updates made by earlier launches (the driver goes on with the next).
    """

    tag: str
    train_tasks: list[Task]
    heldout: list[Task]
    harness: Harness
    model_dir: Path
    log_url: str
    weights: Path
    version: int
    done_steps: int
    images: Path  # the proxy's image store (the screenshots of calls): RUN/log/images


def _harness(cfg: TrainConfig) -> Harness:
    chosen = HARNESSES.get(cfg.harness.name)
    h = cfg.harness
    if issubclass(chosen, Browser):  # browser, browser-anthropic
        return chosen(max_turns=h.max_turns, max_tokens=h.max_tokens, observation=h.observation)
    if issubclass(chosen, Agent):  # the built-in agent
        return chosen(max_turns=h.max_turns, max_tokens=h.max_tokens)
    if issubclass(chosen, NpmHarness):  # codex, claude-code, openclaw, qwen-code, opencode
        return chosen(prompt=h.prompt)  # type: ignore[call-arg]
    return chosen()


def base_model(cfg: TrainConfig) -> Path:
    """The model ``cfg`` starts from before any warm start (built if it is a tiny one)."""
    if cfg.model.base == TINY:
        return tiny_model(max(cfg.model.context, 4096), cfg.model.seed)
    if cfg.model.base == TINY_VLM:
        text = tiny_model(4096, cfg.model.seed)
        out = paths.cache_dir() / "models" / f"tiny-vlm-seed{cfg.model.seed}"
        return build_tiny_vlm(out, text, seed=cfg.model.seed)
    base = Path(cfg.model.base)
    if not (base / "config.json").exists():
        raise ConfigError(
            f"model.base = {cfg.model.base!r} is neither 'tiny', 'tiny-vlm' nor a model directory"
        )
    return base


def prepare_model(cfg: TrainConfig, say: Callable[[str], None] = print) -> Path:
    """The model RL starts from: the base (built if it is the tiny one), warm-started per
    ``[warm_start]`` (cached under the cache dir)."""
    base, cache = base_model(cfg), paths.cache_dir() / "models"
    if cfg.warm_start.recipe is WarmStartRecipe.HARNESS_TRAFFIC:
        r = cfg.rollouts
        images = ImagePolicy(fallbacks=r.image_fallbacks, strict=r.strict_images)
        play = DemoSettings(
            concurrency=r.concurrency,
            context=cfg.model.context,
            sandbox=r.sandbox,
            images=images,
            agent_timeout_multiplier=r.agent_timeout_multiplier,
        )
        return harness_warm_start(base, cfg.warm_start, _harness(cfg), play, cache, say)
    return warm_start(base, cfg.warm_start, cfg.harness, cache, say)


def _split(cfg: TrainConfig, split: str) -> list[Task]:
    tasks = list(load_dataset(Path(cfg.tasks.dataset), split=split))
    memory, multiplier = cfg.rollouts.override_memory_mb, cfg.rollouts.agent_timeout_multiplier
    tasks = [t.with_memory(memory) for t in tasks] if memory else tasks
    if multiplier != 1:
        tasks = [t.with_agent_timeout_multiplier(multiplier) for t in tasks]
    return tasks


def launch_tag(root: Path) -> str:
    """A fresh tag per launch of the run directory ``root``: rollout ids never repeat on resume."""
    path = root / "launches"
    n = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(n))
    return f"l{n}"


def initial_weights(cfg: TrainConfig, root: Path, model_dir: Path) -> tuple[Path, int, int]:
    """(weights to serve, policy version, last update done): the latest checkpoint's export, or
    the untrained policy (for LoRA, B = 0: exactly the warm-started model)."""
    from trainer import checkpoint

    state = checkpoint.latest_state(root / "trainer" / "checkpoints")
    if state is not None:
        export = root / "trainer" / "export" / f"v{state.step}"
        if export.exists():
            return export, state.policy_version, state.step
    if cfg.trainer.lora_rank == 0:
        return model_dir, 0, 0
    from trainer.backends import make_backend

    backend = make_backend(
        cfg.trainer.backend, model_dir, cfg.trainer.lora_rank, 1e-3, cfg.trainer.seed
    )
    return backend.export_for_inference(root / "trainer" / "export" / "v0"), 0, 0


def prepare_launch(cfg: TrainConfig, root: Path, say: Callable[[str], None] = print) -> Launch:
    """The run directory ``root`` with its resolved config, and what this launch starts from."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.toml").write_text(to_toml(cfg))
    train_tasks = _split(cfg, cfg.tasks.train_split)
    heldout = _split(cfg, cfg.tasks.heldout_split)
    if cfg.evaluation.tasks:
        heldout = heldout[: cfg.evaluation.tasks]
    if not train_tasks:
        raise ConfigError(f"no {cfg.tasks.train_split!r} tasks in {cfg.tasks.dataset}")
    chosen = _harness(cfg)
    model_dir = prepare_model(cfg, say)
    tag = launch_tag(root)
    weights, version, done_steps = initial_weights(cfg, root, model_dir)
    if done_steps:
        say(f"resuming after update {done_steps} (policy version {version})")
    log_url = cfg.event_log.url or f"local:{root / 'log'}"
    return Launch(
        tag,
        train_tasks,
        heldout,
        chosen,
        model_dir,
        log_url,
        weights,
        version,
        done_steps,
        root / "log" / "images",
    )
