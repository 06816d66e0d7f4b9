"""Inference stage, over HTTP: the subset of SGLang's native protocol that agentrl speaks.

One module for both sides of the wire, so the client (`sglang_client`) and the built-in
engine's server (`http_server`) cannot drift apart. The shapes follow SGLang 0.5.23's HTTP JSON
contract (`sglang.api.v1.api_types`: `GenerateRequest`, `SamplingParams`, `GenerateResponse`,
`GenerateMetaInfo`, `LogprobEntry`, `FinishStop`/`FinishLength`/`FinishAbort`,
`GetModelInfoResponse`; `sglang.srt.managers.io_struct.UpdateWeightFromDiskReqInput`):

- `POST /generate` takes `input_ids` (one prompt, or a list of prompts), `sampling_params` and
  `return_logprob`; each answer carries `output_ids` and `meta_info` with `finish_reason`
  (`{"type": "stop", "matched": ...}` or `{"type": "length", "length": n}`),
  `output_token_logprobs` as `[logprob, token_id, text]` triples and `weight_version`.
- The policy version travels as SGLang's own `weight_version`, a string: agentrl writes the
  decimal step number, so a server must start at version "0" (SGLang: `--weight-version 0`).

Requests the server accepts are pydantic models that forbid unknown fields: a knob the
built-in engine cannot honour is refused with a 400 naming it, never silently dropped.
Responses are parsed leniently (unknown fields ignored) because SGLang returns many more.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentrl.engine.protocol import FinishReason, Generation, SamplingParams

SGLANG_VERSION = "0.5.23"  # the release whose API definitions these shapes were checked against


class EngineRequestError(RuntimeError):
    """The server could not be reached, refused a request or answered something unusable."""


# ---- requests (built by the client, validated by the server) ----


class WireSamplingParams(BaseModel):
    """`sampling_params` of `/generate`: the fields the built-in engine implements."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(128, ge=1)  # SGLang's default is 128 too
    temperature: float = Field(1.0, ge=0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)  # -1 = whole vocabulary
    stop_token_ids: list[int] | None = None
    sampling_seed: int | None = None

    @model_validator(mode="after")
    def _top_k_is_positive_or_off(self) -> WireSamplingParams:
        if self.top_k == 0:
            raise ValueError("top_k=0 must be >= 1, or -1 to disable top-k")
        return self

    def to_sampling(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.sampling_seed,
            stop_token_ids=tuple(self.stop_token_ids or ()),
        )


class WireGenerateRequest(BaseModel):
    """`POST /generate` body: one prompt (`input_ids: [int]`) or a batch (`[[int]]`)."""

    model_config = ConfigDict(extra="forbid")

    input_ids: list[int] | list[list[int]]
    sampling_params: WireSamplingParams | list[WireSamplingParams] = Field(default_factory=WireSamplingParams)
    return_logprob: bool = False
    rid: str | list[str] | None = None
    stream: Literal[False] = False  # streaming is not served

    @property
    def is_batch(self) -> bool:
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)

    def prompts(self) -> list[list[int]]:
        return self.input_ids if self.is_batch else [self.input_ids]  # type: ignore[return-value]

    def samplings(self) -> list[SamplingParams]:
        """One SamplingParams per prompt: a shared dict applies to every prompt of a batch."""
        num_prompts = len(self.prompts())
        if isinstance(self.sampling_params, list):
            if not self.is_batch or len(self.sampling_params) != num_prompts:
                raise ValueError(
                    f"sampling_params is a list of {len(self.sampling_params)}; it needs one entry per "
                    f"prompt of a batched input_ids ({num_prompts} prompts), or pass one dict for all"
                )
            return [params.to_sampling() for params in self.sampling_params]
        return [self.sampling_params.to_sampling()] * num_prompts


class WireUpdateWeightsFromDisk(BaseModel):
    """`POST /update_weights_from_disk` body (SGLang's `UpdateWeightFromDiskReqInput` subset)."""

    model_config = ConfigDict(extra="forbid")

    model_path: str
    weight_version: str | None = None  # None: up by one (with --strict-sglang, as SGLang: it stays)


class WireInitWeightsUpdateGroup(BaseModel):
    """`POST /init_weights_update_group` body (SGLang's `InitWeightsUpdateGroupReqInput`,
    python/sglang/srt/managers/io_struct.py): join the trainer's group as rank `rank_offset`."""

    model_config = ConfigDict(extra="forbid")

    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1)  # rank 0 is the trainer
    world_size: int = Field(ge=2)
    group_name: str = Field("weight_update_group", min_length=1)
    backend: Literal["nccl", "gloo"] = "nccl"


class WireUpdateWeightsFromDistributed(BaseModel):
    """`POST /update_weights_from_distributed` body (SGLang's `UpdateWeightsFromDistributedReqInput`):
    receive the named tensors from rank 0's broadcast; `load_format="flattened_bucket"` is one
    broadcast of their concatenated bytes, None one broadcast per tensor."""

    model_config = ConfigDict(extra="forbid")

    names: list[str] = Field(min_length=1)
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    weight_version: str | None = None  # None: the served version stays
    load_format: Literal["flattened_bucket"] | None = None

    @model_validator(mode="after")
    def _one_dtype_and_shape_per_name(self) -> WireUpdateWeightsFromDistributed:
        if not len(self.names) == len(self.dtypes) == len(self.shapes):
            raise ValueError(
                f"names, dtypes and shapes need one entry per tensor (got {len(self.names)}, "
                f"{len(self.dtypes)}, {len(self.shapes)})"
            )
        return self


def generate_payload(prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
    """The `/generate` body for one prompt; defaults are left out so the server's apply."""
    params: dict[str, Any] = {
        "max_new_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
    }
    if sampling.stop_token_ids:
        params["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    return {"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": True}


# ---- responses (built by the server, parsed by the client) ----


class WireFinishReason(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["stop", "length", "abort"]
    matched: int | str | list[int] | None = None  # stop: the token id or string that matched
    length: int | None = None  # length: tokens generated
    message: str | None = None  # abort: why


class WireMetaInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = ""
    finish_reason: WireFinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    output_token_logprobs: list[tuple[float | None, int, str | None]] | None = None  # [logprob, id, text]
    weight_version: str | None = None


class WireGenerateResponse(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str = ""
    output_ids: list[int] | None = None
    meta_info: WireMetaInfo


def parse_version(weight_version: str | None) -> int:
    """agentrl's policy version from SGLang's `weight_version` string."""
    if weight_version is None or not weight_version.strip().isdigit():
        raise EngineRequestError(
            f"server reports weight_version={weight_version!r}; agentrl needs the decimal policy version "
            "(start SGLang with --weight-version 0)"
        )
    return int(weight_version)


def generation_from_response(body: Any) -> Generation:
    """Turn one `/generate` answer into a Generation; anything unusable raises EngineRequestError."""
    try:
        response = WireGenerateResponse.model_validate(body)
    except ValidationError as error:
        raise EngineRequestError(f"/generate answered a body agentrl cannot read: {error}") from None
    meta = response.meta_info
    if meta.finish_reason is None:
        raise EngineRequestError("/generate answered an unfinished generation (finish_reason null)")
    if meta.finish_reason.type == "abort":
        raise EngineRequestError(f"the server aborted the generation: {meta.finish_reason.message}")
    if meta.output_token_logprobs is None:
        raise EngineRequestError("/generate answered without meta_info.output_token_logprobs")
    # The triples carry each sampled token with its logprob; they are the source of truth.
    completion_ids = [token_id for _, token_id, _ in meta.output_token_logprobs]
    logprobs = [logprob for logprob, _, _ in meta.output_token_logprobs]
    if any(logprob is None for logprob in logprobs):
        raise EngineRequestError("/generate answered a null logprob for a sampled token")
    finish = FinishReason.STOP if meta.finish_reason.type == "stop" else FinishReason.LENGTH
    return Generation(completion_ids, logprobs, finish, parse_version(meta.weight_version))


def response_from_generation(
    generation: Generation, *, request_id: str, num_prompt_tokens: int, text: str, return_logprob: bool
) -> dict[str, Any]:
    """The `/generate` answer for one completion, in SGLang's shape."""
    if generation.finish_reason is FinishReason.STOP:
        finish = {"type": "stop", "matched": generation.completion_ids[-1]}
    else:
        finish = {"type": "length", "length": len(generation.completion_ids)}
    meta_info: dict[str, Any] = {
        "id": request_id,
        "finish_reason": finish,
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": len(generation.completion_ids),
        "weight_version": str(generation.policy_version),
    }
    if return_logprob:
        meta_info["output_token_logprobs"] = [
            [logprob, token_id, None]
            for logprob, token_id in zip(generation.logprobs, generation.completion_ids, strict=True)
        ]
        meta_info["output_token_logprobs_length"] = len(generation.completion_ids)
    return {"text": text, "output_ids": list(generation.completion_ids), "meta_info": meta_info}
