"""Episodes to training tensors, and to veRL's ``DataProto``.

Each sample becomes one row. Per-token tensors cover positions 1..T-1 of the sample (the token at
position t is predicted from positions < t): ``response_mask`` is the loss mask (1 on generated
tokens), ``behavior_logprobs`` the engine's logprobs, ``token_level_rewards`` the episode's reward
on the sample's last generated token. ``index`` holds each row's group (task) for GRPO/RLOO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from schemas.episode import Episode


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [B, T] right-padded
    attention_mask: torch.Tensor  # [B, T]
    response_mask: torch.Tensor  # [B, T-1] float
    behavior_logprobs: torch.Tensor  # [B, T-1] float32
    token_level_rewards: torch.Tensor  # [B, T-1]
    index: np.ndarray  # [B] group ids
    episode_ids: list[str]
    min_policy_version: list[int]  # per row: the oldest policy that generated its tokens
    image_ids: list[list[str]] | None = None  # per row: its images (None: no row has any)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def tokens(self) -> int:
        return int(self.attention_mask.sum().item())

    def metrics(self, trainer_logprobs: torch.Tensor) -> dict[str, float]:
        """Size metrics, and the mean behavior/trainer logprob gap on generated tokens."""
        gen = self.response_mask.bool()
        gap = (trainer_logprobs - self.behavior_logprobs)[gen]
        return {
            "actor/behavior_kl": float(gap.mean()) if gen.any() else 0.0,
            "data/tokens": self.tokens(),
            "data/generated_tokens": int(self.response_mask.sum()),
            "data/rows": self.size,
        }

    def rows(self, index: list[int]) -> TrainBatch:
        """The batch of just these rows, in this order."""
        return TrainBatch(
            input_ids=self.input_ids[index],
            attention_mask=self.attention_mask[index],
            response_mask=self.response_mask[index],
            behavior_logprobs=self.behavior_logprobs[index],
            token_level_rewards=self.token_level_rewards[index],
            index=self.index[index],
            episode_ids=[self.episode_ids[i] for i in index],
            min_policy_version=[self.min_policy_version[i] for i in index],
            image_ids=[self.image_ids[i] for i in index] if self.image_ids else None,
        )

    def images_of(self, row: int) -> list[str]:
        """The images of row ``row`` (empty for a text-only row)."""
        return self.image_ids[row] if self.image_ids else []


def group_key(episode: Episode) -> str:
    return episode.group_id or episode.task_id or episode.rollout_id


def to_batch(episodes: list[Episode], pad_id: int = 0) -> TrainBatch:
    rows = [(e, s) for e in episodes for s in e.samples if any(s.loss_mask)]
    if not rows:
        raise ValueError("no sample with generated tokens in these episodes")
    length = max(len(s.token_ids) for _, s in rows)
    b = len(rows)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention = torch.zeros((b, length), dtype=torch.long)
    mask = torch.zeros((b, length - 1))
    behavior = torch.zeros((b, length - 1))
    rewards = torch.zeros((b, length - 1))
    versions = []
    for i, (episode, sample) in enumerate(rows):
        n = len(sample.token_ids)
        input_ids[i, :n] = torch.tensor(sample.token_ids)
        attention[i, :n] = 1
        mask[i, : n - 1] = torch.tensor(sample.loss_mask[1:], dtype=torch.float32)
        behavior[i, : n - 1] = torch.tensor(sample.behavior_logprobs[1:], dtype=torch.float32)
        last = int(mask[i].nonzero().max().item())
        rewards[i, last] = float(episode.reward or 0.0)
        versions.append(min((span.version for span in sample.policy_versions), default=0))
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_mask=mask,
        behavior_logprobs=behavior,
        token_level_rewards=rewards,
        index=np.array([group_key(e) for e, _ in rows], dtype=object),
        episode_ids=[e.episode_id for e, _ in rows],
        min_policy_version=versions,
        image_ids=[list(s.image_ids) for _, s in rows]
        if any(s.image_ids for _, s in rows)
        else None,
    )


@dataclass(frozen=True)
class ResponseLayout:
    """Where each row's response starts and ends, for veRL's prompt/response split."""

    firsts: list[int]  # index of each row's first generated token
    lengths: list[int]  # tokens in each row
    prompt_len: int
    response_len: int

    @classmethod
    def of(cls, batch: TrainBatch) -> ResponseLayout:
        rows = batch.size
        firsts = [int(batch.response_mask[i].nonzero().min().item()) + 1 for i in range(rows)]
        lengths = [int(batch.attention_mask[i].sum().item()) for i in range(rows)]
        r_len = max(n - f for n, f in zip(lengths, firsts, strict=True))
        return cls(firsts, lengths, max(firsts), r_len)

    def to_response(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[B, T-1]`` per-token values (indexed by predicted position - 1) to ``[B, R]``."""
        out = torch.zeros((len(self.firsts), self.response_len), dtype=tensor.dtype)
        for i, (first, n) in enumerate(zip(self.firsts, self.lengths, strict=True)):
            out[i, : n - first] = tensor[i, first - 1 : n - 1]
        return out

    def from_response(self, tensor: torch.Tensor, width: int) -> torch.Tensor:
        """The inverse of :meth:`to_response`; positions before the response are 0."""
        out = torch.zeros((len(self.firsts), width), dtype=tensor.dtype)
        for i, (first, n) in enumerate(zip(self.firsts, self.lengths, strict=True)):
            out[i, first - 1 : n - 1] = tensor[i, : n - first]
        return out


def to_data_proto(batch: TrainBatch, extra: dict[str, torch.Tensor] | None = None) -> Any:
    """The batch as veRL's ``DataProto``, split into prompt and response the way veRL's actor
    expects: the prompt is everything before a row's first generated token, left-padded; the
    response is the rest, right-padded, with ``response_mask`` marking generated tokens.

    ``extra`` adds per-token tensors in this module's ``[B, T-1]`` layout (``old_log_probs``,
    ``advantages``, ``rollout_is_weights``, a corrected ``response_mask``...), converted to the
    response layout."""
    from verl import DataProto

    layout = ResponseLayout.of(batch)
    rows, p_len, r_len = batch.size, layout.prompt_len, layout.response_len
    prompts = torch.zeros((rows, p_len), dtype=torch.long)
    responses = torch.zeros((rows, r_len), dtype=torch.long)
    attention = torch.zeros((rows, p_len + r_len), dtype=torch.long)
    for i, (first, n) in enumerate(zip(layout.firsts, layout.lengths, strict=True)):
        ids = batch.input_ids[i, :n]
        prompts[i, p_len - first :] = ids[:first]
        responses[i, : n - first] = ids[first:]
        attention[i, p_len - first : p_len + n - first] = 1
    position_ids = torch.clamp(torch.cumsum(attention, dim=-1) - 1, min=0)
    per_token = {
        "response_mask": batch.response_mask,
        "rollout_log_probs": batch.behavior_logprobs,
        "token_level_rewards": batch.token_level_rewards,
        **(extra or {}),
    }
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=-1),
            "attention_mask": attention,
            "position_ids": position_ids,
            **{k: layout.to_response(v) for k, v in per_token.items()},
        },
        non_tensors={"uid": batch.index, "episode_id": np.array(batch.episode_ids, dtype=object)},
    )
