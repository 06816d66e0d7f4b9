"""Inference stage, served: the built-in engine behind the subset of SGLang's native HTTP protocol.

Rollout and training can then run on different machines or GPUs without SGLang: the trainer
talks to this server with the same client (`sglang_client`) it would point at SGLang.
Routes (shapes in `sglang_protocol`):

- `POST /generate`: one prompt or a batch; every prompt is its own engine request, so a batch
  and concurrent requests are decoded together by the engine's continuous batching.
- `POST /update_weights_from_disk`: load a Hugging Face checkpoint directory into the engine
  under a new policy version; requests already running finish on the old weights.
- `GET|POST /flush_cache`: drop the engine's prefix cache (after earlier requests finish).
- `GET|POST /release_memory_occupation`, `/resume_memory_occupation`: pause and resume
  generation. The built-in engine keeps its weights and KV slots allocated; the answer says so.
- `GET /health`, `GET /model_info` (also the deprecated `/get_model_info`).

Weight updates and cache flushes are serialised by one lock: each reads the served version.
With `strict=True` (`--strict-sglang`) the routes also keep SGLang's runtime rules
(`sglang_rules`): no flush while requests run, updates that wait for them and flush themselves,
seeds read only in deterministic mode.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from aiohttp import web
from pydantic import BaseModel, ValidationError
from transformers import PreTrainedTokenizerBase

from agentrl.engine.protocol import InferenceEngine
from agentrl.engine.remote.sglang_protocol import (
    WireGenerateRequest,
    WireUpdateWeightsFromDisk,
    response_from_generation,
)
from agentrl.engine.serve import sglang_rules
from agentrl.engine.serve.sglang_rules import Traffic, WireMemoryTags
from agentrl.model_path import load_causal_lm

ENGINE_KEY = web.AppKey("engine", "ServedEngine")
OPEN_ROUTES = frozenset({"/health"})  # answered without the API key, for load balancers and launchers


@dataclass
class ServedEngine:
    """What the routes share: the engine, how to decode text, and the serving state."""

    engine: InferenceEngine
    tokenizer: PreTrainedTokenizerBase
    model_path: str
    dtype: torch.dtype  # checkpoints loaded from disk are cast to it
    policy_version: int = 0  # the version of the last update (or flush) this server applied
    released: bool = False  # memory "released": generation is refused until resumed
    api_key: str | None = None
    strict: bool = False  # keep SGLang's runtime rules (`sglang_rules`), not only its wire format
    deterministic: bool = False  # SGLang's --enable-deterministic-inference: how sampling_seed is read

    def __post_init__(self) -> None:
        self.admin_lock = asyncio.Lock()
        self.request_ids = itertools.count()
        self.traffic = Traffic()
        self.released_tags: set[str] = set()  # strict: what release took and resume must give back


def bad_request(message: str, status: int = 400) -> web.Response:
    """SGLang's error shape: {"error": {"message", "code"}}."""
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def describe_validation_error(error: ValidationError) -> str:
    """'field a.b: what is wrong' for the first problem pydantic found."""
    first = error.errors()[0]
    # Union members add their type's name to the location ('list[int]', 'WireSamplingParams'):
    # keep only field names and list indices.
    parts = [str(p) for p in first["loc"] if isinstance(p, int) or re.fullmatch(r"[a-z_][a-z0-9_]*", p)]
    field = ".".join(parts) or "body"
    reason = first["msg"]
    if first["type"] == "extra_forbidden":
        reason = "not supported by agentrl.engine.serve (leave it out)"
    return f"field {field!r}: {reason} (got {first.get('input')!r})"


async def read_body(request: web.Request, model: type[BaseModel]) -> BaseModel | web.Response:
    """The request's JSON body as `model`, or a 400 answer naming the bad field."""
    try:
        body = await request.json()
    except ValueError:
        return bad_request("the request body is not JSON")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        return bad_request(describe_validation_error(error))


async def generate(request: web.Request) -> web.Response:
    served = request.app[ENGINE_KEY]
    if served.released:
        return bad_request("memory is released; POST /resume_memory_occupation first", status=503)
    parsed = await read_body(request, WireGenerateRequest)
    if isinstance(parsed, web.Response):
        return parsed
    try:
        prompts, samplings = parsed.prompts(), parsed.samplings()
        if served.strict or served.deterministic:
            samplings = [
                sglang_rules.seed_as_sglang_reads_it(sampling, deterministic=served.deterministic)
                for sampling in samplings
            ]
        async with served.traffic.request():
            generations = await asyncio.gather(
                *(served.engine.generate(p, s) for p, s in zip(prompts, samplings, strict=True))
            )
    except ValueError as error:  # the engine's own checks: token ids, sampling ranges
        return bad_request(str(error))
    answers = [
        response_from_generation(
            generation,
            request_id=f"{next(served.request_ids)}",
            num_prompt_tokens=len(prompt),
            text=served.tokenizer.decode(generation.completion_ids, skip_special_tokens=True),
            return_logprob=parsed.return_logprob,
        )
        for prompt, generation in zip(prompts, generations, strict=True)
    ]
    return web.json_response(answers if parsed.is_batch else answers[0])


def load_checkpoint(path: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A Hugging Face checkpoint directory's weights, keyed like the served model's."""
    return load_causal_lm(path, dtype=dtype).state_dict()


async def update_weights_from_disk(request: web.Request) -> web.Response:
    served = request.app[ENGINE_KEY]
    parsed = await read_body(request, WireUpdateWeightsFromDisk)
    if isinstance(parsed, web.Response):
        return parsed
    if not Path(parsed.model_path).is_dir():
        message = f"model_path {parsed.model_path!r} is not a checkpoint directory on this server"
        return web.json_response({"success": False, "message": message, "num_paused_requests": 0}, status=400)
    async with served.admin_lock:
        # SGLang keeps the served version when the request names none (strict); this server counts up.
        version = served.policy_version + (0 if served.strict else 1)
        if parsed.weight_version is not None:
            if not parsed.weight_version.isdigit():
                return bad_request(
                    f"field 'weight_version': must be a decimal policy version (got {parsed.weight_version!r})"
                )
            version = int(parsed.weight_version)
        try:
            state_dict = await asyncio.to_thread(load_checkpoint, parsed.model_path, served.dtype)
            if served.strict:  # SGLang's writer lock: requests in flight finish, new ones wait
                async with served.traffic.exclusive():
                    await served.engine.update_weights(state_dict, version=version)
            else:
                await served.engine.update_weights(state_dict, version=version)
        except (OSError, ValueError) as error:  # no checkpoint there, or not this model's shapes
            message = f"cannot load {parsed.model_path!r}: {error}"
            return web.json_response(
                {"success": False, "message": message, "num_paused_requests": 0}, status=400
            )
        served.policy_version = version
    message = f"Succeeded to update model weights from {parsed.model_path} (weight_version {version})."
    return web.json_response({"success": True, "message": message, "num_paused_requests": 0})


async def flush_cache(request: web.Request) -> web.Response:
    served = request.app[ENGINE_KEY]
    if served.strict and not served.traffic.idle:
        refused = await strict_flush_refusal(request, served.traffic)
        if refused is not None:
            return refused
    async with served.admin_lock:
        # An update with no tensors is fenced like any other: it waits for earlier requests,
        # then drops the prefix cache (whose keys/values belong to the weights) and keeps the version.
        await served.engine.update_weights({}, version=served.policy_version)
    return web.Response(text="Cache flushed.\n")


async def strict_flush_refusal(request: web.Request, traffic: Traffic) -> web.Response | None:
    """SGLang's answer to a flush while requests run: 400 at once, or after `?timeout=` (None: idle now)."""
    try:
        timeout_s = float(request.query.get("timeout", "0"))
    except ValueError:
        return bad_request(
            f"query 'timeout': must be a number of seconds >= 0 (got {request.query['timeout']!r})"
        )
    if timeout_s <= 0:
        return web.Response(status=400, text=sglang_rules.FLUSH_REFUSED + "\n")
    if not await traffic.wait_idle(timeout_s):
        return web.Response(status=400, text=sglang_rules.FLUSH_TIMED_OUT + "\n")
    return None


async def read_memory_tags(request: web.Request) -> WireMemoryTags | web.Response:
    """The optional `tags` body of the memory routes (GET, or POST without a body: all tags)."""
    if not request.can_read_body:
        return WireMemoryTags()
    return await read_body(request, WireMemoryTags)


async def release_memory_occupation(request: web.Request) -> web.Response:
    served = request.app[ENGINE_KEY]
    if served.strict:
        tags = await read_memory_tags(request)
        if isinstance(tags, web.Response):
            return tags
        if not served.traffic.idle:
            return bad_request(sglang_rules.RELEASE_REFUSED)
        served.released_tags.update(tags.resolved())
    served.released = True
    message = "generation paused; the built-in engine keeps its weights and KV slots allocated"
    return web.json_response({"success": True, "message": message})


async def resume_memory_occupation(request: web.Request) -> web.Response:
    served = request.app[ENGINE_KEY]
    if served.strict:
        tags = await read_memory_tags(request)
        if isinstance(tags, web.Response):
            return tags
        not_released = [tag for tag in tags.resolved() if tag not in served.released_tags]
        if not_released:
            return bad_request(
                f"cannot resume {not_released}: not released (released: {sorted(served.released_tags)})"
            )
        served.released_tags.difference_update(tags.resolved())
        if served.released_tags:  # generation needs every region back
            return web.json_response(
                {"success": True, "message": f"still released: {sorted(served.released_tags)}"}
            )
    served.released = False
    return web.json_response({"success": True, "message": "generation resumed"})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def get_model_info(request: web.Request) -> web.Response:
    served = request.app[ENGINE_KEY]
    if served.strict and request.path == "/get_model_info":
        return bad_request(sglang_rules.GET_MODEL_INFO_REFUSED, status=404)
    info: dict[str, Any] = {
        "model_path": served.model_path,
        "tokenizer_path": served.model_path,
        "served_model_name": served.model_path,
        "is_generation": True,
        "weight_version": str(served.policy_version),
    }
    return web.json_response(info)


@web.middleware
async def require_api_key(request: web.Request, handler: Any) -> web.StreamResponse:
    """With an API key set, every route but /health needs 'Authorization: Bearer KEY' (as SGLang's)."""
    key = request.app[ENGINE_KEY].api_key
    if key is not None and request.path not in OPEN_ROUTES:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(given.encode(), key.encode()):
            return bad_request("missing or wrong 'Authorization: Bearer <api key>' header", status=401)
    return await handler(request)


def build_app(served: ServedEngine) -> web.Application:
    """The aiohttp application; the caller owns the engine and closes it."""
    app = web.Application(middlewares=[require_api_key], client_max_size=64 << 20)
    app[ENGINE_KEY] = served
    app.router.add_post("/generate", generate)
    app.router.add_put("/generate", generate)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    for path, handler in [
        ("/flush_cache", flush_cache),
        ("/release_memory_occupation", release_memory_occupation),
        ("/resume_memory_occupation", resume_memory_occupation),
    ]:
        app.router.add_get(path, handler)
        app.router.add_post(path, handler)
    app.router.add_get("/health", health)
    app.router.add_get("/get_model_info", get_model_info)
    app.router.add_get("/model_info", get_model_info)
    return app
