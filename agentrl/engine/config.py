"""Inference stage settings: which policy weights the engine serves, and which engine serves them."""

from __future__ import annotations

import argparse
from typing import Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentrl.renderers.names import AUTO, RENDERER_NAMES, check_renderer_name
from agentrl.run_files import PathSetting


class ModelConfig(BaseModel):
    """The policy's weights and tokenizer, shared by the engine and the policy workers."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    path: PathSetting = Field(
        "tiny", description="HF checkpoint dir or hub id; 'tiny', 'tiny_think' = bundled offline policies"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights dtype")
    renderer: str = Field(
        AUTO,
        description="the model family's renderer (chat template kwargs, tool-call parser, stop tokens): "
        f"auto = detected from the tokenizer's chat template; one of {', '.join(RENDERER_NAMES)}",
    )

    @field_validator("renderer")
    @classmethod
    def _known_renderer(cls, name: str) -> str:
        return check_renderer_name(name)


# Knobs that only one backend reads; setting one for the other backend is an error, not a no-op.
BUILT_IN_KNOBS = (
    "device", "max_batch_size", "max_prefill_tokens", "prefix_cache_bytes", "prefix_block_size", "cuda_graphs",
    "prefill_interval", "torch_compile", "fused_forward", "decode_lookahead",
)  # fmt: skip
_SGLANG_ONLY = (
    "url", "launch", "launch_port", "launch_args", "startup_timeout_s", "request_timeout_s",
    "max_retries", "max_connections", "weights_dir", "api_key", "deterministic",
)  # fmt: skip
_LAUNCH_ONLY = ("launch_port", "launch_args", "startup_timeout_s")
_DISTRIBUTED_SYNC_ONLY = ("weight_sync_bucket_bytes", "weight_sync_timeout_s")


class EngineConfig(BaseModel):
    """Which engine serves rollouts: the built-in one in process, or an SGLang-protocol server.

    `backend=transformers`: the built-in continuous-batching engine on transformers (CPU or one
    GPU), in this process. `backend=sglang`: an HTTP client of SGLang's native protocol, attached
    to a running server (`url`; SGLang itself or `python -m agentrl.engine.serve`) or to one it
    launches (`launch=true` runs `python -m sglang.launch_server`).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    backend: Literal["transformers", "sglang"] = Field(
        "transformers", description="which engine serves rollouts"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="built-in engine: auto = cuda when available"
    )
    max_batch_size: int = Field(
        64, gt=0, description="built-in engine: sequences decoded together in one pass"
    )
    max_prefill_tokens: int = Field(
        8192,
        gt=0,
        description="built-in engine: prompt tokens prefilled together in one iteration "
        "(left padding counts where a pass computes it: not with the fused forward on CUDA)",
    )
    prefix_cache_bytes: int = Field(
        1 << 30,
        ge=0,
        description="built-in engine: KV bytes kept for prefix reuse (LRU); 0 turns the cache off",
    )
    prefix_block_size: int = Field(16, gt=0, description="built-in engine: tokens per cached prefix block")
    cuda_graphs: bool = Field(
        True,
        description="built-in engine: replay decode steps, and the fused forward's small prefill passes, as CUDA graphs (GPU only)",
    )
    prefill_interval: int = Field(
        1, gt=0, description="built-in engine: decode steps between prefills (8 batches multi-turn prefills)"
    )
    torch_compile: bool = Field(
        False,
        description="built-in engine: compile decoder layers' MLP and RMSNorms where transformers' modules run "
        "(CPU, or models fused_forward does not serve)",
    )
    fused_forward: bool = Field(
        True,
        description="built-in engine on CUDA: run Llama/Qwen2 models through the engine's Triton-fused forward "
        "pass; false runs transformers' modules",
    )
    decode_lookahead: int | None = Field(
        None,
        ge=0,
        description="built-in engine: decode steps launched before the host reads a step's tokens "
        "(covers the host's pauses; a row a stop token ends computes that many dropped tokens); "
        "null = 4 on CUDA, 0 on CPU",
    )
    url: str | None = Field(
        None, description="sglang: base URL of a running server, e.g. http://127.0.0.1:30000"
    )
    launch: bool = Field(
        False, description="sglang: launch `python -m sglang.launch_server` and stop it on close"
    )
    launch_port: int = Field(0, ge=0, le=65535, description="sglang launch: server port; 0 = a free port")
    launch_args: list[str] = Field(
        default_factory=list,
        description="sglang launch: extra server arguments, e.g. ['--mem-fraction-static', '0.5']",
    )
    startup_timeout_s: float = Field(600.0, gt=0, description="sglang launch: wait this long for /health")
    request_timeout_s: float = Field(
        600.0, gt=0, description="sglang: deadline of one call (generate or weight update), retries included"
    )
    max_retries: int = Field(
        3, ge=0, description="sglang: retries of a call after a connection failure or 5xx"
    )
    max_connections: int = Field(256, gt=0, description="sglang: open connections to the server at most")
    weights_dir: PathSetting | None = Field(
        None,
        description="sglang: where update_weights writes the checkpoint the server loads (a path the server "
        "can read); None = a temporary directory, removed on close",
    )
    api_key: str | None = Field(
        None, description="sglang: sent as 'Authorization: Bearer KEY' (server --api-key)"
    )
    weight_sync: Literal["disk", "distributed"] = Field(
        "disk",
        description="how new weights reach a server (engine=sglang or ray.placement=split): disk = a Hugging Face "
        "export the server loads (/update_weights_from_disk; needs a path both can read); distributed = "
        "broadcast over a process group the trainer opens with the servers (/init_weights_update_group, "
        "/update_weights_from_distributed; NCCL from a GPU trainer, gloo from CPU; needs the servers to reach "
        "the trainer's address and a free port on it)",
    )
    weight_sync_bucket_bytes: int = Field(
        512 << 20, gt=0, description="weight_sync=distributed: bytes sent per request and broadcast at most"
    )
    weight_sync_timeout_s: float = Field(
        120.0,
        gt=0,
        description="weight_sync=distributed: deadline of each transfer (joining the group, each bucket); past it "
        "the sync fails with WeightSyncTimeout instead of waiting on a peer that never answers",
    )
    deterministic: bool = Field(
        False,
        description="sglang: the server honours each request's sampling seed (launch adds "
        "--enable-deterministic-inference; an attached server must run with it); false: SGLang ignores seeds",
    )

    def seed_warning(self) -> str | None:
        """Why sampling seeds will not reproduce a rollout, or None when they will."""
        if (
            self.backend != "sglang"
            or self.deterministic
            or "--enable-deterministic-inference" in self.launch_args
        ):
            return None
        return (
            "engine=sglang with engine.deterministic=false: SGLang ignores every request's sampling_seed "
            "unless it runs with --enable-deterministic-inference, so rollouts cannot be replayed from their "
            "seeds; set engine.deterministic=true (engine.launch adds the flag; start an attached server with it)"
        )

    def _differs_from_default(self, name: str) -> bool:
        # Compared by value, not by "was it given": a run's dumped config lists every field.
        default = type(self).model_fields[name].get_default(call_default_factory=True)
        return getattr(self, name) != default

    @model_validator(mode="after")
    def _knobs_fit_the_backend(self) -> EngineConfig:
        wrong = _SGLANG_ONLY if self.backend == "transformers" else BUILT_IN_KNOBS
        misplaced = [name for name in wrong if self._differs_from_default(name)]
        if misplaced:
            raise ValueError(
                f"engine.{misplaced[0]} does not apply to engine.backend={self.backend}; "
                + (
                    "select the SGLang client with engine=sglang"
                    if self.backend == "transformers"
                    else "the server sizes its own batches (pass e.g. --max-running-requests in engine.launch_args)"
                )
            )
        if self.backend == "sglang" and (self.url is None) == (not self.launch):
            raise ValueError(
                f"engine=sglang needs exactly one of engine.url (attach; got {self.url!r}) or "
                f"engine.launch=true (start a server; got {self.launch})"
            )
        if not self.launch:
            unused = [name for name in _LAUNCH_ONLY if self._differs_from_default(name)]
            if unused:
                raise ValueError(f"engine.{unused[0]} is read only with engine.launch=true")
        if self.weight_sync == "disk":
            unused = [name for name in _DISTRIBUTED_SYNC_ONLY if self._differs_from_default(name)]
            if unused:
                raise ValueError(f"engine.{unused[0]} is read only with engine.weight_sync=distributed")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"engine.url={self.url!r} must start with http:// or https://")
        return self


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per built-in knob (`--max-batch-size N`, `--cuda-graphs/--no-cuda-graphs`, ...).

    For command lines outside the config system (`python -m agentrl.engine.serve`, the engine
    benchmarks): each flag's help and default are its `EngineConfig` field's (a parser may
    `set_defaults` its own), and `engine_config_from_flags` turns the parsed flags into the section.
    """
    for name in BUILT_IN_KNOBS:
        field = EngineConfig.model_fields[name]
        default = field.get_default(call_default_factory=True)
        options = {"dest": name, "default": default, "help": f"{field.description} (default: %(default)s)"}
        if field.annotation is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif get_origin(field.annotation) is Literal:
            options["choices"] = get_args(field.annotation)
        else:  # an int, or an int the engine may choose (None)
            options["type"] = int
        parser.add_argument("--" + name.replace("_", "-"), **options)


def engine_config_from_flags(args: argparse.Namespace) -> EngineConfig:
    """The built-in engine's section, from flags that `add_engine_flags` added to a parser."""
    return EngineConfig(**{name: getattr(args, name) for name in BUILT_IN_KNOBS})
