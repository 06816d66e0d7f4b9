"""Training stage plumbing: the process group and device mesh the policy workers shard over.

Under `torchrun` the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...)
is used; a plain `python` process starts a one-rank group on an in-memory store, so the single
CPU or single GPU case runs the same FSDP2 code as the multi-rank one.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass(frozen=True)
class DistributedContext:
    """Where this process sits in the data-parallel group."""

    rank: int
    world_size: int
    device: torch.device
    mesh: DeviceMesh  # 1-D mesh named "dp" over all ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _resolve_device(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device} was requested but CUDA is not available; use device='cpu'")
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda[:index]', got {device}")
    return device


def init_distributed(device: str | torch.device) -> DistributedContext:
    """Join (or start) the default process group and build the data-parallel mesh."""
    resolved = _resolve_device(device)
    backend = "nccl" if resolved.type == "cuda" else "gloo"
    if not dist.is_initialized():
        if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
            dist.init_process_group(backend=backend)
        else:
            # Not launched by torchrun: a one-rank group needs no rendezvous address.
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    world_size = dist.get_world_size()
    mesh = init_device_mesh(resolved.type, (world_size,), mesh_dim_names=("dp",))
    return DistributedContext(rank=dist.get_rank(), world_size=world_size, device=resolved, mesh=mesh)


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Element-wise sum of `values` over all ranks (a copy; the input is untouched)."""
    reduced = values.clone()
    if dist.get_world_size() > 1:
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    return reduced


def all_gather_rows(local: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's [K, ...] tensor along dim 0, in rank order (K equal on all ranks)."""
    world_size = dist.get_world_size()
    if world_size == 1:
        return local
    gathered = torch.empty(
        (world_size * local.shape[0], *local.shape[1:]), dtype=local.dtype, device=local.device
    )
    # all_gather_single replaces all_gather_into_tensor in newer torch; older ones only have the latter.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(gathered, local.contiguous())
    return gathered


def barrier() -> None:
    """Wait for every rank (no-op with one rank)."""
    if dist.get_world_size() > 1:
        dist.barrier()


def all_gather_lists(local: list) -> list:
    """Concatenate every rank's Python list, in rank order (any picklable items; lists may differ in length)."""
    world_size = dist.get_world_size()
    if world_size == 1:
        return list(local)
    gathered: list[list] = [[] for _ in range(world_size)]
    dist.all_gather_object(gathered, local)
    return [item for part in gathered for item in part]


def exit_rank(status: int) -> NoReturn:
    """End this process with `status`; a rank of a multi-rank group leaves the group first.

    Such a rank then exits without interpreter shutdown, once the standard streams, logging and
    the `atexit` handlers are done. gloo's worker threads can still be releasing the tensors of
    the last collective when the main thread finishes, and a worker that needs the interpreter
    lock while the interpreter finalizes aborts the whole process ("terminate called without an
    active exception", SIGABRT): torchrun then reports a failed rank for a run that finished.
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        sys.exit(status)
    dist.destroy_process_group()
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
