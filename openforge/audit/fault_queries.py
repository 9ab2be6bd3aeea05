"""The saved query of the audit's injected-faults section (issue 53): each fault the proxy
injected on purpose (``completions.fault``), whether the harness retried it away before the
model saw anything (a later call of the rollout is a retry of it: ``retry_of``), and how the
rollouts it hit ended. Paste it into ``openforge query --run RUN``."""

from __future__ import annotations

from openforge.audit.queries import Query

# What became of a faulted call, as the section's chart stacks it.
FAULT_OUTCOMES = ("retried by the harness", "not retried")

INJECTED_FAULTS = Query(
    "injected_faults",
    "Injected faults, by harness and kind",
    "one row per harness and fault kind: the calls it hit, those the harness retried (its own "
    "retry loop absorbed the fault: the model never saw it) and those it did not (the harness "
    "gave the error to the model, or stopped), the retries they took, and the mean reward of "
    "the rollouts they hit",
    """
    WITH hit AS (
        SELECT event_id, rollout_id, coalesce(harness, '?') AS harness, fault
        FROM completions WHERE fault IS NOT NULL
    ), retried AS (
        SELECT retry_of AS event_id, count(*) AS retries FROM completions
        WHERE retry_of IS NOT NULL GROUP BY 1
    ), reward AS (
        SELECT rollout_id, arg_max(reward, at_us) AS reward FROM rewards GROUP BY 1
    )
    SELECT hit.harness, hit.fault AS kind, count(*) AS fired,
        count(*) FILTER (WHERE retried.retries > 0) AS "retried by the harness",
        count(*) FILTER (WHERE retried.retries IS NULL) AS "not retried",
        coalesce(sum(retried.retries), 0) AS retries,
        avg(reward.reward) AS mean_reward
    FROM hit LEFT JOIN retried USING (event_id) LEFT JOIN reward USING (rollout_id)
    GROUP BY 1, 2 ORDER BY 1, 2
    """,
)

FAULT_QUERIES: tuple[Query, ...] = (INJECTED_FAULTS,)
