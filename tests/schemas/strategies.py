"""Hypothesis strategies for every record type (shared by the schema and pipeline tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from schemas.completion import CompletionEvent, PolicySpan, SamplingParams, Timings, Usage
from schemas.enums import CompletionStatus, ContinuityClass, Dialect, RolloutPhase
from schemas.episode import Episode, Fork, Sample
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent
from schemas.step import ConsumedEpisode, TrainingStep

INT32 = st.integers(-(2**31), 2**31 - 1)
UINT31 = st.integers(0, 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TIME_US = st.integers(0, 4_102_444_800_000_000)  # up to 2100
TOKEN = st.integers(0, 2**31 - 1)
F32 = st.floats(width=32, allow_nan=False)  # logprobs may be -inf
F64 = st.floats(allow_nan=False)
TEXT = st.text(max_size=40)  # unicode, no surrogates
OPT_TEXT = st.none() | TEXT
IDS = st.text(min_size=1, max_size=24)

spans = st.builds(PolicySpan, version=INT64, start=INT32, end=INT32)
sampling = st.builds(
    SamplingParams,
    temperature=st.none() | F64,
    top_p=st.none() | F64,
    top_k=st.none() | INT64,
    max_tokens=st.none() | INT64,
    seed=st.none() | INT64,
    stop=st.lists(TEXT, max_size=3),
)
usage = st.builds(
    Usage, prompt_tokens=INT64, completion_tokens=INT64, cached_tokens=st.none() | INT64
)
timings = st.builds(
    Timings, received_us=TIME_US, first_token_us=st.none() | INT64, done_us=st.none() | INT64
)
json_text = st.none() | st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
).map(lambda v: __import__("json").dumps(v, ensure_ascii=False))

completions = st.builds(
    CompletionEvent,
    event_id=IDS,
    rollout_id=IDS,
    call_index=st.integers(0, 2**31 - 1),
    dialect=st.sampled_from(Dialect),
    streamed=st.booleans(),
    model=TEXT,
    timings=timings,
    status=st.sampled_from(CompletionStatus),
    task_id=OPT_TEXT,
    harness=OPT_TEXT,
    harness_version=OPT_TEXT,
    thread_id=OPT_TEXT,
    parent_event_id=OPT_TEXT,
    sampling=sampling,
    prompt_ref_event_id=OPT_TEXT,
    prompt_ref_tokens=UINT31,
    prompt_token_ids=st.lists(TOKEN, max_size=64),
    prompt_length=UINT31,
    completion_token_ids=st.lists(TOKEN, max_size=64),
    completion_logprobs=st.lists(F32, max_size=64),
    policy_versions=st.lists(spans, max_size=3),
    finish_reason=OPT_TEXT,
    usage=usage,
    error=OPT_TEXT,
    retry_of=OPT_TEXT,
    side_call=st.booleans(),
    continuity=st.sampled_from(ContinuityClass),
    request_history_ref=OPT_TEXT,
    request_history_prefix=UINT31,
    request_body=json_text,
    response_body=json_text,
    redacted=st.booleans(),
)

rollouts = st.builds(
    RolloutEvent,
    event_id=IDS,
    rollout_id=IDS,
    phase=st.sampled_from(RolloutPhase),
    at_us=TIME_US,
    task_id=OPT_TEXT,
    group_id=OPT_TEXT,
    harness=OPT_TEXT,
    harness_version=OPT_TEXT,
    backend=OPT_TEXT,
    exit_code=st.none() | INT32,
    duration_s=st.none() | F64,
    message=OPT_TEXT,
    metadata=st.dictionaries(TEXT, TEXT, max_size=4),
    calls=st.none() | INT32,
    costs=st.dictionaries(TEXT, F64, max_size=4),
)

rewards = st.builds(
    RewardEvent,
    event_id=IDS,
    rollout_id=IDS,
    reward=F64,
    at_us=TIME_US,
    task_id=OPT_TEXT,
    components=st.dictionaries(TEXT, F64, max_size=4),
    verifier=OPT_TEXT,
    verifier_output=OPT_TEXT,
)


@st.composite
def samples(draw: st.DrawFn, index: int = 0) -> Sample:
    n = draw(st.integers(0, 48))
    return Sample(
        index=index,
        token_ids=draw(st.lists(TOKEN, min_size=n, max_size=n)),
        loss_mask=draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)),
        behavior_logprobs=draw(st.lists(F32, min_size=n, max_size=n)),
        policy_versions=draw(st.lists(spans, max_size=3)),
        parent_index=draw(st.none() | st.integers(0, 8)),
        fork_class=draw(st.sampled_from(ContinuityClass)),
        event_ids=draw(st.lists(IDS, max_size=4)),
    )


forks = st.builds(
    Fork,
    sample_index=INT32,
    parent_index=st.none() | INT32,
    call_index=INT32,
    mismatch=st.sampled_from(ContinuityClass),
    common_prefix=INT32,
)


@st.composite
def episodes(draw: st.DrawFn) -> Episode:
    count = draw(st.integers(0, 4))
    return Episode(
        episode_id=draw(IDS),
        rollout_id=draw(IDS),
        samples=[draw(samples(index=i)) for i in range(count)],
        reward=draw(st.none() | F64),
        created_us=draw(TIME_US),
        task_id=draw(OPT_TEXT),
        group_id=draw(OPT_TEXT),
        harness=draw(OPT_TEXT),
        reward_components=draw(st.dictionaries(TEXT, F64, max_size=3)),
        forks=draw(st.lists(forks, max_size=3)),
        lineage=draw(st.lists(IDS, max_size=6)),
        dead_letter=draw(OPT_TEXT),
    )


consumed_episodes = st.builds(
    ConsumedEpisode,
    episode_id=IDS,
    rollout_id=IDS,
    task_id=OPT_TEXT,
    group_id=OPT_TEXT,
    reward=st.none() | F64,
    policy_versions=st.lists(INT64, max_size=3),
    topic=OPT_TEXT,
    partition=st.none() | INT32,
    offset=st.none() | INT64,
)

steps = st.builds(
    TrainingStep,
    step=INT64,
    at_us=TIME_US,
    policy_version=INT64,
    episodes=st.lists(consumed_episodes, max_size=6),
    metrics=st.dictionaries(TEXT, F64, max_size=6),  # NaN aside: it never equals itself
)

ANY_RECORD = st.one_of(completions, rollouts, rewards, episodes(), steps)
