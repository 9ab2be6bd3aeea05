"""What each real harness does through the proxy: calls, continuity, retries, wall time.

    .venv/bin/python -m bench.harness_rollouts --rollouts 3 --real 2

Per harness, three kinds of rollout, run one after another on this machine:

- ``scripted``: the scripted policy of the tests (a tool call in the harness's own schema, then an
  answer), so that each harness does real multi-turn tool use;
- ``dropped``: the same, with the first answer's stream cut off once;
- ``real``: the tiny model on real vLLM (64k context), answers capped at 48 tokens of noise.

Prints one markdown table per kind: dialect, streamed share, calls per rollout, continuity classes
and their rates, side calls, retries, and wall time per rollout (mean and max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from infra.harnesses import HARNESSES, Harness, model_harnesses
from infra.harnesses.runner import run_rollout
from infra.local.vllm import VLLMServer
from infra.paths import cache_dir
from infra.tiny_model import TinyModelSpec, build_tiny_model
from openforge.testing.harness_cases import CASES, TASK
from openforge.testing.policy import Script, ScriptedPolicy, serving
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus


@dataclass
class Tally:
    rollouts: int = 0
    exits: Counter[int | None] = field(default_factory=Counter)
    events: list[CompletionEvent] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)

    def row(self, harness: Harness) -> str:
        calls = len(self.events)
        classes = Counter(e.continuity.value for e in self.events)
        rates = ", ".join(f"{k} {v / calls:.0%}" for k, v in classes.most_common())
        streamed = sum(e.streamed for e in self.events) / max(calls, 1)
        side = sum(e.side_call for e in self.events)
        retries = sum(e.retry_of is not None for e in self.events)
        failed = sum(e.status is not CompletionStatus.OK for e in self.events)
        exits = ", ".join(f"{k}: {v}" for k, v in sorted(self.exits.items(), key=str))
        return (
            f"| {harness.name} {harness.version} | {harness.dialect} | {streamed:.0%} "
            f"| {calls / max(self.rollouts, 1):.1f} | {rates} | {side} | {retries} | {failed} "
            f"| {exits} | {statistics.mean(self.walls):.1f} / {max(self.walls):.1f} |"
        )


HEADER = (
    "| harness | dialect | streamed | calls/rollout | continuity classes (rate) | side calls "
    "| retries | failed calls | exit codes | wall s (mean / max) |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def run_kind(kind: str, rollouts: int, work: Path, vllm: VLLMServer | None) -> str:
    rows = []
    for name in model_harnesses():
        harness = HARNESSES[name]()
        tally = Tally()
        for i in range(rollouts):
            tmp = work / f"{kind}-{name}-{i}"
            rollout_id = f"{name}-{kind}-{i}"
            with ExitStack() as stack:
                if vllm is None:
                    case = CASES[name]
                    ws = tmp / "rollouts" / rollout_id / "workspace"
                    args = json.loads(json.dumps(case.arguments).replace("{ws}", str(ws)))
                    script = Script(case.tool, args, drop_stream_once=kind == "dropped")
                    upstream = stack.enter_context(
                        serving(ScriptedPolicy(cache_dir() / "models" / "tiny-seed0", script))
                    )
                    config = proxy_config(upstream, tmp)
                else:
                    config = proxy_config(vllm.base_url, tmp, max_tokens_cap=48)
                proxy = stack.enter_context(running_proxy(config))
                result = run_rollout(
                    harness,
                    TASK,
                    proxy.url,
                    tmp / "rollouts",
                    rollout_id=rollout_id,
                    timeout_s=300,
                    admin_token=proxy.config.admin_token,
                )
                proxy.flush()
            tally.rollouts += 1
            tally.exits[result.exit_code] += 1
            tally.walls.append(result.duration_s)
            tally.events += completions_of(read_events(config.log_url), rollout_id)
        rows.append(tally.row(harness))
    return f"\n**{kind}** ({rollouts} rollouts per harness)\n\n{HEADER}\n" + "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=3, help="scripted rollouts per harness")
    parser.add_argument("--real", type=int, default=2, help="real-vLLM rollouts per harness")
    args = parser.parse_args()
    build_tiny_model(cache_dir() / "models" / "tiny-seed0", seed=0)
    with tempfile.TemporaryDirectory(prefix="openforge-bench-") as tmp:
        work = Path(tmp)
        print(run_kind("scripted", args.rollouts, work, None))
        print(run_kind("dropped", args.rollouts, work, None))
        if args.real:
            model = build_tiny_model(
                cache_dir() / "models" / "tiny-seed0-ctx64k",
                seed=0,
                spec=TinyModelSpec(max_position_embeddings=65536),
            )
            with VLLMServer(
                model, served_model_name="tiny", max_model_len=65536, enable_lora=False
            ) as vllm:
                print(run_kind("real", args.real, work, vllm))


if __name__ == "__main__":
    main()
