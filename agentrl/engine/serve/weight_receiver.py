"""Weight sync stage, served: the built-in server's end of SGLang's disk-free weight update routes.

- `POST /init_weights_update_group`: join the trainer's weights-update group as rank
  `rank_offset` (one engine process per server); answers once every rank has joined. A group
  of the same name is replaced (a trainer that restarted opens a new one).
- `POST /update_weights_from_distributed`: receive the named tensors from the trainer's broadcast
  (`weight_transfer`), then load them into the engine.
- `POST /destroy_weights_update_group`: leave the group.

Shapes in `sglang_protocol` (SGLang's `InitWeightsUpdateGroupReqInput` and
`UpdateWeightsFromDistributedReqInput`), answers `{"success", "message"}` as SGLang's
entrypoints/http_server.py gives them (HTTP 400 when `success` is false).

A sync of several buckets must not serve a mix of old and new weights under either version.
So a request with `flush_cache=false` and no `weight_version` (the trainer's earlier buckets)
is staged; the first request with either applies everything staged with its own tensors, in one
engine update (requests already running finish on the old weights), as `weight_version` (or the
served version when it names none). SGLang loads each request as it comes; the weights it
serves after the last bucket are the same.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import torch
from aiohttp import web

from agentrl.engine.remote.sglang_protocol import WireInitWeightsUpdateGroup, WireUpdateWeightsFromDistributed
from agentrl.engine.remote.weight_transfer import (
    FLATTENED_BUCKET,
    Bucket,
    TensorSpec,
    WeightSyncError,
    WeightUpdateGroup,
    parse_dtype,
    unflatten,
)
from agentrl.engine.serve.http_server import ENGINE_KEY, ServedEngine, bad_request, read_body

RECEIVE_TIMEOUT_S = 600.0  # a trainer that stops mid-transfer frees the server after this


@dataclass
class WeightReceiver:
    """The server's weights-update groups and the tensors staged for the next engine update."""

    timeout_s: float = RECEIVE_TIMEOUT_S
    groups: dict[str, WeightUpdateGroup] = field(default_factory=dict)
    staged: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.lock = asyncio.Lock()  # one group change or receive at a time: broadcasts are ordered


RECEIVER_KEY = web.AppKey("weight_receiver", WeightReceiver)


def answer(success: bool, message: str) -> web.Response:
    return web.json_response({"success": success, "message": message}, status=200 if success else 400)


async def init_weights_update_group(request: web.Request) -> web.Response:
    receiver = request.app[RECEIVER_KEY]
    parsed = await read_body(request, WireInitWeightsUpdateGroup)
    if isinstance(parsed, web.Response):
        return parsed
    if parsed.rank_offset >= parsed.world_size:
        return bad_request(f"rank_offset {parsed.rank_offset} must be below world_size {parsed.world_size}")
    async with receiver.lock:
        stale = receiver.groups.pop(parsed.group_name, None)
        # A trainer that restarted without leaving: its group is replaced, as SGLang does.
        if stale is not None:
            stale.abort()
            receiver.staged.clear()
        try:
            group = await asyncio.to_thread(
                WeightUpdateGroup,
                master_address=parsed.master_address, master_port=parsed.master_port, rank=parsed.rank_offset,
                world_size=parsed.world_size, group_name=parsed.group_name, backend=parsed.backend,
                timeout_s=receiver.timeout_s,
            )  # fmt: skip
        except (RuntimeError, ValueError) as error:  # no trainer at that address, or it did not join in time
            return answer(False, f"Failed to initialize custom process group: {error}")
        receiver.groups[parsed.group_name] = group
    return answer(True, "Succeeded to initialize custom process group.")


async def destroy_weights_update_group(request: web.Request) -> web.Response:
    receiver = request.app[RECEIVER_KEY]
    body = await request.json() if request.can_read_body else {}
    name = body.get("group_name", "weight_update_group") if isinstance(body, dict) else None
    async with receiver.lock:
        group = receiver.groups.pop(name, None) if isinstance(name, str) else None
        if group is None:
            return answer(False, f"no weights-update group named {name!r}")
        group.abort()
        receiver.staged.clear()
    return answer(True, "Succeeded to destroy custom process group.")


async def update_weights_from_distributed(request: web.Request) -> web.Response:
    served, receiver = request.app[ENGINE_KEY], request.app[RECEIVER_KEY]
    parsed = await read_body(request, WireUpdateWeightsFromDistributed)
    if isinstance(parsed, web.Response):
        return parsed
    if parsed.weight_version is not None and not parsed.weight_version.isdigit():
        return bad_request(
            f"field 'weight_version': must be a decimal policy version (got {parsed.weight_version!r})"
        )
    try:
        bucket = Bucket(
            tuple(
                TensorSpec(n, parse_dtype(d), tuple(s))
                for n, d, s in zip(parsed.names, parsed.dtypes, parsed.shapes)
            )
        )
    except ValueError as error:
        return bad_request(str(error))
    async with receiver.lock:
        group = receiver.groups.get(parsed.group_name)
        if group is None or not group.is_open:
            return answer(
                False, f"no weights-update group {parsed.group_name!r}: POST /init_weights_update_group first"
            )
        device = served.engine.device if group.backend == "nccl" else torch.device("cpu")
        try:
            received = await asyncio.to_thread(
                receive, group, bucket, parsed.load_format, device, receiver.timeout_s
            )
        except WeightSyncError as error:
            receiver.groups.pop(parsed.group_name, None)  # a failed collective leaves the group unusable
            receiver.staged.clear()
            return answer(False, str(error))
        receiver.staged.update(received)
        if parsed.weight_version is None and not parsed.flush_cache:
            return answer(True, f"Received {len(received)} tensors; they load with the request that flushes.")
        staged, receiver.staged = receiver.staged, {}
    return await apply(served, staged, parsed.weight_version)


def receive(
    group: WeightUpdateGroup, bucket: Bucket, load_format: str | None, device: torch.device, timeout_s: float
) -> dict[str, torch.Tensor]:
    """The bucket's tensors from rank 0, in one broadcast (flattened) or one per tensor."""
    route, deadline = "/update_weights_from_distributed", time.monotonic() + timeout_s
    if load_format == FLATTENED_BUCKET:
        flat = torch.empty(bucket.num_bytes, dtype=torch.uint8, device=device)
        group.broadcast(flat, route=route, timeout_s=timeout_s)
        return unflatten(flat, bucket)
    tensors = {}
    for spec in bucket.specs:
        tensor = torch.empty(spec.shape, dtype=spec.dtype, device=device)
        group.broadcast(tensor, route=route, timeout_s=max(deadline - time.monotonic(), 1e-3))
        tensors[spec.name] = tensor
    return tensors


async def apply(
    served: ServedEngine, state_dict: dict[str, torch.Tensor], weight_version: str | None
) -> web.Response:
    """Load `state_dict` into the engine as `weight_version` (None: the served one), after earlier requests."""
    tied = getattr(getattr(served.engine, "model", None), "all_tied_weights_keys", None) or {}
    for target, source in tied.items():  # sent once (`plan_buckets`); the engine's copy may be its own
        if source in state_dict and target not in state_dict:
            state_dict[target] = state_dict[source]
    async with served.admin_lock:
        version = served.policy_version if weight_version is None else int(weight_version)
        try:
            await served.engine.update_weights(state_dict, version=version)
        except ValueError as error:  # names or shapes that are not this model's
            return answer(False, f"Failed to update parameter online: {error}")
        served.policy_version = version
    return answer(True, f"Succeeded to update parameter online (weight_version {version}).")


def add_weight_transfer_routes(app: web.Application, timeout_s: float = RECEIVE_TIMEOUT_S) -> None:
    """Serve the three routes on `app` (built by `http_server.build_app`)."""
    app[RECEIVER_KEY] = WeightReceiver(timeout_s=timeout_s)
    app.router.add_post("/init_weights_update_group", init_weights_update_group)
    app.router.add_post("/update_weights_from_distributed", update_weights_from_distributed)
    app.router.add_post("/destroy_weights_update_group", destroy_weights_update_group)
