"""Weight sync stage, trainer side: send a state dict to SGLang-protocol servers over a process group.

`engine.weight_sync=distributed`. The trainer opens the group once, at its first sync:
it hosts the rendezvous on a free port of the address it reaches the first server from, and
asks every server to join (`POST /init_weights_update_group`, server i as rank i + 1) while
joining itself as rank 0. Each sync then sends the state dict bucket by bucket: for each bucket
one `POST /update_weights_from_distributed` to every server (names, dtypes, shapes,
`load_format="flattened_bucket"`) and, at the same time, one broadcast of the bucket's bytes.
Only the last bucket carries `weight_version` and `flush_cache=true`: the built-in server loads
the whole state dict at once then (`agentrl.engine.serve.weight_receiver`).

Every step has one deadline (`timeout_s`), covering the HTTP answers and the broadcast; past it
`WeightSyncTimeout` names the route, the bytes and the deadline, and the group is aborted: the
next sync opens a new one. The requests are never retried: a repeated request would join or
receive twice.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import torch

from agentrl.engine.config import EngineConfig
from agentrl.engine.remote.sglang_protocol import EngineRequestError
from agentrl.engine.remote.weight_transfer import (
    DEFAULT_GROUP_NAME,
    FLATTENED_BUCKET,
    WeightSyncError,
    WeightSyncTimeout,
    WeightUpdateGroup,
    flatten,
    plan_buckets,
)

INIT_ROUTE = "/init_weights_update_group"
UPDATE_ROUTE = "/update_weights_from_distributed"
DESTROY_ROUTE = "/destroy_weights_update_group"


class WeightServer(Protocol):
    """A server the weights go to: its base URL and one unretried POST (SGLangEngine has both)."""

    url: str

    async def post_once(self, path: str, body: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class DistributedSyncSettings:
    """`engine.weight_sync=distributed`'s knobs, for the clients that build a sender."""

    bucket_bytes: int
    timeout_s: float

    @classmethod
    def from_config(cls, engine: EngineConfig) -> DistributedSyncSettings | None:
        """The settings of `engine.weight_sync=distributed`; None for disk."""
        if engine.weight_sync == "disk":
            return None
        return cls(engine.weight_sync_bucket_bytes, engine.weight_sync_timeout_s)

    def sender(self, servers: list[WeightServer], dtype: torch.dtype) -> DistributedWeightSender:
        return DistributedWeightSender(
            servers, dtype=dtype, bucket_bytes=self.bucket_bytes, timeout_s=self.timeout_s
        )


class DistributedWeightSender:
    """Rank 0 of a weights-update group with `servers` (one engine process each).

    `dtype`: floating tensors are sent in it (the servers' weights dtype). `bucket_bytes`: bytes
    per request and broadcast at most. `timeout_s`: the deadline of each transfer.
    """

    def __init__(
        self,
        servers: list[WeightServer],
        *,
        dtype: torch.dtype,
        bucket_bytes: int,
        timeout_s: float,
        group_name: str = DEFAULT_GROUP_NAME,
    ) -> None:
        if not servers:
            raise ValueError("DistributedWeightSender needs at least one server")
        if bucket_bytes <= 0 or timeout_s <= 0:
            raise ValueError(f"bucket_bytes={bucket_bytes} and timeout_s={timeout_s} must be > 0")
        self.servers = servers
        self.dtype = dtype
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.group_name = group_name
        self._group: WeightUpdateGroup | None = None

    async def send(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Broadcast `state_dict` to every server; they serve it as `version` once this returns."""
        if not state_dict:
            raise ValueError("state_dict is empty: there are no weights to send")
        device = next(iter(state_dict.values())).device
        if self._group is None or not self._group.is_open:
            await self._open("nccl" if device.type == "cuda" else "gloo")
        cast = {
            name: tensor.to(self.dtype) if tensor.is_floating_point() else tensor
            for name, tensor in state_dict.items()
        }
        buckets = plan_buckets(cast, self.bucket_bytes)
        for index, (bucket, tensors) in enumerate(buckets):
            last = index == len(buckets) - 1
            body = {
                **bucket.wire_fields(),
                "group_name": self.group_name,
                "load_format": FLATTENED_BUCKET,
                "flush_cache": last,
                "weight_version": str(version) if last else None,
            }
            assert self._group is not None
            broadcast = functools.partial(
                self._group.broadcast, flatten(tensors), route=UPDATE_ROUTE, timeout_s=self.timeout_s
            )
            await self._together(UPDATE_ROUTE, body, bucket.num_bytes, broadcast)

    async def _open(self, backend: str) -> None:
        address, port = local_address_towards(self.servers[0].url), free_port()
        world_size = len(self.servers) + 1
        bodies = [
            {
                "master_address": address,
                "master_port": port,
                "rank_offset": rank,
                "world_size": world_size,
                "group_name": self.group_name,
                "backend": backend,
            }
            for rank in range(1, world_size)
        ]
        joined: list[WeightUpdateGroup] = []

        def join() -> None:
            try:
                group = WeightUpdateGroup(
                    master_address=address, master_port=port, rank=0, world_size=world_size,
                    group_name=self.group_name, backend=backend, timeout_s=self.timeout_s,
                )  # fmt: skip
            except RuntimeError as error:  # torch's DistStoreError: a rank did not join in time
                raise WeightSyncTimeout(
                    INIT_ROUTE, 0, self.timeout_s, f"the group did not form: {error}"
                ) from None
            joined.append(group)

        await self._together(INIT_ROUTE, bodies, 0, join)
        self._group = joined[0]

    async def _together(
        self, route: str, bodies: dict | list[dict], num_bytes: int, local: Callable[[], None]
    ) -> None:
        """POST `bodies` (one per server, or one for all) and run `local()` in a thread, within the deadline."""
        per_server = bodies if isinstance(bodies, list) else [bodies] * len(self.servers)
        thread = asyncio.ensure_future(asyncio.to_thread(local))
        posts = [
            asyncio.ensure_future(self._post(server, route, body))
            for server, body in zip(self.servers, per_server, strict=True)
        ]
        try:
            async with asyncio.timeout(self.timeout_s):
                await asyncio.gather(thread, *posts)
        except TimeoutError:
            waiting = [
                server.url for server, post in zip(self.servers, posts, strict=True) if not post.done()
            ]
            self._fail(posts)
            detail = (
                f"no answer from {waiting}"
                if waiting
                else "the trainer's side of the collective did not finish"
            )
            raise WeightSyncTimeout(route, num_bytes, self.timeout_s, detail) from None
        except BaseException:
            self._fail(posts)
            raise

    async def _post(self, server: WeightServer, route: str, body: dict[str, Any]) -> None:
        answer = await server.post_once(route, body)
        if not isinstance(answer, dict) or not answer.get("success"):
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise WeightSyncError(f"{server.url}{route} failed: {message}")

    def _fail(self, posts: list[asyncio.Future]) -> None:
        for post in posts:
            post.cancel()
        if self._group is not None:
            self._group.abort()  # a half-done collective leaves the group unusable; the next sync opens anew
            self._group = None

    async def close(self) -> None:
        """Leave the group: the servers first (`/destroy_weights_update_group`, best effort), then here."""
        if self._group is None:
            return
        body = {"group_name": self.group_name}
        try:
            async with asyncio.timeout(self.timeout_s):
                await asyncio.gather(*(server.post_once(DESTROY_ROUTE, body) for server in self.servers))
        except (TimeoutError, EngineRequestError):
            pass  # a server that is gone or hangs has no group to keep; a new init replaces it anyway
        self._group.abort()
        self._group = None


def local_address_towards(url: str) -> str:
    """This host's address on the route to `url`'s host: the one the server can reach us at."""
    host = urlsplit(url).hostname or "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:  # a host name
        pass
    family, _, _, _, target = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(target)  # UDP: picks the route, sends nothing
        return probe.getsockname()[0]


def free_port() -> int:
    """A port free on this host now, for the group's rendezvous store."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
