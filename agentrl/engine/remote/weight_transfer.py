"""Weight sync stage, over a process group: the trainer broadcasts the policy's tensors to engine processes.

`engine.weight_sync=distributed` moves weights without a checkpoint on disk. Both ends use this
module: the trainer (`weight_sender`) and the built-in server (`agentrl.engine.serve.weight_receiver`).

- The group is SGLang's weights-update group: the trainer is rank 0 and hosts the rendezvous
  store at `master_address:master_port`; engine process i joins as `rank_offset + i`. Its keys
  are laid out as SGLang's `init_custom_process_group` (python/sglang/srt/utils/common.py, called
  from model_executor/model_runner_components/weight_updater.py `init_weights_update_group`)
  and torch's `_new_process_group_helper` lay them out (a `group_name` prefix, a `group_name/`
  prefix, then one `device/` prefix per device the backend serves), so a trainer using this
  module can join a real SGLang server's group.
- It is built from public torch classes (`TCPStore`, `PrefixStore`, `ProcessGroupGloo`,
  `ProcessGroupNCCL`) and never registered with `torch.distributed`: the trainer's own default
  group (FSDP2, set up by torchrun or Ray) is neither needed nor touched, and an engine process
  needs none. NCCL for CUDA tensors, gloo for CPU tensors.
- A bucket is SGLang's `load_format="flattened_bucket"` (python/sglang/srt/weight_sync/
  tensor_bucket.py `FlattenedTensorBucket`): the bytes of several tensors concatenated in request
  order, each starting at an offset its dtype's item size divides; one broadcast per bucket.
  Without a load format, one broadcast per tensor, as SGLang's `receive_weights_from_distributed`.
- Every collective has a deadline; past it, `WeightSyncTimeout` names the route, the bytes and
  the deadline, and the group is aborted (a collective that timed out leaves it unusable).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from agentrl.engine.remote.sglang_protocol import EngineRequestError

DEFAULT_GROUP_NAME = "weight_update_group"  # SGLang's default group_name
FLATTENED_BUCKET = "flattened_bucket"  # SGLang's load_format for one broadcast per bucket


class WeightSyncError(EngineRequestError):
    """A weight transfer failed: a peer left the group, or refused or failed the request."""


class WeightSyncTimeout(WeightSyncError):
    """A weight transfer did not finish within its deadline (a peer that never joined or hangs)."""

    def __init__(self, route: str, num_bytes: int, deadline_s: float, detail: str) -> None:
        super().__init__(
            f"{route}: {num_bytes} bytes not transferred within the {deadline_s:g} s deadline "
            f"(engine.weight_sync_timeout_s): {detail}"
        )
        self.route = route
        self.num_bytes = num_bytes
        self.deadline_s = deadline_s


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a bucket, as the request names it."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def num_bytes(self) -> int:
        return self.dtype.itemsize * int(torch.Size(self.shape).numel())


@dataclass(frozen=True)
class Bucket:
    """Tensors sent together in one `/update_weights_from_distributed` request."""

    specs: tuple[TensorSpec, ...]

    @property
    def num_bytes(self) -> int:
        return sum(spec.num_bytes for spec in self.specs)

    def wire_fields(self) -> dict[str, list]:
        """`names`, `dtypes`, `shapes` as SGLang's `UpdateWeightsFromDistributedReqInput` spells them."""
        return {
            "names": [spec.name for spec in self.specs],
            "dtypes": [dtype_name(spec.dtype) for spec in self.specs],
            "shapes": [list(spec.shape) for spec in self.specs],
        }


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    """`torch.<name>` for a dtype name of the wire ('bfloat16'); ValueError for anything else."""
    dtype = getattr(torch, name, None)
    if isinstance(dtype, torch.dtype):
        return dtype
    raise ValueError(f"dtype {name!r} is not a torch dtype name (e.g. 'bfloat16', 'float32')")


def plan_buckets(
    state_dict: dict[str, torch.Tensor], bucket_bytes: int
) -> list[tuple[Bucket, list[torch.Tensor]]]:
    """The state dict cut into buckets of at most `bucket_bytes` (a larger tensor gets its own).

    Tied weights (one tensor under two names) are sent once, under the first name: the receiver
    owns the tie. Tensors are ordered by falling item size, so every offset in a flattened
    bucket is a multiple of its tensor's item size, as the receiver requires.
    """
    unique: list[tuple[str, torch.Tensor]] = []
    seen: set[tuple[int, int]] = set()
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key not in seen:
            seen.add(key)
            unique.append((name, tensor))
    unique.sort(key=lambda item: -item[1].dtype.itemsize)  # stable: names keep their order within a dtype
    buckets: list[tuple[Bucket, list[torch.Tensor]]] = []
    specs: list[TensorSpec] = []
    tensors: list[torch.Tensor] = []
    size = 0
    for name, tensor in unique:
        spec = TensorSpec(name, tensor.dtype, tuple(tensor.shape))
        if specs and size + spec.num_bytes > bucket_bytes:
            buckets.append((Bucket(tuple(specs)), tensors))
            specs, tensors, size = [], [], 0
        specs.append(spec)
        tensors.append(tensor)
        size += spec.num_bytes
    if specs:
        buckets.append((Bucket(tuple(specs)), tensors))
    return buckets


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' bytes, concatenated: [sum of num_bytes] uint8 on their device."""
    return torch.cat([tensor.detach().contiguous().reshape(-1).view(torch.uint8) for tensor in tensors])


def unflatten(flat: torch.Tensor, bucket: Bucket) -> dict[str, torch.Tensor]:
    """Views into `flat` ([num_bytes] uint8), one per spec of the bucket, in its dtype and shape."""
    tensors, offset = {}, 0
    for spec in bucket.specs:
        if offset % spec.dtype.itemsize:
            raise ValueError(
                f"tensor {spec.name!r} starts at byte {offset}, not a multiple of {spec.dtype}'s size"
            )
        tensors[spec.name] = flat[offset : offset + spec.num_bytes].view(spec.dtype).reshape(spec.shape)
        offset += spec.num_bytes
    return tensors


class WeightUpdateGroup:
    """This process's membership of a weights-update group; rank 0 sends, the others receive."""

    def __init__(
        self,
        *,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float,
    ) -> None:
        """Join the group; blocks until every rank has joined, or raises after `timeout_s`."""
        if backend not in ("nccl", "gloo"):
            raise ValueError(
                f"backend={backend!r}: the weights-update group speaks 'nccl' (CUDA) or 'gloo' (CPU)"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a group of world_size {world_size}")
        if not group_name:
            raise ValueError("group_name must not be empty")
        self.rank, self.world_size, self.backend, self.group_name = rank, world_size, backend, group_name
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._store = dist.TCPStore(
            master_address, master_port, world_size, is_master=rank == 0, timeout=self.timeout,
            wait_for_workers=False,
        )  # fmt: skip
        root = dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, self._store))
        self._backends: dict[str, dist.ProcessGroup] = {}
        for device in dist.Backend.backend_capability[backend]:
            store = dist.PrefixStore(f"{device}/", root)
            if backend == "gloo":
                self._backends[device] = dist.ProcessGroupGloo(store, rank, world_size, self.timeout)
            else:
                options = dist.ProcessGroupNCCL.Options()
                # The watchdog tears the process down once a collective outlives this; our own
                # deadline (`broadcast`) fires first and aborts the group instead.
                options._timeout = self.timeout * 2
                self._backends[device] = dist.ProcessGroupNCCL(store, rank, world_size, options)

    def broadcast(self, tensor: torch.Tensor, *, route: str, timeout_s: float) -> None:
        """Rank 0's `tensor` into every rank's `tensor` (in place); WeightSyncTimeout past `timeout_s`."""
        backend = self._backends.get(tensor.device.type)
        if backend is None:
            raise ValueError(
                f"backend {self.backend} cannot carry {tensor.device.type} tensors; "
                f"use {'gloo' if tensor.device.type == 'cpu' else 'nccl'}"
            )
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = datetime.timedelta(seconds=timeout_s)
        num_bytes = tensor.numel() * tensor.element_size()
        started = time.monotonic()
        try:
            backend.broadcast([tensor], options).wait(options.timeout)
        except RuntimeError as error:  # a timeout, or a peer that closed its connections
            self.abort()
            if time.monotonic() - started >= timeout_s * 0.99:
                raise WeightSyncTimeout(route, num_bytes, timeout_s, f"broadcast: {error}") from None
            raise WeightSyncError(f"{route}: broadcast of {num_bytes} bytes failed: {error}") from None
        if tensor.device.type == "cuda":
            torch.cuda.current_stream(tensor.device).synchronize()

    def abort(self) -> None:
        """Drop the group's connections; a collective in flight on another rank then fails."""
        for backend in self._backends.values():
            if self.backend == "nccl":
                backend.abort()
        self._backends.clear()

    @property
    def is_open(self) -> bool:
        return bool(self._backends)
