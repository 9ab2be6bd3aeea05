"""Browser sandbox start to the browser agent's first observation, beside the built-in agent's
start to its first call, in containers of the same web task's image.

    .venv/bin/python -m bench.browser_start [--rollouts 8]

Code path: ``openforge``'s local rollout backend runs the web task ``newsletter-signup``
(examples/web-tasks) in the runc container sandbox of its image (the image's ENTRYPOINT starts the
task's app first); the harness is ``browser`` (the browser agent: headless Chromium launched over
the DevTools pipe, the start page loaded, its accessibility tree read, then the first call) or
``agent`` (the baseline: the built-in agent, whose first call needs no browser), interleaved one
after the other. Both answer a scripted policy (one call, then done), through the real proxy.
Measured per rollout: from its ``started`` lifecycle event (the key minted, just before the
sandbox is asked for) to the proxy's receipt of its first call: for the browser agent that call
carries the first observation. Proof of path: each browser rollout's first recorded prompt holds
the page's accessibility tree (``[1] textbox "Email address"``), each agent's does not.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from infra.harnesses import Agent, Browser, Harness
from infra.sandbox import ProxyEndpoint
from infra.tasks import load_task
from openforge.stack import tiny_model
from openforge.testing.policy import Script, ScriptedPolicy, serving
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from orchestrator.backend import RunProxy
from orchestrator.plan import plan
from orchestrator.registry import RolloutBackendConfig, build_backend
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RunDir, Status
from schemas.enums import RolloutPhase
from schemas.rollout import RolloutEvent

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "web-tasks" / "newsletter-signup"
PAGE_LINE = '[1] textbox "Email address"'


def _first_call(harness: Harness, model: Path, tokenizer: Any, upstream: str, root: Path) -> float:
    """Seconds from one rollout's start to its first call at the proxy."""
    config = proxy_config(upstream, root / "proxy", tokenizer=model)
    with running_proxy(config, unix_socket=root / "proxy" / "proxy.sock") as proxy:
        assert proxy.unix_socket is not None
        run_proxy = RunProxy(proxy.url, ProxyEndpoint(proxy.unix_socket, 8100))
        backend = build_backend(RolloutBackendConfig(), run_proxy)
        config_ = OrchestratorConfig(concurrency=1, max_attempts=1)
        orchestrator = Orchestrator(backend, harness, proxy.admin, RunDir(root / "run"), config_)
        (record,) = orchestrator.run(plan([load_task(TASK)], 1, run_id=root.name))
        assert record.status is Status.VERIFIED, record
        proxy.flush()
        records = read_events(proxy.config.log_url, want=2)
    started = next(
        r.at_us
        for r in records
        if isinstance(r, RolloutEvent)
        and r.rollout_id == record.rollout_id
        and r.phase is RolloutPhase.STARTED
    )
    first = completions_of(records, record.rollout_id)[0]
    prompt = str(tokenizer.decode(first.prompt_token_ids))
    is_browser = isinstance(harness, Browser)
    assert (PAGE_LINE in prompt) is is_browser, prompt[-800:]  # proof of path
    return (first.timings.received_us - started) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=8, help="per harness")
    args = parser.parse_args()
    model = tiny_model(4096, 0)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    script = Script("done", {"answer": "done"}, final="Done.")
    times: dict[str, list[float]] = {"browser": [], "agent": []}
    with serving(ScriptedPolicy(model, script)) as upstream, tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rollouts):
            for name, harness in (("browser", Browser(max_turns=1)), ("agent", Agent(max_turns=1))):
                root = Path(tmp) / f"{name}-{n}"
                times[name].append(_first_call(harness, model, tokenizer, upstream, root))
    p50 = {name: statistics.median(values) for name, values in times.items()}
    print("| harness | rollouts | start to first call p50 (s) | max (s) |")
    print("| --- | --- | --- | --- |")
    for name, values in times.items():
        print(f"| {name} | {len(values)} | {p50[name]:.2f} | {max(values):.2f} |")
    print(f"\nbrowser / agent (p50): {p50['browser'] / p50['agent']:.2f}x; the browser's own part "
          f"(Chromium, page, tree): {p50['browser'] - p50['agent']:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
