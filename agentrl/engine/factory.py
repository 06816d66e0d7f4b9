"""Set-up stage for inference: build the engine a config asks for, behind the one `InferenceEngine` protocol."""

from __future__ import annotations

from agentrl.engine.config import EngineConfig, ModelConfig
from agentrl.engine.protocol import InferenceEngine
from agentrl.model_path import resolve_model_path


def build_engine(
    model: ModelConfig, engine: EngineConfig, *, seed: int, policy_version: int = 0
) -> InferenceEngine:
    """The built-in engine in this process, or a client of an SGLang-protocol server.

    Every engine agentrl runs is built here, from the `model` and `engine` sections: by the
    trainer (one process, torchrun, Ray colocated), by the Ray engine servers, by
    `python -m agentrl.engine.serve`, by the debugger and by the engine benchmarks.
    The built-in engine loads `model.path` in `model.dtype` onto `engine.device` and starts at
    `policy_version`; a server reports its own. With `engine.launch=true` the server is started
    here, with `model.dtype` and `seed`, and stopped by the engine's `close()`; with `engine.url`
    the server must already answer, reporting a decimal weight_version.
    """
    model_path = resolve_model_path(model.path)
    if engine.backend == "transformers":
        from agentrl.engine.builtin.engine import TransformersEngine

        return TransformersEngine.from_pretrained(
            model_path, engine, dtype=model.dtype, seed=seed, policy_version=policy_version
        )
    from agentrl.engine.remote.sglang_client import SGLangEngine
    from agentrl.engine.remote.sglang_launcher import LaunchedServer, probe_server
    from agentrl.engine.remote.weight_sender import DistributedSyncSettings

    server = None
    if engine.launch:
        server = LaunchedServer.start(
            model_path,
            port=engine.launch_port,
            dtype=model.dtype,
            seed=seed,
            deterministic=engine.deterministic,
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
        dtype=model.dtype,  # the launched server's --dtype; an attached one must match it
        request_timeout_s=engine.request_timeout_s,
        max_retries=engine.max_retries,
        max_connections=engine.max_connections,
        weights_dir=engine.weights_dir,
        api_key=engine.api_key,
        server=server,
        distributed_sync=DistributedSyncSettings.from_config(engine),
    )
