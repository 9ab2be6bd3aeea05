"""The cost views of ``openforge query``: what each rollout and each training step cost.

``rollout_costs`` joins a rollout's ``verified`` lifecycle event (the costs its orchestrator
measured: :data:`schemas.rollout.COSTS`) with its calls (tokens, the time the harness waited on
the model), its first reward, its episode and the update that consumed it. ``step_costs`` reads
the trainer's own timings from each step's metrics. Both read the other documented views, so
they deduplicate as those do.
"""

from __future__ import annotations

from openforge.query.view import STEP_RECORDS, View, unique
from schemas.rollout import COSTS

# Per-step metrics the trainer records (trainer/loop.py), by the column that shows each.
STEP_METRICS: dict[str, tuple[str, str]] = {
    "compute_s": (
        "time/step_s",
        "seconds the update itself took (forward, backward, optimizer) on its device",
    ),
    "wait_s": ("time/wait_s", "seconds the trainer waited for the update's episodes"),
    "sync_s": ("sync/seconds", "seconds handing the new weights to the engine (null: no sync)"),
    "engine_busy": (
        "engine/busy_fraction",
        "fraction of the time since the previous update the engine had a request running "
        "(sampled from vLLM's metrics; null: not sampled)",
    ),
}

_COST_COLUMNS = ",\n        ".join(f"v.costs['{name}'] AS {name}" for name in COSTS)

ROLLOUT_COSTS = View(
    "rollout_costs",
    "one row per verified rollout: what its attempt cost, phase by phase, and its tokens",
    f"""
    WITH v AS (
        SELECT * FROM {unique("raw.rollout", "event_id")} WHERE phase = 'verified'
        QUALIFY row_number() OVER (PARTITION BY rollout_id ORDER BY at_us DESC) = 1
    ), calls AS (
        SELECT rollout_id, count(*) AS calls, sum(prompt_length)::BIGINT AS tokens_in,
            sum(n_completion_tokens)::BIGINT AS tokens_out,
            coalesce(sum(duration_ms), 0) / 1000.0 AS model_s
        FROM completions GROUP BY rollout_id
    ), first_reward AS (
        SELECT rollout_id, min(at_us) AS reward_us FROM rewards
        WHERE verifier_version IS NULL GROUP BY rollout_id
    ), episode AS (
        SELECT rollout_id, episode_id, created_us FROM episodes WHERE dead_letter IS NULL
    ), consumed AS (
        SELECT episode_id, min(step) AS step, min(at_us) AS update_us FROM steps
        WHERE at_us IS NOT NULL GROUP BY episode_id
    )
    SELECT v.rollout_id, v.task_id, v.group_id, v.harness, v.backend, v.at_us AS verified_us,
        {_COST_COLUMNS},
        coalesce(calls.calls, 0) AS calls, coalesce(calls.tokens_in, 0) AS tokens_in,
        coalesce(calls.tokens_out, 0) AS tokens_out, coalesce(calls.model_s, 0) AS model_s,
        greatest(v.costs['agent_s'] - coalesce(calls.model_s, 0), 0) AS harness_s,
        (episode.created_us - first_reward.reward_us) / 1e6 AS reward_to_episode_s,
        consumed.step AS step,
        (consumed.update_us - episode.created_us) / 1e6 AS episode_to_update_s
    FROM v
    LEFT JOIN calls USING (rollout_id)
    LEFT JOIN first_reward USING (rollout_id)
    LEFT JOIN episode USING (rollout_id)
    LEFT JOIN consumed ON consumed.episode_id = episode.episode_id
    """,
    (
        ("rollout_id", "the rollout (its verified attempt)"),
        ("task_id", "the task it played"),
        ("group_id", "its group (GRPO group)"),
        ("harness", "the harness that played it"),
        ("backend", "the rollout backend: local, kubernetes, ..."),
        ("verified_us", "when it was verified"),
        *COSTS.items(),
        ("calls", "model calls the proxy recorded for it"),
        ("tokens_in", "prompt tokens of its calls (each call's full prompt)"),
        ("tokens_out", "tokens generated for it"),
        ("model_s", "seconds its calls took at the proxy: the harness waiting on the model"),
        ("harness_s", "agent_s - model_s: the harness's own time, its tools included"),
        ("reward_to_episode_s", "seconds from its first reward to its episode assembled"),
        ("step", "the update that consumed its episode (null: none yet)"),
        ("episode_to_update_s", "seconds from its episode to that update"),
    ),
)

_METRIC_COLUMNS = ",\n        ".join(
    f"metrics['{metric}'] AS {column}" for column, (metric, _) in STEP_METRICS.items()
)

STEP_COSTS = View(
    "step_costs",
    "one row per training step: where the trainer's time went",
    f"""
    SELECT step, policy_version, at_us, len(episodes) AS episodes,
        CASE metrics['device/gpu'] WHEN 1 THEN 'gpu' WHEN 0 THEN 'cpu' END AS device,
        {_METRIC_COLUMNS},
        (at_us - lag(at_us) OVER (ORDER BY step)) / 1e6 AS since_previous_s
    FROM {STEP_RECORDS}
    """,
    (
        ("step", "the trainer's update number (1-based)"),
        ("policy_version", "the version its weights were served as"),
        ("at_us", "when the update was done"),
        ("episodes", "episodes it consumed"),
        ("device", "where the update ran: cpu or gpu (null: a trainer that did not say)"),
        *((column, doc) for column, (_, doc) in STEP_METRICS.items()),
        ("since_previous_s", "seconds since the previous update (null for the first)"),
    ),
)
