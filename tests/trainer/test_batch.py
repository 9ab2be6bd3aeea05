"""Episodes to tensors and to veRL's DataProto (on CPU)."""

from __future__ import annotations

import torch

from schemas.completion import PolicySpan
from schemas.episode import Episode, Sample
from trainer.batch import to_batch, to_data_proto


def _episode(rid: str, tokens: list[int], mask: list[int], reward: float) -> Episode:
    lps = [-(i + 1) / 10 if m else 0.0 for i, m in enumerate(mask)]
    spans = [PolicySpan(4, i, i + 1) for i, m in enumerate(mask) if m]
    return Episode(f"ep-{rid}", rid, [Sample(0, tokens, mask, lps, spans)], reward, 0, task_id="t")


def test_batch_aligns_masks_logprobs_and_rewards() -> None:
    a = _episode("a", [1, 2, 3, 4, 5], [0, 0, 1, 1, 0], 1.0)  # generated 3, 4; then a tool token
    b = _episode("b", [1, 2, 9], [0, 1, 1], 0.0)
    batch = to_batch([a, b])
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 2, 9, 0, 0]]
    assert batch.response_mask.tolist() == [[0, 1, 1, 0], [1, 1, 0, 0]]
    assert torch.allclose(batch.behavior_logprobs[0], torch.tensor([0.0, -0.3, -0.4, 0.0]))
    assert batch.token_level_rewards.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]]
    assert list(batch.index) == ["t", "t"] and batch.min_policy_version == [4, 4]


def test_data_proto_splits_prompt_and_response() -> None:
    batch = to_batch(
        [
            _episode("a", [1, 2, 3, 4, 5], [0, 0, 1, 1, 0], 1.0),
            _episode("b", [7, 8, 9], [0, 1, 1], 0.5),
        ]
    )
    proto = to_data_proto(batch)
    t = proto.batch
    assert t["prompts"].tolist() == [[1, 2], [0, 7]]  # left-padded
    assert t["responses"].tolist() == [[3, 4, 5], [8, 9, 0]]  # right-padded
    assert t["response_mask"].tolist() == [[1, 1, 0], [1, 1, 0]]
    assert t["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 0]]
    assert torch.allclose(t["rollout_log_probs"][0], torch.tensor([-0.3, -0.4, 0.0]))
    assert t["token_level_rewards"].tolist() == [[0, 1, 0], [0, 0.5, 0]]
    assert list(proto.non_tensor_batch["uid"]) == ["t", "t"]
    assert len(proto.chunk(2)) == 2  # veRL's own operations work on it
