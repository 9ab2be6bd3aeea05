"""Which trainer process leads, when several train one model (torchrun, one per GPU).

The lead (rank 0) alone reads the episode stream, logs, commits positions and talks to vLLM and
the proxy; it hands each batch to the other ranks, and every rank runs the backend's collective
steps (update, export, checkpoint). One process is its own lead and nothing is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Ranks:
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        """The lead's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()
