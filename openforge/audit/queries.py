"""The saved queries of ``openforge audit``: each named, documented, and written over the views of
``openforge query`` (``openforge/query/catalog.py``), so that a user can paste any of them into
``openforge query --run RUN``.

Conventions: a rollout's reward is its latest reward event (a re-score supersedes the first);
a held-out rollout is one of an evaluation group (``openforge train`` names them
``<run>-eval-v<policy version>-<task>``); the one parameter, ``$step``, is the training step whose
lineage is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb


@dataclass(frozen=True)
class Query:
    """A saved query: its name, a title for the report, what one row is, and its SQL."""

    name: str
    title: str
    doc: str
    sql: str


# The latest reward of each rollout, with its rollout's task, group and harness where known.
_REWARD = """
    WITH reward AS (
        SELECT rollout_id, task_id, reward FROM rewards
        QUALIFY row_number() OVER (PARTITION BY rollout_id ORDER BY at_us DESC) = 1
    ), rollout AS (
        SELECT rollout_id, any_value(task_id) AS task_id, any_value(group_id) AS group_id,
            any_value(harness) AS harness
        FROM rollouts GROUP BY rollout_id
    ), scored AS (
        SELECT r.rollout_id, coalesce(r.task_id, o.task_id, e.task_id) AS task_id,
            coalesce(o.group_id, e.group_id) AS group_id,
            coalesce(o.harness, e.harness) AS harness, r.reward
        FROM reward r LEFT JOIN rollout o USING (rollout_id)
            LEFT JOIN (SELECT rollout_id, any_value(task_id) AS task_id,
                any_value(group_id) AS group_id, any_value(harness) AS harness
                FROM episodes GROUP BY rollout_id) e USING (rollout_id)
    )
"""
_HELDOUT = "regexp_matches(coalesce(group_id, ''), '-eval-v[0-9]+')"

# The policy version the trainer held before each step: the version after the previous step.
_STEP_VERSION = """
    WITH step_metrics AS (
        SELECT step, any_value(metrics) AS metrics FROM steps GROUP BY step
    ), held AS (
        SELECT step, coalesce(lag(metrics['policy/version']) OVER (ORDER BY step), 0)
            AS version
        FROM step_metrics
    )
"""


def _reward_by(column: str, what: str) -> Query:
    """Rewarded rollouts and their mean reward per value of ``column``."""
    return Query(
        f"reward_by_{what}",
        f"Reward by {what}",
        f"one row per {what}: its rewarded rollouts and their mean reward",
        _REWARD
        + f"""
        SELECT coalesce({column}, '?') AS {column}, count(*) AS rollouts,
            avg(reward) AS mean_reward
        FROM scored GROUP BY 1 ORDER BY 1
        """,
    )


QUERIES: tuple[Query, ...] = (
    Query(
        "train_reward_per_step",
        "Reward per training step",
        "one row per training step: the mean reward of the episodes it consumed",
        """
        SELECT s.step, count(*) AS episodes, avg(e.reward) AS mean_reward
        FROM steps s JOIN episodes e USING (episode_id)
        GROUP BY s.step ORDER BY s.step
        """,
    ),
    Query(
        "heldout_reward_per_version",
        "Held-out reward per policy version",
        "one row per evaluated policy version: the mean reward of its held-out rollouts "
        "(version N is the policy after N weight syncs)",
        _REWARD
        + f"""
        SELECT CAST(regexp_extract(group_id, '-eval-v([0-9]+)', 1) AS BIGINT) AS policy_version,
            count(*) AS rollouts, avg(reward) AS mean_reward
        FROM scored WHERE {_HELDOUT}
        GROUP BY 1 ORDER BY 1
        """,
    ),
    _reward_by("task_id", "task"),
    _reward_by("harness", "harness"),
    Query(
        "reward_by_policy_version",
        "Reward by policy version",
        "one row per policy version: the episodes with tokens it generated and their mean reward",
        """
        SELECT v AS policy_version, count(*) AS episodes, avg(reward) AS mean_reward
        FROM (SELECT reward, unnest(policy_versions) AS v FROM episodes
              WHERE dead_letter IS NULL)
        GROUP BY 1 ORDER BY 1
        """,
    ),
    Query(
        "continuity_by_harness",
        "Continuity classes per harness",
        "one row per (harness, continuity class) of the main-thread calls: how many calls",
        """
        SELECT coalesce(harness, '?') AS harness, continuity, count(*) AS calls
        FROM completions WHERE NOT side_call
        GROUP BY 1, 2 ORDER BY 1, 2
        """,
    ),
    Query(
        "fork_classes_by_harness",
        "Fork classes per harness",
        "one row per (harness, mismatch class) of the forks in episodes: how many forks",
        """
        SELECT coalesce(harness, '?') AS harness, mismatch, count(*) AS forks
        FROM forks GROUP BY 1, 2 ORDER BY 1, 2
        """,
    ),
    Query(
        "staleness",
        "Staleness of the trained episodes",
        "one row per policy-version lag: how many (step, episode) pairs trained with it (the "
        "trainer's version before the step minus the oldest version in the episode)",
        _STEP_VERSION
        + """
        SELECT CAST(h.version - list_min(e.policy_versions) AS BIGINT) AS lag,
            count(*) AS episodes
        FROM steps s JOIN held h USING (step) JOIN episodes e USING (episode_id)
        WHERE len(e.policy_versions) > 0
        GROUP BY 1 ORDER BY 1
        """,
    ),
    Query(
        "is_weights_per_step",
        "Importance-sampling weights per step",
        "one row per step: the min, mean and max truncated-IS weight of its tokens, as the "
        "trainer reported them (metrics rollout_corr/rollout_is_*)",
        """
        SELECT step, any_value(metrics['rollout_corr/rollout_is_min']) AS is_min,
            any_value(metrics['rollout_corr/rollout_is_mean']) AS is_mean,
            any_value(metrics['rollout_corr/rollout_is_max']) AS is_max
        FROM steps GROUP BY step
        HAVING is_mean IS NOT NULL ORDER BY step
        """,
    ),
    Query(
        "latency_by_dialect",
        "Latency percentiles per dialect",
        "one row per dialect: calls, and the 50th/90th/99th percentile of time to first token "
        "and of the call's duration, in milliseconds",
        """
        SELECT dialect, count(*) AS calls,
            quantile_cont(time_to_first_token_ms, 0.5) AS ttft_p50,
            quantile_cont(time_to_first_token_ms, 0.9) AS ttft_p90,
            quantile_cont(time_to_first_token_ms, 0.99) AS ttft_p99,
            quantile_cont(duration_ms, 0.5) AS p50,
            quantile_cont(duration_ms, 0.9) AS p90,
            quantile_cont(duration_ms, 0.99) AS p99
        FROM completions WHERE duration_ms IS NOT NULL
        GROUP BY 1 ORDER BY 1
        """,
    ),
    Query(
        "tool_calls",
        "Tool-call usage",
        "one row per (harness, tool): the tool calls the model made, read from the recorded "
        "responses (chat: choices[].message.tool_calls, responses: output[] function_call, "
        "messages: content[] tool_use); 'finish_reason=tool_calls' where bodies were not kept",
        """
        WITH c AS (
            SELECT harness, response_body AS body, finish_reason FROM raw.completion
            WHERE NOT side_call
            QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY date) = 1
        ), named AS (
            SELECT harness, unnest(list_concat(
                coalesce(json_extract_string(body,
                    '$.choices[*].message.tool_calls[*].function.name'), []),
                coalesce(list_filter(json_extract_string(body, '$.output[*].name'),
                    lambda x: x IS NOT NULL), []),
                coalesce(list_filter(json_extract_string(body, '$.content[*].name'),
                    lambda x: x IS NOT NULL), [])
            )) AS tool
            FROM c WHERE body IS NOT NULL AND json_valid(body)
            UNION ALL
            SELECT harness, 'finish_reason=tool_calls' FROM c
            WHERE body IS NULL AND finish_reason = 'tool_calls'
        )
        SELECT coalesce(harness, '?') AS harness, tool, count(*) AS calls
        FROM named WHERE tool IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2
        """,
    ),
    Query(
        "actions_per_rollout",
        "Actions per rollout",
        "one row per (harness, actions): how many rollouts made that many tool calls (the "
        "agent's actions: a browser agent's clicks and typing, a coding agent's commands), "
        "read from the recorded responses as for tool-call usage; a call whose body was not "
        "kept counts one action if it finished with tool calls",
        """
        WITH c AS (
            SELECT rollout_id, harness, response_body AS body, finish_reason FROM raw.completion
            WHERE NOT side_call
            QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY date) = 1
        ), counted AS (
            SELECT rollout_id, harness, CASE
                WHEN body IS NOT NULL AND json_valid(body) THEN len(list_concat(
                    coalesce(json_extract_string(body,
                        '$.choices[*].message.tool_calls[*].function.name'), []),
                    coalesce(list_filter(json_extract_string(body, '$.output[*].name'),
                        lambda x: x IS NOT NULL), []),
                    coalesce(list_filter(json_extract_string(body, '$.content[*].name'),
                        lambda x: x IS NOT NULL), [])))
                WHEN body IS NULL AND finish_reason = 'tool_calls' THEN 1
                ELSE 0 END AS actions
            FROM c
        ), per AS (
            SELECT rollout_id, any_value(harness) AS harness, sum(actions) AS actions
            FROM counted GROUP BY rollout_id
        )
        SELECT coalesce(harness, '?') AS harness, CAST(actions AS BIGINT) AS actions,
            count(*) AS rollouts
        FROM per GROUP BY 1, 2 ORDER BY 2, 1
        """,
    ),
    Query(
        "screenshots",
        "Screenshots of a rollout's steps",
        "one row per call that showed the model an image (a browser agent's screenshot): the "
        "newest image of its prompt (its SHA-256: the proxy's image store has the bytes), how "
        "many images the prompt held, and the actions the model answered with (tool calls with "
        "their arguments, read from the recorded response; null: the body was not kept)",
        """
        WITH c AS (
            SELECT rollout_id, task_id, harness, call_index, image_ids, response_body AS body
            FROM raw.completion WHERE len(coalesce(image_ids, [])) > 0
            QUALIFY row_number() OVER (PARTITION BY event_id ORDER BY date) = 1
        )
        SELECT rollout_id, task_id, harness, call_index,
            image_ids[len(image_ids)] AS screenshot, len(image_ids) AS images_in_prompt,
            CASE WHEN body IS NOT NULL AND json_valid(body) THEN array_to_string(list_concat(
                coalesce(list_transform(
                    json_extract(body, '$.choices[*].message.tool_calls[*].function'),
                    lambda f: json_extract_string(f, '$.name') || ' '
                        || coalesce(json_extract_string(f, '$.arguments'), '')), []),
                coalesce(list_transform(list_filter(json_extract(body, '$.output[*]'),
                        lambda o: json_extract_string(o, '$.type') = 'function_call'),
                    lambda o: json_extract_string(o, '$.name') || ' '
                        || coalesce(json_extract_string(o, '$.arguments'), '')), []),
                coalesce(list_transform(list_filter(json_extract(body, '$.content[*]'),
                        lambda b: json_extract_string(b, '$.type') = 'tool_use'),
                    lambda b: json_extract_string(b, '$.name') || ' '
                        || coalesce(CAST(json_extract(b, '$.input') AS VARCHAR), '')), [])
            ), '; ') END AS actions
        FROM c ORDER BY rollout_id, call_index
        """,
    ),
    Query(
        "rollouts_without_reward",
        "Rollouts without a reward",
        "one row per rollout that has lifecycle events but no reward event: its last phase and "
        "what went wrong",
        """
        SELECT rollout_id, any_value(task_id) AS task_id, any_value(harness) AS harness,
            arg_max(phase, at_us) AS last_phase, arg_max(message, at_us) AS message,
            max(calls) AS calls
        FROM rollouts WHERE rollout_id NOT IN (SELECT rollout_id FROM rewards)
        GROUP BY rollout_id ORDER BY rollout_id
        """,
    ),
    Query(
        "dead_letters",
        "Dead letters",
        "one row per episode the pipeline could not make trainable: why",
        """
        SELECT rollout_id, task_id, harness, dead_letter
        FROM episodes WHERE dead_letter IS NOT NULL ORDER BY rollout_id
        """,
    ),
    Query(
        "promotions",
        "Safe promotion: held-out checks of each candidate",
        "one row per promotion check: the judge's held-out score of the candidate and of the "
        "policy served then, whether the candidate was served, and the version served after "
        "the check (metrics promotion/*)",
        """
        SELECT step, any_value(metrics['promotion/candidate_score']) AS candidate_score,
            any_value(metrics['promotion/served_score']) AS served_score,
            any_value(metrics['promotion/promoted']) = 1 AS promoted,
            any_value(policy_version) AS policy_version
        FROM steps GROUP BY step
        HAVING any_value(metrics['promotion/checked']) = 1 ORDER BY step
        """,
    ),
    Query(
        "step_lineage",
        "Lineage of a training step",
        "one row per episode the step consumed: its rollout, task, group, harness, policy "
        "versions, reward and generated tokens",
        """
        SELECT s.step, e.episode_id, e.rollout_id, e.task_id, e.group_id, e.harness,
            e.policy_versions, e.reward, e.n_generated_tokens
        FROM steps s JOIN episodes e USING (episode_id)
        WHERE s.step = $step ORDER BY e.task_id, e.rollout_id
        """,
    ),
)

BY_NAME = {q.name: q for q in QUERIES}


@dataclass(frozen=True)
class Result:
    """A query's result: its column names and rows."""

    query: Query
    columns: list[str]
    rows: list[tuple[Any, ...]]

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]


def last_step(con: duckdb.DuckDBPyConnection) -> int | None:
    """The last training step in ``steps`` (None: the run trained nothing)."""
    ((last,),) = con.execute("SELECT max(step) FROM steps").fetchall()
    return None if last is None else int(last)


def run(con: duckdb.DuckDBPyConnection, query: Query, step: int | None = None) -> Result:
    """Run one saved query (``$step``: ``step``, or none for a run without steps)."""
    params = {"step": step if step is not None else -1} if "$step" in query.sql else None
    cursor = con.execute(query.sql, params)
    columns = [d[0] for d in cursor.description or []]
    return Result(query, columns, [tuple(r) for r in cursor.fetchall()])


def run_all(
    con: duckdb.DuckDBPyConnection, step: int | None = None, queries: tuple[Query, ...] = ()
) -> dict[str, Result]:
    """Every saved query, and ``queries``, by name."""
    return {q.name: run(con, q, step) for q in (*QUERIES, *queries)}
