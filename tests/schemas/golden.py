"""Fixed records written once by schema version 1 into ``tests/schemas/data/v1`` (committed).

Later versions must keep reading these files. Regenerate only for a new version's directory:
``python -m tests.schemas.golden data/vN``.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from schemas.archive import ArchiveWriter
from schemas.codec import Record, encode_message
from schemas.completion import CompletionEvent, PolicySpan, SamplingParams, Timings, Usage
from schemas.enums import CompletionStatus, ContinuityClass, Dialect, RolloutPhase
from schemas.episode import Episode, Fork, Sample, episode_id_for
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

DATA = Path(__file__).with_name("data")
T0 = 1_796_000_000_000_000  # 2026-11-30

RECORDS: list[Record] = [
    RolloutEvent(
        "ro-1",
        "r1",
        RolloutPhase.STARTED,
        T0,
        task_id="t1",
        group_id="g1",
        harness="codex",
        backend="local",
        metadata={"image": "py311"},
        schema_version=1,  # written by v1; read back as it was written
    ),
    CompletionEvent(
        "c-1",
        "r1",
        0,
        Dialect.RESPONSES,
        True,
        "tiny",
        Timings(T0 + 1, T0 + 5, T0 + 9),
        task_id="t1",
        harness="codex",
        harness_version="0.171.0",
        thread_id="th1",
        sampling=SamplingParams(temperature=1.0, max_tokens=64, stop=["</s>"]),
        prompt_token_ids=[1, 2, 3],
        prompt_length=3,
        completion_token_ids=[4, 5],
        completion_logprobs=[-0.25, -1.5],
        policy_versions=[PolicySpan(3, 0, 2)],
        finish_reason="stop",
        usage=Usage(3, 2),
        request_body='{"input":[]}',
        response_body='{"output":[]}',
        schema_version=1,
    ),
    CompletionEvent(
        "c-2",
        "r1",
        1,
        Dialect.RESPONSES,
        True,
        "tiny",
        Timings(T0 + 20),
        status=CompletionStatus.CLIENT_DISCONNECTED,
        thread_id="th1",
        prompt_ref_event_id="c-1",
        prompt_ref_tokens=5,
        prompt_token_ids=[6],
        prompt_length=6,
        continuity=ContinuityClass.EXACT,
        retry_of=None,
        side_call=False,
        request_history_ref="c-1",
        request_history_prefix=0,
        redacted=True,
        schema_version=1,
    ),
    RewardEvent(
        "rw-1",
        "r1",
        0.75,
        T0 + 30,
        task_id="t1",
        components={"tests": 0.75},
        verifier="pytest@8",
        verifier_output="3 passed, 1 failed",
        schema_version=1,
    ),
    RolloutEvent(
        "ro-2", "r1", RolloutPhase.FINISHED, T0 + 40, exit_code=0, duration_s=0.04, schema_version=1
    ),
    Episode(
        episode_id_for("r1"),
        "r1",
        [
            Sample(
                0,
                [1, 2, 3, 4, 5, 6],
                [0, 0, 0, 1, 1, 0],
                [0.0, 0.0, 0.0, -0.25, -1.5, 0.0],
                [PolicySpan(3, 3, 5)],
                event_ids=["c-1", "c-2"],
            )
        ],
        0.75,
        T0 + 50,
        task_id="t1",
        group_id="g1",
        harness="codex",
        reward_components={"tests": 0.75},
        forks=[Fork(0, None, 0, ContinuityClass.FIRST, 0)],
        schema_version=1,
        lineage=["ro-1", "c-1", "c-2", "rw-1"],
    ),
]


def write(directory: Path) -> None:
    ArchiveWriter(directory / "archive").write(RECORDS)
    with open(directory / "frames.bin", "wb") as out:
        for record in RECORDS:
            frame = encode_message([record], compress=isinstance(record, CompletionEvent))
            out.write(struct.pack(">I", len(frame)) + frame)


def read_frames(path: Path) -> list[bytes]:
    data = path.read_bytes()
    frames, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from(">I", data, pos)
        frames.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return frames


if __name__ == "__main__":
    write(DATA / (sys.argv[1] if len(sys.argv) > 1 else "v1"))
