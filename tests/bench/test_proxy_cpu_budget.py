"""The CPU budget bench's attribution of py-spy samples to the proxy's stages."""

from __future__ import annotations

from pathlib import Path

import proxy.render
from bench.proxy_cpu_budget import FSYNC, WAITING, parse_raw

ROOT = Path(proxy.render.__file__).resolve().parents[1]
SITE = "/venv/lib/python3.11/site-packages"


def _frame(func: str, path: str, line: int = 1) -> str:
    return f"{func} ({path}:{line})"


def _fsync_line() -> int:
    source = (ROOT / "infra/eventlog/local.py").read_text().splitlines()
    return next(i for i, text in enumerate(source, 1) if "fsync(" in text)


def test_the_innermost_named_frame_decides_and_methods_match_by_their_own_name() -> None:
    loop = _frame("Runner.run", "/py/asyncio/runners.py")
    handle = _frame("handle", f"{ROOT}/proxy/calls.py")
    render = _frame("Renderer.continuation", f"{ROOT}/proxy/render.py")
    raw = "\n".join(
        [
            f"{loop};{handle};{render};{_frame('Template.render', f'{SITE}/jinja2/x.py')} 5",
            f"{loop};{handle};{render};{_frame('Renderer.encode', f'{ROOT}/proxy/render.py')} 3",
            f"{loop};{handle};{_frame('parse_json', f'{ROOT}/proxy/bodies.py')} 2",
            f"{loop};{handle};{_frame('Stream.text', f'{ROOT}/proxy/dialects/chat.py')} 1",
            f"{loop};{handle};{_frame('parse', f'{ROOT}/proxy/dialects/chat.py')} 4",
            f"{loop};{_frame('RequestResponseCycle.send', f'{SITE}/uvicorn/h.py')} 6",
            f"{loop} 7",
            f"{_frame('encode_batch', f'{ROOT}/schemas/codec.py')} 8",
            f"{_frame('Queue.get', '/py/queue.py')};{_frame('Condition.wait', '/py/t.py')} 9",
            f"{_frame('LocalWriter.flush', f'{ROOT}/infra/eventlog/local.py', _fsync_line())} 10",
            f"{_frame('mystery', '/elsewhere/x.py')} 11",
            "not a sample line",
        ]
    )
    assert parse_raw(raw) == {
        "render": 5,
        "tokenize": 3,
        "parse": 2 + 4,
        "response": 1,
        "server and event loop": 6 + 7,
        "encode": 8,
        WAITING: 9,
        FSYNC: 10,
        "other": 11,
    }
