"""Inference stage, remote and replicated: one `InferenceEngine` over several SGLang-protocol servers.

Used by `trainer.launcher=ray` with `ray.placement=split`, where engine actors serve the built-in
engine and every policy worker generates through one of these clients.

- Sticky routing: the rollout runs each episode as its own asyncio task, so the client routes
  by task. An episode's first turn goes to the server with the fewest requests in flight from
  this client (then the fewest failures since its last success, then the lowest index); its
  later turns go to the same server, whose prefix cache already holds the conversation so far.
  When a server fails a request, the episode is routed afresh on its next call (the rollout
  reruns it with the same seeds), away from the failing server where another is as free.
- Weight sync goes through the servers' `/update_weights_from_disk`, from one Hugging Face
  export on disk, or with `distributed_sync` over one process group with all of them
  (`weight_sender`: the trainer is rank 0, server i rank i + 1). With several policy workers, all of them call `update_weights` after each
  step (they run the same loop), but only the one built with `updates_weights=True` exports
  and loads; the others wait until every server reports the new version, so no worker samples
  the next step from old weights.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import weakref
from pathlib import Path

import torch

from agentrl.engine.protocol import Generation, SamplingParams
from agentrl.engine.remote.sglang_client import SGLangEngine, export_checkpoint, export_dtype
from agentrl.engine.remote.sglang_protocol import EngineRequestError
from agentrl.engine.remote.weight_sender import DistributedSyncSettings

VERSION_POLL_INTERVAL_S = 0.05  # how often a waiting worker asks the servers for their version


class BalancedEngine:
    """Generation over `servers` with per-episode sticky routing; weight sync to all of them.

    `servers`: one client per server, all serving the same model, in `dtype` (the exports' dtype).
    `weights_dir`: where the
    export the servers load is written (a path every server can read; None: a temporary
    directory, removed on close). `updates_weights`: whether this client exports and loads the
    weights (one per run) or waits for the servers to report each new version.
    `version_timeout_s`: how long a waiting client waits for that. `distributed_sync`: broadcast
    the weights over a process group instead of exporting them.
    """

    def __init__(
        self,
        servers: list[SGLangEngine],
        *,
        model_path: str,
        updates_weights: bool,
        dtype: str = "float32",
        weights_dir: str | Path | None = None,
        version_timeout_s: float = 600.0,
        distributed_sync: DistributedSyncSettings | None = None,
    ) -> None:
        if not servers:
            raise ValueError("BalancedEngine needs at least one server, got an empty list")
        if version_timeout_s <= 0:
            raise ValueError(f"version_timeout_s={version_timeout_s} must be > 0")
        self.servers = servers
        self.model_path = model_path
        self.dtype = export_dtype(dtype)
        self.updates_weights = updates_weights
        self.version_timeout_s = version_timeout_s
        self._owns_weights_dir = weights_dir is None
        self.weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="agentrl-weights-"))
        self.in_flight = [0] * len(servers)  # requests this client has open on each server
        self.requests_sent = [0] * len(servers)  # requests sent to each server so far
        self.failures = [0] * len(servers)  # failed requests on each server since its last success
        # Entries disappear with their task: a finished episode holds no route.
        self._routes: weakref.WeakKeyDictionary[asyncio.Task, int] = weakref.WeakKeyDictionary()
        self._last_export: Path | None = None
        self.weight_sync = "disk" if distributed_sync is None else "distributed"  # read by the trainer loop
        self._sender = None
        if distributed_sync is not None and updates_weights:
            self._sender = distributed_sync.sender(list(servers), self.dtype)

    def route(self) -> int:
        """The server index for the calling episode (its asyncio task): sticky once chosen."""
        task = asyncio.current_task()
        assert task is not None, "generate() runs inside a task"
        index = self._routes.get(task)
        if index is None:
            index = min(range(len(self.servers)), key=lambda i: (self.in_flight[i], self.failures[i], i))
            self._routes[task] = index
        return index

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """One completion from the episode's server; raises EngineRequestError when none can be had."""
        index = self.route()
        self.in_flight[index] += 1
        self.requests_sent[index] += 1
        try:
            generation = await self.servers[index].generate(prompt_ids, sampling)
        except EngineRequestError:
            self.failures[index] += 1
            self._routes.pop(asyncio.current_task(), None)  # the rerun may go to a healthier server
            raise
        else:
            self.failures[index] = 0
            return generation
        finally:
            self.in_flight[index] -= 1

    async def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Export once and have every server load it as `version`, or wait until all serve it."""
        if not self.updates_weights:
            await self._wait_for_version(version)
            return
        if self._sender is not None:
            await self._sender.send(state_dict, version)
            await self._wait_for_version(version)  # every server answered; this checks what they report
            return
        export = self.weights_dir / f"version_{version}"
        await asyncio.to_thread(export_checkpoint, state_dict, export, self.model_path, self.dtype)
        await asyncio.gather(*(server.update_weights_from_disk(export, version) for server in self.servers))
        if self._last_export is not None and self._last_export != export:
            shutil.rmtree(self._last_export, ignore_errors=True)  # only the served export is kept
        self._last_export = export

    async def _wait_for_version(self, version: int) -> None:
        deadline = time.monotonic() + self.version_timeout_s
        while True:
            served = await asyncio.gather(*(server.policy_version() for server in self.servers))
            # Equality, not >=: a server may still hold a later version of another run until it is loaded.
            if all(served_version == version for served_version in served):
                return
            if time.monotonic() > deadline:
                raise EngineRequestError(
                    f"the engine servers report weight versions {served}, not {version}, after "
                    f"{self.version_timeout_s} s: the worker that loads the weights did not finish"
                )
            await asyncio.sleep(VERSION_POLL_INTERVAL_S)

    async def close(self) -> None:
        """Close every server's client (the servers keep running) and remove a temporary weights_dir."""
        if self._sender is not None:
            await self._sender.close()
        await asyncio.gather(*(server.close() for server in self.servers))
        if self._owns_weights_dir:
            shutil.rmtree(self.weights_dir, ignore_errors=True)
