"""Device choice and the torchrun / DistributedDataParallel context.

Under ``torchrun`` the environment carries RANK, LOCAL_RANK and WORLD_SIZE; every rank joins
the process group (NCCL on GPUs, gloo on CPUs), a world of one included, so that
``torchrun --nproc_per_node=1`` runs the DDP path. A plain ``python train.py`` is a world of one
without a group.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from seq2seq.device import select_device

log = logging.getLogger(__name__)


@dataclass
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    in_group: bool = False  # joined a process group (launched by torchrun)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.in_group or self.world_size > 1

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()

    def _collective_device(self) -> torch.device:
        # NCCL reduces CUDA tensors, gloo CPU ones.
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def broadcast(self, value: float) -> float:
        """Rank 0's ``value`` on every rank, so all ranks take the same decisions."""
        if not self.is_distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self._collective_device())
        dist.broadcast(tensor, src=0)
        return float(tensor.item())

    def sum(self, value: int) -> int:
        """The sum of ``value`` over all ranks."""
        if not self.is_distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self._collective_device())
        dist.all_reduce(tensor)
        return int(tensor.item())

    def ranks_differing(self, parameters) -> list[int]:
        """The ranks whose ``parameters`` differ from rank 0's (a DDP bug if any)."""
        if not self.is_distributed:
            return []
        flat = torch.cat([p.detach().reshape(-1).float() for p in parameters])
        flat = flat.to(self._collective_device())
        gathered = [torch.empty_like(flat) for _ in range(self.world_size)]
        dist.all_gather(gathered, flat)
        return [rank for rank, other in enumerate(gathered) if not torch.equal(other, gathered[0])]


def init_distributed(device_name: str = "auto") -> DistributedContext:
    """Join the process group when launched by torchrun; otherwise a single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = select_device(device_name, local_rank=local_rank)
    # torchrun sets TORCHELASTIC_RUN_ID; a world of one under it still takes the DDP path.
    in_group = world_size > 1 or "TORCHELASTIC_RUN_ID" in os.environ
    if in_group and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
        log.info("rank %d of %d joined the %s process group", rank, world_size, backend)
    return DistributedContext(rank=rank, world_size=world_size, device=device, in_group=in_group)


def cleanup_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
