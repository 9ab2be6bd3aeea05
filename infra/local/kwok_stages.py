"""What kwok's fake nodes do with pods: the kwok ``Stage`` configuration of :class:`LocalKube`.

kwok has no kubelet and runs nothing; stages rewrite a pod's status when a selector matches.
Upstream's node stages (ready, lease heartbeat) and pod-delete are used as they are; upstream's
``fast`` pod-ready and pod-complete apply to every pod except OpenForge rollout pods
(``openforge.dev/role: rollout``), which follow the container order the Kubernetes rollout
backend gives them (init containers, the last of which is ``agent``, then ``verifier``):

1. scheduled: the init containers before ``agent`` complete and ``agent`` runs, unless its image
   is :data:`MISSING_IMAGE`: then it waits in ``ErrImagePull`` (a registry without that image);
2. ``agent`` exits once the pod carries the annotation :data:`AGENT_MESSAGE` (what the agent's
   wrapper would write to its termination log), and ``verifier`` runs;
3. ``verifier`` exits once the pod carries :data:`VERIFIER_MESSAGE` (the reward file the
   verifier would write), and the pod succeeds.

A test (or a benchmark) plays the harness and the verifier by setting those annotations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROLE_LABEL = "openforge.dev/role"
AGENT_MESSAGE = "kwok.openforge.dev/agent-message"
VERIFIER_MESSAGE = "kwok.openforge.dev/verifier-message"
MISSING_IMAGE = "registry.invalid/openforge/missing:0"

UPSTREAM = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)

_AGENT_IMAGE = '.spec.initContainers.[] | select( .name == "agent" ) | .image'
_NOT_ROLLOUT = {"key": f'.metadata.labels["{ROLE_LABEL}"]', "operator": "DoesNotExist"}
_ROLLOUT = {"key": f'.metadata.labels["{ROLE_LABEL}"]', "operator": "In", "values": ["rollout"]}
_ALIVE = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}

_ADDRESSES = """\
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName false ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
startTime: {{ $now | Quote }}
"""  # noqa: E501


def _init_statuses(agent: str) -> str:
    """initContainerStatuses: those before ``agent`` completed, ``agent`` as given."""
    return (
        "initContainerStatuses:\n"
        "{{ range .spec.initContainers }}\n"
        "- image: {{ .image | Quote }}\n"
        "  name: {{ .name | Quote }}\n"
        "  restartCount: 0\n"
        '{{ if eq .name "agent" }}\n' + agent + "{{ else }}\n"
        "  ready: true\n"
        "  state:\n"
        "    terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, "
        "finishedAt: {{ $now | Quote }}}\n"
        "{{ end }}\n"
        "{{ end }}\n"
    )


def _verifier(state: str) -> str:
    return (
        "containerStatuses:\n"
        "{{ range .spec.containers }}\n"
        "- image: {{ .image | Quote }}\n"
        "  name: {{ .name | Quote }}\n"
        "  restartCount: 0\n" + state + "{{ end }}\n"
    )


def _message(annotation: str) -> str:
    return f'{{{{ index $.metadata.annotations "{annotation}" | Quote }}}}'


_AGENT_DONE = (
    "  ready: false\n"
    "  state:\n"
    "    terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, "
    f"finishedAt: {{{{ $now | Quote }}}}, message: {_message(AGENT_MESSAGE)}}}\n"
)


def _stage(name: str, selector: list[dict[str, Any]], template: str) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {"matchExpressions": [_ALIVE, _ROLLOUT, *selector]},
            "next": {"statusTemplate": "{{ $now := Now }}\n" + template},
        },
    }


_UNSCHEDULED_IP = [
    {"key": ".spec.nodeName", "operator": "Exists"},
    {"key": ".status.podIP", "operator": "DoesNotExist"},
]
_CONDITIONS = (
    "conditions:\n"
    "- {type: PodScheduled, status: 'True', lastTransitionTime: {{ $now | Quote }}}\n"
    "- {type: Initialized, status: '%s', lastTransitionTime: {{ $now | Quote }}}\n"
    "- {type: Ready, status: 'False', lastTransitionTime: {{ $now | Quote }}}\n"
)
_WAITING = "  ready: false\n  state:\n    waiting: {reason: PodInitializing}\n"
_RUNNING = (
    "  ready: true\n  started: true\n  state:\n    running: {startedAt: {{ $now | Quote }}}\n"
)


def _started_in(container: str, statuses: str) -> dict[str, str]:
    """A selector: ``container`` (in the pod's ``statuses`` list) has started running."""
    return {
        "key": f'.status.{statuses}.[] | select( .name == "{container}" ) '
        "| .state.running.startedAt",
        "operator": "Exists",
    }


def _start_stage() -> dict[str, Any]:
    """A scheduled pod whose images are there: its init containers start."""
    return _stage(
        "openforge-rollout-start",
        [*_UNSCHEDULED_IP, {"key": _AGENT_IMAGE, "operator": "NotIn", "values": [MISSING_IMAGE]}],
        "phase: Pending\n"
        + _ADDRESSES
        + _CONDITIONS % "False"
        + _init_statuses(
            "  ready: false\n  started: true\n  state:\n"
            "    running: {startedAt: {{ $now | Quote }}}\n"
        )
        + _verifier(_WAITING),
    )


def _image_missing_stage() -> dict[str, Any]:
    """A scheduled pod whose agent image no node has: it waits in ErrImagePull."""
    return _stage(
        "openforge-rollout-image-missing",
        [*_UNSCHEDULED_IP, {"key": _AGENT_IMAGE, "operator": "In", "values": [MISSING_IMAGE]}],
        "phase: Pending\n"
        + _ADDRESSES
        + _CONDITIONS % "False"
        + _init_statuses(
            "  ready: false\n  state:\n    waiting:\n      reason: ErrImagePull\n"
            '      message: {{ printf "failed to pull image %s: not found" .image | Quote }}\n'
        )
        + _verifier(_WAITING),
    )


def _agent_exit_stage() -> dict[str, Any]:
    """The agent's exit, once its message is there: the verifier runs."""
    return _stage(
        "openforge-rollout-agent-exit",
        [
            _started_in("agent", "initContainerStatuses"),
            {"key": f'.metadata.annotations["{AGENT_MESSAGE}"]', "operator": "Exists"},
        ],
        "phase: Running\n"
        + _CONDITIONS % "True"
        + _init_statuses(_AGENT_DONE)
        + _verifier(_RUNNING),
    )


def _verifier_exit_stage() -> dict[str, Any]:
    """The verifier's exit, once its message is there: the pod succeeded."""
    return _stage(
        "openforge-rollout-verifier-exit",
        [
            _started_in("verifier", "containerStatuses"),
            {"key": f'.metadata.annotations["{VERIFIER_MESSAGE}"]', "operator": "Exists"},
        ],
        "phase: Succeeded\n"
        + _CONDITIONS % "True"
        + _init_statuses(_AGENT_DONE)
        + _verifier(
            "  ready: false\n  state:\n    terminated: {exitCode: 0, reason: Completed, "
            "startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}, "
            f"message: {_message(VERIFIER_MESSAGE)}}}\n"
        ),
    )


def rollout_stages() -> list[dict[str, Any]]:
    """kwok's stages for a rollout pod, in the order a pod goes through them."""
    return [_start_stage(), _image_missing_stage(), _agent_exit_stage(), _verifier_exit_stage()]


def stages_yaml(upstream: Path) -> str:
    """The kwok configuration: upstream's stages from ``upstream`` (kwok's ``kustomize/stage``,
    copied by ``scripts/setup k8s``), rollout pods excluded from its pod stages, plus ours."""
    docs: list[dict[str, Any]] = []
    for rel in UPSTREAM:
        stage = yaml.safe_load((upstream / rel).read_text())
        if rel.startswith("pod/") and not rel.endswith("pod-delete.yaml"):
            stage["spec"]["selector"].setdefault("matchExpressions", []).append(_NOT_ROLLOUT)
        docs.append(stage)
    docs += rollout_stages()
    # kwok plays 4 pod stages at a time by default: a batch of hundreds of rollouts waits on it.
    # (A configuration file's options are not defaulted: every parallelism is given.)
    docs.insert(0, {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "podPlayStageParallelism": 64, "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4, "podsOnNodeSyncParallelism": 4,
            "enablePodsOnNodeSyncListPager": True, "enablePodsOnNodeSyncStreamWatch": False,
        },
    })  # fmt: skip
    return str(yaml.safe_dump_all(docs, sort_keys=False))
