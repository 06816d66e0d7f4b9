"""`engine=sglang` set-up: config checks, build_engine, and the launcher (driving agentrl.engine.serve,
which takes SGLang's launch flags, because SGLang cannot run on the CI machine)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
import torch
from aiohttp import web
from pydantic import ValidationError

from agentrl.config_loader import load_config
from agentrl.engine.builtin.engine import TransformersEngine
from agentrl.engine.config import EngineConfig, ModelConfig
from agentrl.engine.factory import build_engine
from agentrl.engine.protocol import SamplingParams
from agentrl.engine.remote.sglang_client import SGLangEngine
from agentrl.engine.remote.sglang_launcher import LaunchedServer, free_port
from agentrl.engine.remote.sglang_protocol import EngineRequestError
from agentrl.tiny_policy import DEFAULT_MODEL_PATH

MODEL = str(DEFAULT_MODEL_PATH)
BUILD = {"seed": 0}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "sglang"}, "engine=sglang needs exactly one of engine.url"),
        ({"backend": "sglang", "url": "http://h:1", "launch": True}, "engine=sglang needs exactly one of engine.url"),
        ({"url": "http://h:1"}, "engine.url does not apply to engine.backend=transformers"),
        ({"backend": "sglang", "url": "http://h:1", "max_batch_size": 8}, "engine.max_batch_size does not apply"),
        ({"backend": "sglang", "url": "http://h:1", "decode_lookahead": 2}, "engine.decode_lookahead does not apply"),
        ({"backend": "sglang", "url": "http://h:1", "launch_args": ["--tp", "2"]}, "engine.launch_args is read only"),
        ({"backend": "sglang", "url": "h:1"}, "engine.url='h:1' must start with http:// or https://"),
        ({"deterministic": True}, "engine.deterministic does not apply to engine.backend=transformers"),
    ],
)  # fmt: skip
def test_engine_settings_that_would_be_ignored_are_rejected(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace(".", r"\.")):
        EngineConfig(**fields)


def test_a_dumped_sglang_config_validates_again() -> None:
    config = EngineConfig(backend="sglang", launch=True, launch_args=["--mem-fraction-static", "0.5"])
    assert EngineConfig.model_validate(config.model_dump()) == config


async def test_build_engine_gives_the_built_in_engine_by_default() -> None:
    engine = build_engine(ModelConfig(), EngineConfig(device="cpu", max_batch_size=3), **BUILD)
    assert isinstance(engine, TransformersEngine)
    assert engine.max_batch_size == 3
    assert engine.decode_lookahead == 0  # the CPU's default
    await engine.close()
    engine = build_engine(ModelConfig(), EngineConfig(device="cpu", decode_lookahead=2), **BUILD)
    assert engine.decode_lookahead == 2
    await engine.close()


async def test_build_engine_refuses_a_server_that_does_not_report_a_decimal_version() -> None:
    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": "m", "weight_version": "default"})  # SGLang's default

    app = web.Application()
    app.router.add_get("/model_info", model_info)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        with pytest.raises(EngineRequestError, match=r"weight_version='default'.*--weight-version 0"):
            # build_engine is synchronous (it runs before the trainer's loop): run it off this loop.
            await asyncio.to_thread(
                build_engine,
                ModelConfig(),
                EngineConfig(backend="sglang", url=f"http://{host}:{port}"),
                **BUILD,
            )
    finally:
        await runner.cleanup()


def test_a_run_whose_sglang_server_ignores_seeds_is_warned_once() -> None:
    (warning,) = load_config(["engine=sglang", "engine.url=http://127.0.0.1:1"]).warnings()
    assert "SGLang ignores every request's sampling_seed" in warning
    assert "set engine.deterministic=true" in warning
    assert (
        load_config(
            ["engine=sglang", "engine.url=http://127.0.0.1:1", "engine.deterministic=true"]
        ).warnings()
        == []
    )
    assert load_config([]).warnings() == []  # the built-in engine reads every seed


async def test_build_engine_exports_weights_in_the_models_dtype() -> None:
    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": "m", "weight_version": "0"})

    app = web.Application()
    app.router.add_get("/model_info", model_info)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        engine = await asyncio.to_thread(
            build_engine,
            ModelConfig(dtype="bfloat16"),
            EngineConfig(backend="sglang", url=f"http://{host}:{port}"),
            **BUILD,
        )
        assert engine.dtype == torch.bfloat16
        await engine.close()
    finally:
        await runner.cleanup()


def test_build_engine_names_an_unreachable_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineRequestError, match=f"no SGLang-protocol server answers at engine.url={url}"):
        build_engine(ModelConfig(), EngineConfig(backend="sglang", url=url), **BUILD)


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed here")
def test_launching_without_sglang_installed_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="'sglang' is not installed here; install SGLang, or start a server"):
        build_engine(ModelConfig(), EngineConfig(backend="sglang", launch=True), **BUILD)


async def test_a_launched_server_answers_and_is_stopped_by_close() -> None:
    server = await asyncio.to_thread(
        LaunchedServer.start,
        MODEL,
        port=0,
        dtype="float32",
        seed=0,
        deterministic=True,
        extra_args=["--device", "cpu", "--strict-sglang"],  # reads seeds only with the flag, as SGLang
        startup_timeout_s=300,
        module="agentrl.engine.serve",
    )
    assert "--enable-deterministic-inference" in server.process.args
    engine = SGLangEngine(server.url, model_path=MODEL, server=server)
    generation = await engine.generate([1, 40, 41], SamplingParams(max_new_tokens=3, temperature=0.0))
    assert (len(generation.completion_ids), generation.policy_version) == (3, 0)
    seeded = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    first, second = [await engine.generate([1, 40, 41], seeded) for _ in range(2)]
    assert (first.completion_ids, first.logprobs) == (second.completion_ids, second.logprobs)
    await engine.close()
    assert server.process.returncode is not None


def test_a_server_that_dies_during_start_up_is_reported_with_its_log() -> None:
    with pytest.raises(EngineRequestError, match=r"exited with code 2 during start-up(.|\n)*--bogus-flag"):
        LaunchedServer.start(
            MODEL, port=0, dtype="float32", seed=0, extra_args=["--bogus-flag"], startup_timeout_s=300,
            module="agentrl.engine.serve",
        )  # fmt: skip
