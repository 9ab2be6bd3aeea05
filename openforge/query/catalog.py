"""The documented views of ``openforge query``: their SQL, a description and one line per column.

Each view reads the raw records of one record type (``raw.completion``, ``raw.rollout``,
``raw.reward``, ``raw.episode``, ``raw.step``: every field as stored, duplicates included; for
runs older than the step records, also the trainer's ``consumed.jsonl`` as ``raw.consumed``),
and shows them deduplicated and flattened into plain columns.
Records delivered twice (the event log is at-least-once) appear once: by ``event_id``, and for
episodes by ``episode_id``, where an episode supersedes a dead letter of the same rollout.

Times are microseconds since the Unix epoch (``*_us``); ``date`` is the archive partition (the
UTC date of the record's time).
"""

from __future__ import annotations

from openforge.query.cost_views import ROLLOUT_COSTS, STEP_COSTS
from openforge.query.view import STEP_RECORDS as _STEPS
from openforge.query.view import View
from openforge.query.view import unique as _unique
from schemas.enums import CompletionStatus, ContinuityClass, Dialect
from schemas.faults import FaultKind
from schemas.registry import one_of

_COMPLETIONS = _unique("raw.completion", "event_id")
# An episode supersedes a dead letter of the same rollout (same episode id); then the latest.
_EPISODES = _unique("raw.episode", "episode_id", "dead_letter IS NOT NULL, created_us DESC")
_VERSIONS = "list_sort(list_distinct(list_transform({spans}, lambda p: p.version)))"

_EPISODE_KEYS = (
    ("episode_id", "the episode's id: uuid5 of its rollout id, the same on every replay"),
    ("rollout_id", "the rollout it was assembled from"),
    ("task_id", "the task the rollout played"),
    ("group_id", "the rollouts of one task compared with each other (GRPO group)"),
    ("harness", "the harness that played it"),
)

COMPLETIONS = View(
    "completions",
    "one row per completion event (one call of a harness through the proxy)",
    f"""
    SELECT event_id, rollout_id, call_index, thread_id, parent_event_id, task_id, harness,
        harness_version, dialect, streamed, model, status, continuity, retry_of, side_call,
        timings.received_us AS received_us, timings.first_token_us AS first_token_us,
        timings.done_us AS done_us,
        (timings.first_token_us - timings.received_us) / 1000.0 AS time_to_first_token_ms,
        (timings.done_us - timings.received_us) / 1000.0 AS duration_ms,
        sampling.temperature AS temperature, sampling.top_p AS top_p, sampling.top_k AS top_k,
        sampling.max_tokens AS max_tokens, sampling.seed AS seed, sampling.stop AS stop,
        prompt_length, prompt_ref_event_id, prompt_ref_tokens,
        len(prompt_token_ids) AS n_prompt_suffix_tokens,
        len(completion_token_ids) AS n_completion_tokens,
        {_VERSIONS.format(spans="policy_versions")} AS policy_versions,
        finish_reason, usage.prompt_tokens AS usage_prompt_tokens,
        usage.completion_tokens AS usage_completion_tokens,
        usage.cached_tokens AS usage_cached_tokens, error, redacted,
        coalesce(image_ids, []) AS image_ids, fault, schema_version, date
    FROM {_COMPLETIONS}
    """,
    (
        ("event_id", "the call's idempotency key"),
        ("rollout_id", "the rollout the call belongs to"),
        ("call_index", "0-based position of the call in its rollout, as the proxy numbered it"),
        ("thread_id", "the harness's conversation thread, where it tells us"),
        ("parent_event_id", "the call that spawned this thread (a sub-agent)"),
        ("task_id", "the task of the rollout"),
        ("harness", "the harness that made the call"),
        ("harness_version", "its version"),
        ("dialect", f"the API dialect: {one_of(Dialect)}"),
        ("streamed", "whether the harness asked for a stream"),
        ("model", "the model name the harness asked for"),
        (
            "status",
            f"how the call ended: {one_of(CompletionStatus)}",
        ),
        (
            "continuity",
            f"how the prompt relates to the thread's previous call: {one_of(ContinuityClass)}",
        ),
        ("retry_of", "event id of the earlier attempt of the same call"),
        ("side_call", "outside the main thread (a title request, another model): never trained"),
        ("received_us", "when the proxy received the request"),
        ("first_token_us", "when the first token came back (null: none did)"),
        ("done_us", "when the call ended (null: it did not)"),
        ("time_to_first_token_ms", "first_token_us - received_us, in milliseconds"),
        ("duration_ms", "done_us - received_us, in milliseconds"),
        ("temperature", "sampling temperature sent upstream (null: the server's default)"),
        ("top_p", "nucleus sampling threshold sent upstream"),
        ("top_k", "top-k sent upstream"),
        ("max_tokens", "the cap on generated tokens sent upstream"),
        ("seed", "sampling seed sent upstream"),
        ("stop", "stop strings sent upstream"),
        ("prompt_length", "tokens of the full prompt"),
        (
            "prompt_ref_event_id",
            "delta form: the earlier call whose prompt + completion it extends",
        ),
        ("prompt_ref_tokens", "delta form: tokens taken from that call"),
        ("n_prompt_suffix_tokens", "prompt tokens stored in this event (the suffix, or all)"),
        ("n_completion_tokens", "generated tokens (rows of this call in `tokens`)"),
        ("policy_versions", "the distinct policy versions that generated its tokens, ascending"),
        ("finish_reason", "why generation stopped (stop, length, tool_calls, ...)"),
        ("usage_prompt_tokens", "prompt tokens as the engine reported them"),
        ("usage_completion_tokens", "generated tokens as the engine reported them"),
        ("usage_cached_tokens", "prompt tokens served from the engine's prefix cache"),
        ("error", "what went wrong, for a call that did not end ok"),
        (
            "redacted",
            "bodies left out (--no-bodies) or secrets redacted in its text (never token ids)",
        ),
        (
            "image_ids",
            "SHA-256 of each image in the prompt, in order (the bytes: the proxy's --image-dir)",
        ),
        (
            "fault",
            f"the fault the proxy injected into the call on purpose: {one_of(FaultKind)} (null: "
            "none; its status then says how it ended)",
        ),
        ("schema_version", "the record's schema version"),
        ("date", "archive partition: the UTC date of received_us"),
    ),
)

TOKENS = View(
    "tokens",
    "one row per generated token of a completion event, with its behavior logprob and policy "
    "version",
    f"""
    SELECT rollout_id, event_id, call_index, thread_id, task_id, harness, status, side_call,
        position, token_id, logprob,
        list_filter(policy_versions, lambda s: s.start <= position AND position < s."end")[1]
            .version AS policy_version
    FROM (
        SELECT rollout_id, event_id, call_index, thread_id, task_id, harness, status, side_call,
            policy_versions, generate_subscripts(completion_token_ids, 1) - 1 AS position,
            unnest(completion_token_ids) AS token_id, unnest(completion_logprobs) AS logprob
        FROM {_COMPLETIONS}
    )
    """,
    (
        ("rollout_id", "the rollout of the call"),
        ("event_id", "the completion event that generated the token"),
        ("call_index", "the call's position in its rollout"),
        ("thread_id", "the harness's conversation thread"),
        ("task_id", "the task of the rollout"),
        ("harness", "the harness that made the call"),
        ("status", "how the call ended (a failed attempt's tokens are never trained on)"),
        ("side_call", "the call was a side call (never trained on)"),
        ("position", "0-based position of the token in the call's completion"),
        ("token_id", "the engine's token id"),
        ("logprob", "the behavior logprob the engine reported for it (float32)"),
        ("policy_version", "the policy version that generated it (null: no span covers it)"),
    ),
)

ROLLOUTS = View(
    "rollouts",
    "one row per rollout lifecycle event (queued, started, finished, failed, timed_out, "
    "verified, infra_failed)",
    f"""
    SELECT event_id, rollout_id, phase, at_us, task_id, group_id, harness, harness_version,
        backend, exit_code, duration_s, calls, message, metadata, schema_version, date
    FROM {_unique("raw.rollout", "event_id")}
    """,
    (
        ("event_id", "the lifecycle event's id"),
        ("rollout_id", "the rollout"),
        ("phase", "queued, started, finished, failed, timed_out, verified or infra_failed"),
        ("at_us", "when the phase was reached"),
        ("task_id", "the task the rollout plays"),
        ("group_id", "the rollouts of one task compared with each other (GRPO group)"),
        ("harness", "the harness that plays it"),
        ("harness_version", "its version"),
        ("backend", "the rollout backend: local, kubernetes, ..."),
        ("exit_code", "the harness's exit code, for finished and failed"),
        ("duration_s", "seconds from the start to this phase"),
        ("calls", "terminal phases from the proxy: how many calls it numbered for the rollout"),
        ("message", "what went wrong, for failed, timed_out and infra_failed"),
        ("metadata", "free-form string pairs"),
        ("schema_version", "the record's schema version"),
        ("date", "archive partition: the UTC date of at_us"),
    ),
)

REWARDS = View(
    "rewards",
    "one row per reward event (a verifier's score of a rollout)",
    f"""
    SELECT event_id, rollout_id, task_id, reward, components, verifier, verifier_version,
        verifier_output, at_us, schema_version, date
    FROM {_unique("raw.reward", "event_id")}
    """,
    (
        ("event_id", "the reward event's id"),
        ("rollout_id", "the rollout it scores"),
        ("task_id", "the task of the rollout"),
        ("reward", "the scalar reward"),
        ("components", "named parts of the reward (map), e.g. {'tests': 1.0}"),
        ("verifier", "who judged it (name@version, or user)"),
        (
            "verifier_version",
            "null: the score recorded when the rollout ran; N: a re-score (`openforge replay "
            "rescore`); the episode's reward is the highest version's",
        ),
        ("verifier_output", "the verifier's log or explanation"),
        ("at_us", "when the reward was recorded"),
        ("schema_version", "the record's schema version"),
        ("date", "archive partition: the UTC date of at_us"),
    ),
)

EPISODES = View(
    "episodes",
    "one row per episode (a finished rollout assembled for training, or its dead letter)",
    f"""
    SELECT episode_id, rollout_id, task_id, group_id, harness, reward, reward_components,
        dead_letter, created_us, len(samples) AS n_samples, len(forks) AS n_forks,
        coalesce(list_sum(list_transform(samples, lambda s: len(s.token_ids))), 0)::BIGINT
            AS n_tokens,
        coalesce(list_sum(list_transform(samples, lambda s: coalesce(list_sum(s.loss_mask), 0))),
            0)::BIGINT AS n_generated_tokens,
        len(lineage) AS n_events,
        list_sort(list_distinct(flatten(list_transform(samples,
            lambda s: list_transform(s.policy_versions, lambda p: p.version))))) AS policy_versions,
        schema_version, date
    FROM {_EPISODES}
    """,
    (
        *_EPISODE_KEYS,
        ("reward", "the rollout's reward (null only for dead letters)"),
        ("reward_components", "named parts of the reward (map)"),
        ("dead_letter", "why the episode is not trainable (null: it is)"),
        ("created_us", "when the pipeline assembled it"),
        ("n_samples", "token sequences (rows in `samples`)"),
        ("n_forks", "where samples split off (rows in `forks`; the first sample's too)"),
        ("n_tokens", "tokens of all samples"),
        ("n_generated_tokens", "generated tokens of all samples (loss mask 1)"),
        ("n_events", "events it was assembled from (its lineage)"),
        ("policy_versions", "the distinct policy versions of its generated tokens, ascending"),
        ("schema_version", "the record's schema version"),
        ("date", "archive partition: the UTC date of created_us"),
    ),
)

SAMPLES = View(
    "samples",
    "one row per sample of an episode (one token sequence with its loss mask)",
    f"""
    SELECT episode_id, rollout_id, task_id, group_id, harness, reward, dead_letter,
        s.index AS sample_index, s.parent_index AS parent_index, s.fork_class AS fork_class,
        len(s.token_ids) AS n_tokens,
        coalesce(list_sum(s.loss_mask), 0)::BIGINT AS n_generated_tokens,
        len(s.event_ids) AS n_events, s.event_ids AS event_ids,
        {_VERSIONS.format(spans="s.policy_versions")} AS policy_versions
    FROM (SELECT *, unnest(samples) AS s FROM {_EPISODES})
    """,
    (
        *_EPISODE_KEYS,
        ("reward", "the episode's reward"),
        ("dead_letter", "why the episode is not trainable (null: it is)"),
        ("sample_index", "the sample's index in its episode"),
        ("parent_index", "the sample it forked from (null: a root)"),
        ("fork_class", "why it split off: first, rewritten, injected, dropped, compacted, ..."),
        ("n_tokens", "tokens of the sequence"),
        ("n_generated_tokens", "generated tokens (loss mask 1)"),
        ("n_events", "completion events merged into it"),
        ("event_ids", "those events, in call order"),
        ("policy_versions", "the distinct policy versions of its generated tokens, ascending"),
    ),
)

FORKS = View(
    "forks",
    "one row per fork: where a sample split off from its parent, at which call and why",
    f"""
    SELECT episode_id, rollout_id, task_id, group_id, harness, f.sample_index AS sample_index,
        f.parent_index AS parent_index, f.call_index AS call_index, f.mismatch AS mismatch,
        f.common_prefix AS common_prefix
    FROM (SELECT *, unnest(forks) AS f FROM {_EPISODES})
    """,
    (
        *_EPISODE_KEYS,
        ("sample_index", "the sample that starts here"),
        ("parent_index", "the sample it shares the longest prefix with (null: none, a root)"),
        ("call_index", "the call whose prompt diverged"),
        (
            "mismatch",
            "first (the first sample), unrelated (no shared history), rewritten, injected, "
            "dropped, compacted, retry",
        ),
        ("common_prefix", "tokens shared with the parent sample"),
    ),
)

STEPS = View(
    "steps",
    "one row per (training step, episode) the trainer consumed: the step's lineage and metrics",
    f"""
    SELECT step, e.episode_id AS episode_id, e.rollout_id AS rollout_id, e.task_id AS task_id,
        e.group_id AS group_id, e.reward AS reward, e.policy_versions AS policy_versions,
        e.topic AS log_topic, e."partition" AS log_partition, e."offset" AS log_offset,
        policy_version, at_us, metrics
    FROM (SELECT *, unnest(episodes) AS e FROM {_STEPS})
    UNION ALL BY NAME
    SELECT step, episode_id, metrics FROM raw.consumed
    WHERE step NOT IN (SELECT step FROM raw.step)
    """,
    (
        ("step", "the trainer's update number (1-based)"),
        ("episode_id", "an episode the update consumed (join `episodes` on it)"),
        ("rollout_id", "the rollout the episode was assembled from"),
        ("task_id", "the task of the rollout"),
        ("group_id", "its group (GRPO group)"),
        ("reward", "the episode's reward as trained on"),
        ("policy_versions", "the distinct policy versions of its generated tokens, ascending"),
        ("log_topic", "the event-log topic the trainer read the episode from (null: an archive)"),
        ("log_partition", "the topic's partition"),
        ("log_offset", "the record offset in that partition"),
        ("policy_version", "the version the update's weights were served as"),
        ("at_us", "when the update was done"),
        (
            "metrics",
            "the step's metrics (map), e.g. metrics['reward/mean'], metrics['actor/pg_loss']",
        ),
    ),
)

VIEWS: tuple[View, ...] = (
    COMPLETIONS,
    TOKENS,
    ROLLOUTS,
    REWARDS,
    EPISODES,
    SAMPLES,
    FORKS,
    STEPS,
    ROLLOUT_COSTS,
    STEP_COSTS,
)
