"""The main job: a real RL training loop on one CPU, every part running for real.

vLLM serves the tiny model with a LoRA adapter named ``policy``; the capture proxy records every
completion into the embedded local log; a rollout driver plays tasks through the proxy with the
official OpenAI SDK and reports each rollout's reward; the Beam pipeline (local streaming runner)
assembles episodes; the trainer makes GRPO updates with veRL's losses and truncated importance
sampling, hot-loads each new adapter into vLLM and bumps the proxy's policy version.

The task is deliberately simple so a 0.4 M-parameter model can learn it in minutes: answer with
lower-case text. The reward is the fraction of generated characters that are ASCII a-z.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.local.process import ServiceProcess
from infra.local.vllm import VLLMServer
from infra.proxy_client import ProxyAdmin
from openforge.stack import proxy_process

PROMPTS = [
    "Describe the files in this repository.",
    "Explain what the failing test checks.",
    "Write a short note about the build.",
    "Summarise the last command output.",
]


def lowercase_reward(text: str) -> float:
    """Fraction of characters that are ASCII a-z (0 for an empty answer)."""
    if not text:
        return 0.0
    return sum("a" <= c <= "z" for c in text) / len(text)


@dataclass
class DemoConfig:
    steps: int = 12
    group_size: int = 4
    groups_per_step: int = 2
    max_tokens: int = 24
    lr: float = 1e-2
    seed: int = 0


class RolloutDriver(threading.Thread):
    """Plays groups of rollouts through the proxy until stopped; reports rewards."""

    def __init__(self, admin: ProxyAdmin, cfg: DemoConfig, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="rollout-driver")
        self.admin, self.cfg, self.stop = admin, cfg, stop
        self.rollouts = 0
        self.error: BaseException | None = None

    def _rollout(self, task: int, group: str) -> None:
        import openai

        reg = self.admin.register_rollout(
            task_id=f"task-{task}", group_id=group, harness="openforge-demo"
        )
        client = openai.OpenAI(base_url=f"{self.admin.url}/v1", api_key=reg.api_key)
        answer = client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": PROMPTS[task % len(PROMPTS)]}],
            max_tokens=self.cfg.max_tokens,
            temperature=1.0,
        )
        text = answer.choices[0].message.content or ""
        self.admin.post_reward(reg.rollout_id, lowercase_reward(text), verifier="lowercase@1")
        self.admin.finish_rollout(reg.rollout_id, exit_code=0)
        self.rollouts += 1

    def run(self) -> None:
        task = 0
        per_version: dict[int, int] = {}
        try:
            while not self.stop.is_set():
                # Stay close to on-policy: a few groups per policy version, then wait for the
                # trainer's next update.
                version = self.admin.policy_version()
                if per_version.get(version, 0) >= self.cfg.groups_per_step:
                    time.sleep(0.2)
                    continue
                per_version[version] = per_version.get(version, 0) + 1
                group = f"g-{uuid.uuid4().hex[:8]}"
                for _ in range(self.cfg.group_size):
                    if self.stop.is_set():
                        return
                    self._rollout(task, group)
                task += 1
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def run_demo(
    out_dir: Path, cfg: DemoConfig, model_dir: Path, say: Callable[[str], None] = print
) -> dict[str, Any]:
    from trainer.algorithms import AlgorithmConfig
    from trainer.backends.cpu import CPUBackend
    from trainer.loop import TrainerConfig, train
    from trainer.stream import StalePolicy, StreamConfig
    from trainer.weight_sync import WeightSync

    out_dir.mkdir(parents=True, exist_ok=True)
    log_url = f"local:{out_dir / 'log'}"
    with VLLMServer(model_dir) as vllm:
        say(f"vLLM ready at {vllm.base_url}")
        # The untrained adapter is the base model (LoRA B = 0): serve it as "policy", version 0.
        initial = CPUBackend(model_dir, lora_rank=8, seed=cfg.seed).export_for_inference(
            out_dir / "export" / "v0"
        )
        WeightSync(vllm.base_url, "policy").load(initial)
        pipeline = ServiceProcess(
            "pipeline",
            [
                sys.executable,
                "-m",
                "openforge",
                "pipeline",
                "run",
                "--source",
                log_url,
                "--lateness",
                "60",
                "--stop-when-idle",
                "30",
            ],
            out_dir / "pipeline.log",
        )
        with proxy_process(
            vllm.base_url, model="policy", tokenizer=model_dir, log_url=log_url, out=out_dir
        ) as admin:
            say(f"proxy ready at {admin.url}; events in {out_dir / 'log'}")
            stop = threading.Event()
            driver = RolloutDriver(admin, cfg, stop)
            try:
                pipeline.start()
                driver.start()
                say(f"training {cfg.steps} steps on groups of {cfg.group_size} rollouts per task")
                t0 = time.time()
                summary = train(
                    TrainerConfig(
                        episodes=log_url,
                        model_dir=model_dir,
                        out_dir=out_dir / "trainer",
                        lora_rank=8,
                        lr=cfg.lr,
                        seed=cfg.seed,
                        algo=AlgorithmConfig(),
                        stream=StreamConfig(
                            group_size=cfg.group_size,
                            token_budget=10_000_000,
                            max_staleness=2,
                            stale=StalePolicy.DROP,
                        ),
                        steps=cfg.steps,
                        idle_timeout=300,
                        sync=WeightSync(vllm.base_url, "policy", admin.url, admin.token),
                    )
                )
                summary["seconds"] = time.time() - t0
                summary["rollouts"] = driver.rollouts
                if driver.error is not None:
                    raise driver.error
                return summary
            finally:
                stop.set()
                driver.join(60)
                pipeline.stop()
