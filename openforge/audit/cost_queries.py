"""The saved queries of the audit's cost and utilisation sections, over ``rollout_costs`` and
``step_costs`` (``openforge/query/cost_views.py``): paste any of them into
``openforge query --run RUN``."""

from __future__ import annotations

from openforge.audit.queries import Query

# Phases of a rollout in the order they happen, as the cost chart stacks them.
PHASES = ("queued_s", "prepare_s", "model_s", "harness_s", "save_s", "verifier_s")

_MEANS = ", ".join(
    f"avg({c}) AS {c}"
    for c in (
        *PHASES,
        "agent_s",
        "wall_s",
        "agent_cpu_s",
        "agent_peak_mib",
        "verifier_cpu_s",
        "reward_to_episode_s",
        "episode_to_update_s",
    )
)

COST_QUERIES: tuple[Query, ...] = (
    Query(
        "cost_per_rollout",
        "Cost per rollout, by harness (means)",
        "one row per harness: its verified rollouts, the mean seconds of each phase (queued, "
        "prepare, the agent waiting on the model and running itself and its tools, the final "
        "workspace saved, the verifier), the whole attempt, CPU-seconds and peak MiB of the "
        "agent's sandbox, the verifier's CPU-seconds, calls and tokens, the path from reward "
        "to episode to update, and the time from an attempt's start to the harness's first model "
        "call (agent ready: median and 90th percentile)",
        f"""
        SELECT coalesce(harness, '?') AS harness, count(*) AS rollouts, {_MEANS},
            median(ready_s) AS ready_p50_s, quantile_cont(ready_s, 0.9) AS ready_p90_s,
            avg(calls) AS calls, avg(tokens_in) AS tokens_in, avg(tokens_out) AS tokens_out
        FROM rollout_costs GROUP BY 1 ORDER BY 1
        """,
    ),
    Query(
        "step_costs",
        "Where the trainer's time went, per step",
        "one row per training step: seconds computing the update, waiting for its episodes, "
        "handing the weights to the engine, and the fraction of the time the engine was busy",
        """
        SELECT step, policy_version, episodes, device, compute_s, wait_s, sync_s, engine_busy,
            since_previous_s
        FROM step_costs ORDER BY step
        """,
    ),
    Query(
        "timeline",
        "Timeline of the run",
        "one row per interval: each verified rollout (train or held-out evaluation, from its "
        "attempt's start to its verification), each update's compute and each weight sync; "
        "seconds from the run's first instant",
        """
        WITH spans AS (
            SELECT CASE WHEN regexp_matches(coalesce(group_id, ''), '-eval-v[0-9]+')
                    THEN 'evaluation' ELSE 'rollout' END AS kind,
                rollout_id AS label, verified_us - wall_s * 1e6 AS start_us,
                verified_us::DOUBLE AS end_us
            FROM rollout_costs WHERE wall_s IS NOT NULL
            UNION ALL
            SELECT 'update', 'step ' || step,
                at_us - (coalesce(sync_s, 0) + compute_s) * 1e6, at_us - coalesce(sync_s, 0) * 1e6
            FROM step_costs WHERE compute_s IS NOT NULL
            UNION ALL
            SELECT 'sync', 'v' || policy_version, at_us - sync_s * 1e6, at_us::DOUBLE
            FROM step_costs WHERE sync_s IS NOT NULL
        )
        SELECT kind, label, (start_us - min(start_us) OVER ()) / 1e6 AS start_s,
            (end_us - min(start_us) OVER ()) / 1e6 AS end_s
        FROM spans ORDER BY start_s, kind, label
        """,
    ),
)
