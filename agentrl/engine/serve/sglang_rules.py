"""Inference stage, served: SGLang's runtime rules, which `--strict-sglang` makes the built-in server keep.

The built-in server speaks SGLang's wire format (`remote/sglang_protocol`), but a client can be
right about the shapes and still fail against SGLang at run time. In strict mode the server also
behaves as SGLang 0.5.23 does, so that the client's tests see what SGLang would answer. Each rule
names where SGLang decides it (paths under `python/sglang/srt/` of the sglang 0.5.23 wheel, whose
`_version.py` records no commit; wheel sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl):

1. `/flush_cache` is refused (HTTP 400) while any request is running or waiting, unless the call
   passes `?timeout=S` > 0, which defers it until the server is idle or the time is up.
   `managers/scheduler.py` `Scheduler.flush_cache` (flushes only if `is_fully_idle()`: empty
   running batch and waiting queue), `managers/scheduler_components/flush_wrapper.py`
   `SchedulerFlushWrapper.handle` / `check_pending` (the timeout), `entrypoints/http_server.py`
   `flush_cache` (400 when not flushed).
2. `/update_weights_from_disk` waits for the requests in flight and holds new ones back until it
   is done (`managers/tokenizer_manager.py` `TokenizerManager.update_weights_from_disk` takes
   `model_update_lock.writer_lock`; every `/generate` holds its reader lock, `generate_request`),
   does not abort them (`abort_all_requests` defaults to False, `managers/io_struct.py`
   `UpdateWeightFromDiskReqInput`), flushes the cache itself (`flush_cache` defaults to True;
   `managers/scheduler_components/weight_updater.py` `flush_cache_after_weight_update`), and
   changes `weight_version` only when the request carries one (`_update_weight_version_if_provided`).
3. `sampling_seed` is read only with `--enable-deterministic-inference`; then a request without
   one samples with seed 42 (`sampling/sampling_batch_info.py` `SamplingBatchInfo.from_schedule_batch`:
   `sampling_seed` is None unless `enable_deterministic_inference`).
4. `/get_model_info` is deprecated in favour of `/model_info`, which answers the same
   (`entrypoints/http_server.py` `get_model_info` logs a warning on every call). Strict mode
   goes one step further and refuses it, so that a client still relying on it is caught before
   SGLang removes it.
5. `/release_memory_occupation` only while idle (`weight_updater.py` `release_memory_occupation`
   asserts `is_fully_idle`); tags `kv_cache`, `weights`, `cuda_graph`, none meaning all
   (`constants.py` `GPU_MEMORY_ALL_TYPES`); `/resume_memory_occupation` of a tag that is not
   released fails (`resume_memory_occupation` removes it from `offload_tags`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

from pydantic import BaseModel, ConfigDict

from agentrl.engine.protocol import SamplingParams

MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")  # SGLang's GPU_MEMORY_ALL_TYPES
DETERMINISTIC_DEFAULT_SEED = 42  # what SGLang samples a seedless request with in deterministic mode
FLUSH_REFUSED = (
    "Cache not flushed because there are running or waiting requests (SGLang refuses /flush_cache "
    "until the server is idle; pass ?timeout=SECONDS to wait for it)."
)
FLUSH_TIMED_OUT = "Timed out waiting for idle state."
RELEASE_REFUSED = "release_memory_occupation should be called only when server is idle."
GET_MODEL_INFO_REFUSED = (
    "/get_model_info is deprecated in SGLang (a warning on every call); use /model_info, which "
    "answers the same. Refused by --strict-sglang."
)


class WireMemoryTags(BaseModel):
    """`/release_memory_occupation` and `/resume_memory_occupation` body (SGLang's `tags`)."""

    model_config = ConfigDict(extra="forbid")

    tags: list[str] | None = None

    def resolved(self) -> tuple[str, ...]:
        """The tags the call means: all of them when none are named."""
        return tuple(self.tags) if self.tags else MEMORY_TAGS


def seed_as_sglang_reads_it(sampling: SamplingParams, *, deterministic: bool) -> SamplingParams:
    """The sampling SGLang would run: without deterministic inference the request's seed is unread."""
    if deterministic:
        seed = DETERMINISTIC_DEFAULT_SEED if sampling.seed is None else sampling.seed
    else:
        seed = None  # the engine's own seed stream, as SGLang's sampler uses its global generator
    return replace(sampling, seed=seed)


@dataclass
class Traffic:
    """Requests in flight on the server, and the gate a weight update closes while it loads.

    `/generate` enters with `request()`; a weight update holds `exclusive()`, which waits for
    every request inside to leave and keeps new ones out until it is done (SGLang's
    `model_update_lock`: readers are requests, the writer is the update).
    """

    num_in_flight: int = 0
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _updating: bool = False

    @property
    def idle(self) -> bool:
        return self.num_in_flight == 0

    @property
    def updating(self) -> bool:
        """Whether a weight update holds the gate (new requests wait)."""
        return self._updating

    @asynccontextmanager
    async def request(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._updating)
            self.num_in_flight += 1
        try:
            yield
        finally:
            async with self._changed:
                self.num_in_flight -= 1
                self._changed.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._updating)
            self._updating = True  # closes the gate first: waiting requests cannot starve the update
            await self._changed.wait_for(lambda: self.num_in_flight == 0)
        try:
            yield
        finally:
            async with self._changed:
                self._updating = False
                self._changed.notify_all()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Whether the server became idle within `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s):
                async with self._changed:
                    await self._changed.wait_for(lambda: self.num_in_flight == 0)
        except TimeoutError:
            return False
        return True
