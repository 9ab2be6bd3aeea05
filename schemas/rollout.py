"""RolloutEvent: a rollout's lifecycle (queued, started, finished, failed, timed out, verified,
infrastructure failure)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from schemas.enums import RolloutPhase


@dataclass(frozen=True, slots=True)
class RolloutEvent:
    event_id: str
    rollout_id: str
    phase: RolloutPhase
    at_us: int  # when this phase was reached, microseconds since the Unix epoch
    task_id: str | None = None
    group_id: str | None = None  # rollouts of one task that are compared (GRPO group)
    harness: str | None = None
    harness_version: str | None = None
    backend: str | None = None  # rollout backend: "local", "kubernetes", ...
    exit_code: int | None = None
    duration_s: float | None = None  # from start to this phase
    message: str | None = None  # what went wrong, for failed and timed out
    metadata: dict[str, str] = field(default_factory=dict)
    # Terminal phases from the proxy: how many calls it numbered for the rollout (each is
    # recorded as one completion event), so assembly knows when it has all of them.
    calls: int | None = None
    # verified (and infra_failed): what the attempt cost, by the names of COSTS (seconds,
    # CPU-seconds, MiB); a name is absent where the backend cannot measure it.
    costs: dict[str, float] = field(default_factory=dict)
    schema_version: int = 4  # v2: phases queued, verified, infra_failed; v3: calls; v4: costs

    SCHEMA_NAME = "rollout"


# ``RolloutEvent.metadata`` of an ``infra_failed`` attempt: "true" when the orchestrator plays the
# same sample again as a new attempt (a rollout id of its own). That attempt's episode takes this
# one's place in its group; this one is dead-lettered as superseded, not lost.
RETRIED = "retried"

# ``RolloutEvent.metadata`` of a ``started`` event: the seconds the rollout may take after it
# (its image build, its agent's deadlines, its verifier's), written by the orchestrator. Episode
# assembly waits that long, and then its lateness, for the rollout's reward: a harness may say
# nothing for minutes (a long test run, a slow start) and still be rewarded in time.
DEADLINE_S = "deadline_s"

ROLLOUT_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("at_us", pa.int64(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("harness", pa.string()),
        pa.field("harness_version", pa.string()),
        pa.field("backend", pa.string()),
        pa.field("exit_code", pa.int32()),
        pa.field("duration_s", pa.float64()),
        pa.field("message", pa.string()),
        pa.field("metadata", pa.map_(pa.string(), pa.string()), nullable=False),
        pa.field("calls", pa.int32()),
        pa.field("costs", pa.map_(pa.string(), pa.float64()), nullable=False),
    ]
)

# What a rollout's attempt cost (``RolloutEvent.costs``), each name with its meaning. The
# orchestrator measures the phases, the sandbox backend the CPU and memory (from its cgroup);
# the `rollout_costs` view of ``openforge query`` shows one column each.
COSTS: dict[str, str] = {
    "queued_s": "seconds waiting for a free slot: from the run's start (or, for a retry, its "
    "backoff's end) to the attempt's start",
    "prepare_s": "seconds from the attempt's start to asking for the agent's sandbox: "
    "registration with the proxy, the workspace laid out (the image's WORKDIR copied)",
    "agent_s": "seconds of the agent's sandbox, from asking for it to its end (its start included)",
    "agent_start_s": "seconds of agent_s before its command started: the sandbox's start (a "
    "container's layer, namespaces and cgroup)",
    "agent_cpu_s": "CPU-seconds of everything in the agent's sandbox (from its cgroup; a warm "
    "member's includes its start and preload before the claim)",
    "agent_warm": "1 when a warm pool's member, started ahead, ran the agent (its "
    "agent_start_s is then from the claim to the command's start), 0 when a cold sandbox did",
    "agent_peak_mib": "peak memory of the agent's sandbox, MiB (from its cgroup)",
    "save_s": "seconds saving the final workspace (for re-scoring)",
    "verifier_s": "seconds of the verifier's sandbox (every step's, for a multi-step task)",
    "verifier_start_s": "seconds of verifier_s before its command started (the sandbox's start)",
    "verifier_cpu_s": "CPU-seconds of everything in the verifier's sandbox (from its cgroup)",
    "verifier_peak_mib": "peak memory of the verifier's sandbox, MiB (from its cgroup)",
    "wall_s": "seconds of the attempt, from its start to its reward recorded",
    "ready_s": "seconds from the attempt's start to the harness's first model call at the proxy: "
    "registration, the workspace, the sandbox's start and the harness's own start-up (absent: "
    "it made no call)",
}
