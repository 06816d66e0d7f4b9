"""Set-up stage for inference: build the engine a config asks for, behind the one `InferenceEngine` protocol."""

from __future__ import annotations

import torch

from agentrl.engine.config import EngineConfig, ModelConfig
from agentrl.engine.protocol import InferenceEngine


def build_engine(
    model: ModelConfig, engine: EngineConfig, *, model_path: str, device: str, dtype: torch.dtype, seed: int
) -> InferenceEngine:
    """The built-in engine in this process, or a client of an SGLang-protocol server.

    `model_path` is the resolved checkpoint (not 'tiny'); `device` is the built-in engine's
    resolved device (a server places its own model). With `engine.launch=true` the server is
    started here, with `model.dtype` and `seed`, and stopped by the engine's `close()`; with
    `engine.url` the server must already answer, reporting a decimal weight_version.
    """
    if engine.backend == "transformers":
        from agentrl.engine.transformers_engine import TransformersEngine

        return TransformersEngine.from_pretrained(
            model_path,
            device=device,
            dtype=dtype,
            max_batch_size=engine.max_batch_size,
            max_prefill_tokens=engine.max_prefill_tokens,
            prefix_cache_bytes=engine.prefix_cache_bytes,
            prefix_block_size=engine.prefix_block_size,
            cuda_graphs=engine.cuda_graphs,
            prefill_interval=engine.prefill_interval,
            torch_compile=engine.torch_compile,
            fused_forward=engine.fused_forward,
            decode_lookahead=engine.decode_lookahead,
            seed=seed,
        )
    from agentrl.engine.sglang_client import SGLangEngine
    from agentrl.engine.sglang_launcher import LaunchedServer, probe_server

    server = None
    if engine.launch:
        server = LaunchedServer.start(
            model_path,
            port=engine.launch_port,
            dtype=model.dtype,
            seed=seed,
            extra_args=engine.launch_args,
            startup_timeout_s=engine.startup_timeout_s,
        )
        url = server.url
    else:
        assert engine.url is not None  # EngineConfig guarantees url or launch
        url = engine.url
    try:
        probe_server(url, timeout_s=min(engine.request_timeout_s, 30.0), api_key=engine.api_key)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    return SGLangEngine(
        url,
        model_path=model_path,
        request_timeout_s=engine.request_timeout_s,
        max_retries=engine.max_retries,
        max_connections=engine.max_connections,
        weights_dir=engine.weights_dir,
        api_key=engine.api_key,
        server=server,
    )
