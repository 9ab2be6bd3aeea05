"""The closed vocabularies that records use. Stored as plain strings in Arrow."""

from __future__ import annotations

from enum import StrEnum


class Dialect(StrEnum):
    """The API dialect a harness spoke to the proxy."""

    CHAT = "chat"  # OpenAI Chat Completions
    RESPONSES = "responses"  # OpenAI Responses
    MESSAGES = "messages"  # Anthropic Messages


class CompletionStatus(StrEnum):
    """How a completion call ended, as the harness saw it."""

    OK = "ok"
    UPSTREAM_ERROR = "upstream_error"  # the model server answered with an error
    CLIENT_DISCONNECTED = "client_disconnected"  # the harness went away mid-stream
    TIMEOUT = "timeout"  # the upstream did not answer in time
    REJECTED = "rejected"  # refused by the proxy (limits, bad input) before reaching upstream


class ContinuityClass(StrEnum):
    """How a call's prompt relates to the previous call of the same thread.

    The same vocabulary names the mismatch class of a fork in an episode.
    """

    FIRST = "first"  # no earlier call in this thread
    EXACT = "exact"  # prompt = previous prompt + previous completion + newly rendered suffix
    RETRY = "retry"  # the same call again after a failed or abandoned attempt
    REWRITTEN = "rewritten"  # resent history differs (re-serialised arguments, rewritten ids)
    INJECTED = "injected"  # messages inserted into the resent history
    DROPPED = "dropped"  # messages removed from the resent history
    COMPACTED = "compacted"  # history replaced by a summary (context compaction)
    UNRELATED = "unrelated"  # no common history (a sub-agent or another thread)


class RolloutPhase(StrEnum):
    """A rollout's lifecycle step (new in rollout schema v2: queued, verified, infra_failed)."""

    QUEUED = "queued"  # planned by the orchestrator, waiting for a concurrency slot
    STARTED = "started"  # registered with the proxy: its key is minted
    FINISHED = "finished"  # the agent ended on its own, exit code 0
    FAILED = "failed"  # the agent ended on its own with an error
    TIMED_OUT = "timed_out"  # the agent was killed at its deadline
    VERIFIED = "verified"  # the verifier ran over the final workspace; the reward follows
    INFRA_FAILED = "infra_failed"  # the sandbox, proxy or verifier failed: not the agent's doing


# The agent's run is over: the episode can be assembled once the reward is there.
TERMINAL_PHASES = frozenset({RolloutPhase.FINISHED, RolloutPhase.FAILED, RolloutPhase.TIMED_OUT})
