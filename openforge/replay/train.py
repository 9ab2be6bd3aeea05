"""``openforge replay train``: retrain offline on episodes chosen by SQL.

1. Select: ``SELECT episode_id FROM episodes WHERE <where>`` over the views of ``openforge
   query`` (:func:`openforge.query.views.connect`), restricted to trainable episodes (no dead
   letter, some generated tokens). Where a rollout was re-scored, the view shows its rebuilt
   episode (the latest), and so does the selection.
2. Materialise: exactly those episode records (the same versions the view shows) are written,
   grouped by GRPO group, to ``OUT/selected/`` (an archive) with ``OUT/selection.json`` (the
   predicate and the ids).
3. Train, either
   - off-policy RL through the trainer's own loop (:func:`trainer.loop.train`, CPU reference
     backend by default) reading ``archive:OUT/selected``: one pass, every policy version
     admitted (``stale = keep``: the behavior logprobs the proxy recorded drive the importance
     correction), a group as large as the largest selected group, a smaller one released at once
     (the archive is read 256 episodes at a time, in group order: a group that straddles two
     reads is trained as two parts; an episode alone in its group has no advantage and is
     counted as ``timed_out_alone``, not trained on);
     checkpoints, ``metrics.csv`` and ``consumed.jsonl`` (episodes per step) in ``OUT``; or
   - SFT (``sft``) on the generated tokens of the selected episodes (:mod:`trainer.sft`): each
     run of generated tokens of a sample is one example, its preceding tokens the prompt; the
     fine-tuned model goes to ``OUT/model``, ``consumed.jsonl`` and ``metrics.csv`` to ``OUT``.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge.query.source import RunFiles, is_archive_root
from openforge.query.views import connect, execute
from schemas.archive import ArchiveWriter, read_archive
from schemas.episode import Episode
from schemas.errors import ConfigError
from trainer.algorithms import AlgorithmConfig
from trainer.backends import BackendName
from trainer.batch import group_key
from trainer.loop import TrainerConfig, train
from trainer.metrics_log import MetricsLog
from trainer.sft import Example, SFTConfig, fine_tune
from trainer.stream import StalePolicy, StreamConfig

SELECTED = "selected"


@dataclass(frozen=True)
class ReplayTrainConfig:
    """Attributes:
    source: an archive root, or a run directory (its ``archive/`` and episode archives).
    model_dir: the model to start from.
    out: checkpoints, metrics, the selection and (SFT) the fine-tuned model.
    where: a SQL predicate over the ``episodes`` view (None: every trainable episode).
    sft: supervised fine-tuning on the generated tokens instead of RL.
    backend, lora_rank, lr, algo, token_budget: the RL trainer's settings.
    sft_epochs, sft_batch: SFT passes over the examples and examples per step.
    """

    source: Path
    model_dir: Path
    out: Path
    where: str | None = None
    sft: bool = False
    backend: BackendName = BackendName.CPU
    lora_rank: int | None = 8
    lr: float = 1e-3
    algo: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    token_budget: int = 16_384
    sft_epochs: int = 1
    sft_batch: int = 8


def _files(source: Path) -> RunFiles:
    return RunFiles.of_archive(source) if is_archive_root(source) else RunFiles.of_run(source)


def select(source: Path, where: str | None) -> list[str]:
    """Ids of the trainable episodes of ``source`` that ``where`` selects, in group order."""
    predicate = f"AND ({where})" if where and where.strip() else ""
    sql = (
        "SELECT episode_id FROM episodes WHERE dead_letter IS NULL "
        f"AND n_generated_tokens > 0 {predicate} ORDER BY group_id, task_id, episode_id"
    )
    con = connect(_files(source))
    try:
        relation = execute(con, sql)
        assert relation is not None
        return [row[0] for row in relation.fetchall()]
    finally:
        con.close()


def materialise(source: Path, ids: list[str], out: Path) -> list[Episode]:
    """The selected episodes as the view shows them (of several records with one id, the
    latest non-dead-letter one), written to ``out`` as an archive, grouped."""
    wanted = set(ids)
    best: dict[str, Episode] = {}
    for root in _files(source).archives:
        for episode in read_archive(root, Episode):
            if episode.episode_id not in wanted or episode.dead_letter is not None:
                continue
            held = best.get(episode.episode_id)
            if held is None or episode.created_us > held.created_us:
                best[episode.episode_id] = episode
    episodes = sorted(best.values(), key=lambda e: (group_key(e), e.episode_id))
    if episodes:
        ArchiveWriter(out).write(episodes)
    return episodes


def sft_examples(episodes: list[Episode]) -> list[tuple[str, Example]]:
    """(episode id, (prompt, completion)) per run of generated tokens of every sample."""
    out: list[tuple[str, Example]] = []
    for episode in episodes:
        for sample in episode.samples:
            mask, start = sample.loss_mask, None
            for i, m in enumerate([*mask, 0]):
                if m and start is None:
                    start = i
                elif not m and start is not None:
                    out.append(
                        (episode.episode_id, (sample.token_ids[:start], sample.token_ids[start:i]))
                    )
                    start = None
    return out


def _train_sft(cfg: ReplayTrainConfig, episodes: list[Episode]) -> dict[str, Any]:
    examples = sft_examples(episodes)
    rng = random.Random(0)
    order = [
        i for _ in range(cfg.sft_epochs) for i in rng.sample(range(len(examples)), len(examples))
    ]
    steps = math.ceil(len(order) / cfg.sft_batch)
    log = MetricsLog(cfg.out)
    consumed = open(cfg.out / "consumed.jsonl", "w")  # noqa: SIM115 - closed below
    drawn: list[list[str]] = []

    def draw(_: random.Random, batch: int) -> list[Example]:
        chunk = order[len(drawn) * batch : (len(drawn) + 1) * batch]
        drawn.append([examples[i][0] for i in chunk])
        return [examples[i][1] for i in chunk]

    def on_step(step: int, loss: float) -> None:
        ids = sorted(set(drawn[step - 1]))
        consumed.write(json.dumps({"step": step, "episodes": ids}) + "\n")
        log.log(step, {"sft/loss": loss, "data/episodes": len(ids)})

    try:
        model = fine_tune(
            cfg.model_dir,
            cfg.out / "model",
            draw,
            SFTConfig(steps=steps, batch=cfg.sft_batch, lr=cfg.lr),
            on_step=on_step,
        )
    finally:
        consumed.close()
        log.close()
    return {"steps": steps, "examples": len(examples), "model": str(model)}


def replay_train(cfg: ReplayTrainConfig) -> dict[str, Any]:
    """Select, materialise and train (see the module docstring); a summary of what it did."""
    ids = select(cfg.source, cfg.where)
    if not ids:
        raise ConfigError(
            f"no trainable episode in {cfg.source} matches {cfg.where!r}: check the predicate "
            'with `openforge query "SELECT ... FROM episodes WHERE ..."`'
        )
    cfg.out.mkdir(parents=True, exist_ok=True)
    selected_dir = cfg.out / SELECTED
    if selected_dir.exists():
        raise ConfigError(f"{cfg.out} already holds a selection: pass a fresh --out directory")
    episodes = materialise(cfg.source, ids, selected_dir)
    (cfg.out / "selection.json").write_text(
        json.dumps(
            {"source": str(cfg.source), "where": cfg.where, "sft": cfg.sft, "episodes": ids},
            indent=2,
        )
        + "\n"
    )
    if cfg.sft:
        return {"selected": len(ids), **_train_sft(cfg, episodes)}
    group = max(Counter(group_key(e) for e in episodes).values())
    summary = train(
        TrainerConfig(
            episodes=f"archive:{selected_dir}",
            model_dir=cfg.model_dir,
            out_dir=cfg.out,
            lora_rank=cfg.lora_rank,
            backend=cfg.backend,
            lr=cfg.lr,
            algo=cfg.algo,
            stream=StreamConfig(
                group_size=group,
                token_budget=cfg.token_budget,
                max_staleness=1 << 30,
                stale=StalePolicy.KEEP,
                group_timeout_s=1e-6,  # everything is read: a smaller group is complete
            ),
            idle_timeout=1.0,
        )
    )
    return {"selected": len(ids), **summary}
