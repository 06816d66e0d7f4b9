"""Inference stage, remote: an `InferenceEngine` that generates through SGLang's native HTTP protocol.

`engine=sglang` in a config. The server is SGLang itself or the built-in engine served by
`python -m agentrl.engine.serve`; both speak the subset in `sglang_protocol`.

- Token in, token out: `/generate` with `input_ids` and `return_logprob`, never the
  OpenAI-compatible routes (they return text, not the sampled token ids).
- One aiohttp session, with a bounded connection pool, carries every concurrent request.
- Failure policy: connection failures and HTTP 5xx are retried (exponential backoff with
  jitter, at most `max_retries` more attempts); every call has a deadline covering all its
  attempts. When either runs out, or the server refuses the request (4xx) or answers something
  unusable, `EngineRequestError` is raised, which the rollout records as an engine_error
  trajectory.
- Weight sync: HTTP cannot carry tensors cheaply, so `update_weights` writes the state dict as a
  Hugging Face checkpoint in the server's dtype under `weights_dir` (a path the server can read),
  then asks the server to load it (`/update_weights_from_disk` with `weight_version` = the policy
  version) and checks the version `/model_info` reports. No `/flush_cache` follows: SGLang flushes
  inside the update, and refuses a flush (HTTP 400) while any request runs, which in async
  rollout is always. Every generation carries the version that produced it
  (`meta_info.weight_version`).
- With `distributed_sync` (`engine.weight_sync=distributed`) nothing is written to disk: the
  weights are broadcast over a process group the client opens with the server
  (`/init_weights_update_group`, `/update_weights_from_distributed`; `weight_sender`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import torch
from safetensors.torch import save_file
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter
from transformers import AutoConfig

from agentrl.engine.protocol import Generation, SamplingParams
from agentrl.engine.remote.sglang_launcher import LaunchedServer, auth_headers
from agentrl.engine.remote.sglang_protocol import (
    EngineRequestError,
    generate_payload,
    generation_from_response,
    parse_version,
)
from agentrl.engine.remote.weight_sender import DistributedSyncSettings

CONNECT_TIMEOUT_S = 10.0  # a server that does not accept the connection by then is retried
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ServerUnavailable(Exception):
    """A failure a later attempt may not see: no connection, or HTTP 5xx."""


class SGLangEngine:
    """Generation and weight sync against one SGLang-protocol server at `url`.

    `model_path`: the served model's HF directory or hub id; its config is written next to each
    weight export. `dtype`: the server's weights dtype, which exports are written in (a bfloat16
    server needs half the bytes of float32). `server`: a process this engine launched and stops
    on `close()`. `distributed_sync`: send weights over a process group instead of through disk.
    """

    def __init__(
        self,
        url: str,
        *,
        model_path: str,
        dtype: str = "float32",
        request_timeout_s: float = 600.0,
        max_retries: int = 3,
        max_connections: int = 256,
        weights_dir: str | Path | None = None,
        api_key: str | None = None,
        server: LaunchedServer | None = None,
        distributed_sync: DistributedSyncSettings | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url={url!r} must start with http:// or https://")
        if request_timeout_s <= 0 or max_retries < 0 or max_connections < 1:
            raise ValueError(
                f"request_timeout_s={request_timeout_s} must be > 0, max_retries={max_retries} >= 0 and "
                f"max_connections={max_connections} >= 1"
            )
        self.url = url.rstrip("/")
        self.model_path = model_path
        self.dtype = export_dtype(dtype)
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.max_connections = max_connections
        self.server = server
        self._owns_weights_dir = weights_dir is None
        self.weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="agentrl-weights-"))
        self._headers = auth_headers(api_key)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._last_export: Path | None = None
        self._sender = None if distributed_sync is None else distributed_sync.sender([self], self.dtype)

    @property
    def weight_sync(self) -> str:
        """`engine.weight_sync`: 'distributed' sends device tensors, so the trainer keeps them on its device."""
        return "disk" if self._sender is None else "distributed"

    # ---- InferenceEngine ----

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """One completion from `/generate`; raises EngineRequestError when none can be had."""
        body = await self._call("POST", "/generate", generate_payload(prompt_ids, sampling))
        return generation_from_response(body)

    async def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Export `state_dict` under `weights_dir` (or broadcast it: `distributed_sync`), have the server
        load it as `version`, check it."""
        if self._sender is not None:
            await self._sender.send(state_dict, version)
            await self._check_version(version)
            return
        export = self.weights_dir / f"version_{version}"
        await asyncio.to_thread(export_checkpoint, state_dict, export, self.model_path, self.dtype)
        try:
            await self._load_from_disk(export, version)
        except EngineRequestError as error:
            raise EngineRequestError(
                f"{error} (the server must be able to read {export}: on another machine, set "
                "engine.weights_dir to a directory both can reach)"
            ) from None
        await self._check_version(version)
        if self._last_export is not None and self._last_export != export:
            shutil.rmtree(self._last_export, ignore_errors=True)  # only the served export is kept
        self._last_export = export

    async def close(self) -> None:
        """Close the session, remove a temporary weights_dir and stop a launched server."""
        if self._sender is not None:
            await self._sender.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._owns_weights_dir:
            shutil.rmtree(self.weights_dir, ignore_errors=True)
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None

    # ---- SGLang's control routes ----

    async def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        """Load the HF checkpoint at `path` (as the server sees it) as `version`, and check it.

        Requests in flight finish on the old weights and the server drops its prefix cache
        itself (both SGLang and the built-in server). A server that answers with another version
        raises EngineRequestError.
        """
        await self._load_from_disk(path, version)
        await self._check_version(version)

    async def _load_from_disk(self, path: str | Path, version: int) -> None:
        body = {"model_path": str(path), "weight_version": str(version)}
        answer = await self._call("POST", "/update_weights_from_disk", body)
        if not answer.get("success"):
            raise EngineRequestError(f"/update_weights_from_disk failed: {answer.get('message')}")

    async def _check_version(self, version: int) -> None:
        served = await self.policy_version()
        if served != version:
            raise EngineRequestError(f"server serves weight_version {served} after loading version {version}")

    async def flush_cache(self) -> None:
        """Drop the server's prefix cache; SGLang refuses (EngineRequestError) while requests run."""
        await self._call("POST", "/flush_cache", None, answers_json=False)  # SGLang answers plain text

    async def policy_version(self) -> int:
        """The version the server reports now (`/model_info`'s weight_version)."""
        return parse_version((await self._call("GET", "/model_info", None)).get("weight_version"))

    async def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Free the server's GPU memory (SGLang: weights and/or kv_cache) while training runs."""
        await self._call(
            "POST", "/release_memory_occupation", {"tags": tags} if tags else {}, answers_json=False
        )

    async def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        await self._call(
            "POST", "/resume_memory_occupation", {"tags": tags} if tags else {}, answers_json=False
        )

    # ---- transport ----

    def _session_for_this_loop(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            # A session belongs to the loop that made it; a new loop (a second asyncio.run) needs its own.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                headers=self._headers,
            )
            self._session_loop = loop
        return self._session

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None, *, answers_json: bool = True
    ) -> Any:
        """One request with retries, all of them within `request_timeout_s`; the decoded answer,
        or its text where the route's answer carries nothing to read (`answers_json=False`)."""
        last_failure = "no attempt finished"
        try:
            async with asyncio.timeout(self.request_timeout_s):
                async for attempt in AsyncRetrying(
                    retry=retry_if_exception_type(ServerUnavailable),
                    stop=stop_after_attempt(self.max_retries + 1),
                    wait=wait_exponential_jitter(multiplier=0.1, max=2.0, jitter=0.1),
                    reraise=True,
                ):
                    with attempt:
                        try:
                            return await self._attempt(method, path, body, answers_json)
                        except ServerUnavailable as failure:
                            last_failure = str(failure)
                            raise
        except ServerUnavailable:
            raise EngineRequestError(
                f"{method} {self.url}{path} failed {self.max_retries + 1} times (engine.max_retries="
                f"{self.max_retries}); last failure: {last_failure}"
            ) from None
        except TimeoutError:
            raise EngineRequestError(
                f"{method} {self.url}{path} got no answer within engine.request_timeout_s="
                f"{self.request_timeout_s}; last failure: {last_failure}"
            ) from None

    async def post_once(self, path: str, body: dict[str, Any]) -> Any:
        """POST `body` once, without retries (a repeated weights-update request would join or receive
        twice) and without a deadline of its own (the caller's covers the collective too)."""
        try:
            return await self._attempt("POST", path, body, True)
        except ServerUnavailable as failure:
            raise EngineRequestError(f"POST {self.url}{path} failed: {failure}") from None

    async def _attempt(self, method: str, path: str, body: dict[str, Any] | None, answers_json: bool) -> Any:
        session = self._session_for_this_loop()
        try:
            async with session.request(method, f"{self.url}{path}", json=body) as response:
                text = await response.text()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
            raise ServerUnavailable(f"{type(error).__name__}: {error}") from None
        if response.status >= 500:
            raise ServerUnavailable(f"HTTP {response.status}: {text[:500]}")
        if response.status >= 400:
            raise EngineRequestError(f"{method} {path} was refused (HTTP {response.status}): {text[:2000]}")
        if not answers_json:
            return text
        try:
            return json.loads(text)
        except ValueError:
            raise EngineRequestError(f"{method} {path} answered non-JSON: {text[:500]!r}") from None


def export_dtype(name: str) -> torch.dtype:
    """The torch dtype of a `model.dtype` name; ValueError for another name."""
    if name not in EXPORT_DTYPES:
        raise ValueError(f"dtype={name!r} must be one of {sorted(EXPORT_DTYPES)} (the server's --dtype)")
    return EXPORT_DTYPES[name]


def export_checkpoint(
    state_dict: dict[str, torch.Tensor], directory: Path, model_path: str, dtype: torch.dtype
) -> None:
    """Write `state_dict` in `dtype`, with the model's config, as an HF checkpoint directory, atomically.

    Tied weights (one tensor under two names) are written once, under the first name, as
    `save_pretrained` does; the loader ties them again from the config.
    """
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    config = AutoConfig.from_pretrained(model_path)
    config.dtype = dtype  # what the checkpoint holds, for a server started with --dtype auto
    config.save_pretrained(staging)
    tensors: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = tensor.detach().to(device="cpu", dtype=dtype).contiguous()
    save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)  # the server never sees a half-written checkpoint
