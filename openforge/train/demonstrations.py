"""The harness-traffic warm start's demonstrations: the real harness binary, unmodified, plays
echo-words tasks in their own image (each rollout a sandbox, as in training) through a real
capture proxy whose upstream is the scripted teacher (:mod:`openforge.train.teacher`). Each
rollout's recorded events become its episode exactly as the pipeline assembles it
(:func:`pipeline.assembly.assemble`): the samples' token ids and loss masks are the ones RL
would train on, and the verifier's reward says whether the demonstration was correct.

    demos = record(harness, model_dir, words, DemoSettings(), out_dir)
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infra.eventlog import EVENTS_TOPIC, records_in
from infra.harnesses import Harness, shell_harnesses
from infra.images import ImagePolicy
from infra.proxy_client import ProxyAdmin
from infra.tasks import Task, load_dataset
from openforge.stack import ProxyOptions, StackSpec, serve
from openforge.threaded import serve_in_thread
from openforge.train.config import POLICY
from openforge.train.teacher import Teacher
from orchestrator.backend import RolloutBackendName, RunProxy
from orchestrator.environments import SandboxMode
from orchestrator.local import LocalConfig
from orchestrator.plan import plan
from orchestrator.registry import RolloutBackendConfig, build_backend
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RolloutOutcome, RunDir, Status
from pipeline.assembly import assemble
from schemas.codec import Record
from schemas.errors import ConfigError, ServiceError
from schemas.registry import one_of

# One Harbor task per word, as examples/echo-words/generate.py writes them.
TASK_TOML = """\
version = "1.0"

[metadata]
author_name = "OpenForge"
category = "echo-words-demonstrations"

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 120.0

[environment]
cpus = 1
memory_mb = 4096  # OpenClaw on Node 24 is OOM-killed at 1 GiB
allow_internet = false
workdir = "/app"
"""
DOCKERFILE = "FROM python:3.12-slim\nWORKDIR /app\n"
TEST_SH = """\
#!/usr/bin/env bash
set -u
mkdir -p /logs/verifier
reward=0
if [ -f /app/answer.txt ] && [ "$(tr -d '[:space:]' < /app/answer.txt)" = "{word}" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
"""


@dataclass(frozen=True)
class DemoSettings:
    """How the demonstrations are played.

    Attributes:
        per_word: rollouts per word (the teacher alternates correct and imperfect ones).
        concurrency: rollouts at once.
        context: the context window the proxy checks calls against (tokens).
        sandbox: where the tasks (which have an image) run.
        images: how their base image is found.
        agent_timeout_multiplier: scales the tasks' agent timeout (``[rollouts]
            agent_timeout_multiplier``): on a slow machine a harness's own start can outlast it.
    """

    per_word: int = 2
    concurrency: int = 4
    context: int = 16384
    sandbox: SandboxMode = SandboxMode.AUTO
    images: ImagePolicy = field(default_factory=ImagePolicy)
    agent_timeout_multiplier: float = 1.0


@dataclass(frozen=True)
class Demonstration:
    """One recorded rollout of the teacher: its word, whether the verifier gave it 1, and its
    samples as the pipeline assembles them: (token ids, loss mask) each."""

    rollout_id: str
    word: str
    correct: bool
    samples: list[tuple[list[int], list[int]]]

    def acting(self) -> tuple[list[int], list[int]]:
        """The sample that acts: the one with the most trained tokens, the shell tool call
        with its command. Not always the first: OpenCode asks for a title first (a thread of
        its own, a few tokens), and a harness that rewrites the history puts its last answer
        ("Done.") in a sample of its own."""
        return max(self.samples, key=lambda sample: sum(sample[1]))


def write_tasks(words: Sequence[str], root: Path) -> list[Task]:
    """One echo-words task per word under ``root`` (made anew); the tasks, loaded."""
    shutil.rmtree(root, ignore_errors=True)
    for word in words:
        task = root / f"echo-{word}"
        for rel, text, mode in [
            ("task.toml", TASK_TOML, 0o644),
            ("instruction.md", f"Write the word {word} to answer.txt.\n", 0o644),
            ("environment/Dockerfile", DOCKERFILE, 0o644),
            ("tests/test.sh", TEST_SH.format(word=word), 0o755),
        ]:
            path = task / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(mode)
    return list(load_dataset(root))


def record(
    harness: Harness,
    model_dir: Path,
    words: Sequence[str],
    settings: DemoSettings,
    out: Path,
    say: Callable[[str], None] = print,
) -> list[Demonstration]:
    """Play every word ``settings.per_word`` times with ``harness`` against the teacher,
    recorded under ``out``; the verified rollouts' demonstrations."""
    if harness.shell_tool is None:
        raise ConfigError(
            f"the {harness.name!r} harness has no shell tool to demonstrate with: the "
            f"harness-traffic warm start needs one of {one_of(shell_harnesses())}"
        )
    shutil.rmtree(out, ignore_errors=True)  # a recording is whole or not kept
    tasks = write_tasks(words, out / "tasks")
    if settings.agent_timeout_multiplier != 1:
        tasks = [t.with_agent_timeout_multiplier(settings.agent_timeout_multiplier) for t in tasks]
    teacher = Teacher(model_dir, harness.shell_tool, POLICY, settings.context)
    log_url = f"local:{out / 'log'}"
    with serve_in_thread(teacher.app(), "scripted teacher", log_level="critical") as url:
        spec = StackSpec(
            out=out / "services",
            log_url=log_url,
            model=POLICY,
            tokenizer=model_dir,
            vllm=None,
            proxy=ProxyOptions(max_model_len=settings.context, max_tokens_cap=512),
            upstream=url,
            ready_timeout=120,
        )
        with serve(spec, say) as stack:
            run_proxy = RunProxy(stack.admin.url, stack.endpoint)
            outcomes = _play(harness, tasks, settings, stack.admin, run_proxy, out)
    kept = _kept(harness, outcomes, out)
    late = sum(o.agent_phase == "timed_out" for o in outcomes)
    say(
        f"  demonstrations: {len(kept)} of {len(outcomes)} rollouts verified with the harness "
        f"finished ({late} timed out), {len(teacher.served)} tool calls"
    )
    return demonstrations(log_url, kept)


def _play(
    harness: Harness,
    tasks: list[Task],
    settings: DemoSettings,
    admin: ProxyAdmin,
    run_proxy: RunProxy,
    out: Path,
) -> list[RolloutOutcome]:
    """The rollouts, in sandboxes of the local backend; how each ended."""
    local = LocalConfig(sandbox=settings.sandbox, images=settings.images)
    backend = build_backend(
        RolloutBackendConfig(name=RolloutBackendName.LOCAL, local=local), run_proxy
    )
    try:
        orch_cfg = OrchestratorConfig(
            concurrency=settings.concurrency, max_attempts=2, model=POLICY
        )
        orch = Orchestrator(backend, harness, admin, RunDir(out / "rollouts"), orch_cfg)
        return list(orch.run(plan(tasks, settings.per_word, run_id="demo")))
    finally:
        backend.close()


def _kept(harness: Harness, outcomes: list[RolloutOutcome], out: Path) -> set[str]:
    """The ids of the rollouts that are demonstrations: verified, and the harness finished (a
    harness stopped by its timeout may not have run the teacher's tool call: its reward would
    label a correct call wrong)."""
    kept = {
        o.rollout_id
        for o in outcomes
        if o.status is Status.VERIFIED and o.agent_phase == "finished"
    }
    if not kept:
        phases = sorted({str(o.agent_phase) for o in outcomes})
        raise ServiceError(
            f"no demonstration of {harness.name} was verified with the harness finished "
            f"({len(outcomes)} rollouts, agent phases {phases}): see the rollouts' logs under "
            f"{out / 'rollouts'}; on a slow machine raise [rollouts] agent_timeout_multiplier"
        )
    return kept


def demonstrations(log_url: str, rollout_ids: set[str]) -> list[Demonstration]:
    """The episodes of ``rollout_ids`` in the log, as demonstrations (sorted by rollout id)."""
    by_rollout: dict[str, list[Record]] = {}
    for rec in records_in(log_url, EVENTS_TOPIC):
        rid = getattr(rec, "rollout_id", None)
        if rid in rollout_ids:
            by_rollout.setdefault(rid, []).append(rec)
    out = []
    for rid in sorted(by_rollout):
        episode = assemble(rid, by_rollout[rid], created_us=0)
        word = (episode.task_id or "").removeprefix("echo-")
        samples = [(list(s.token_ids), list(s.loss_mask)) for s in episode.samples]
        out.append(Demonstration(rid, word, episode.reward == 1.0, samples))
    return out
