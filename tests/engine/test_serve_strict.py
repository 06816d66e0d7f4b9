"""`--strict-sglang`: the built-in server keeps SGLang 0.5.23's runtime rules (`serve/sglang_rules.py`).

Driven in process over real HTTP. The served model is a tiny random one whose greedy completion
of PROMPT runs the full LONG budget (its EOS never wins), so a request stays running for a while
on two CPU cores: long enough to send another call while it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from agentrl.engine.builtin.engine import TransformersEngine
from agentrl.engine.serve.http_server import ServedEngine, build_app
from tests.engine.conftest import on_cpu, tiny_qwen2, word_tokenizer

PROMPT = [5, 6, 7, 8]
LONG = {"max_new_tokens": 400, "temperature": 0}  # runs to length: about a second here
EOS_TOKEN_ID = 2  # greedy decoding of PROMPT never picks it


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("random_model")
    tiny_qwen2(max_position_embeddings=512).save_pretrained(directory)
    word_tokenizer(eos_token_id=EOS_TOKEN_ID).save_pretrained(directory)
    return directory


async def start(
    checkpoint: Path, *, strict: bool = True, deterministic: bool = False
) -> tuple[TestClient, ServedEngine]:
    engine = TransformersEngine.from_pretrained(str(checkpoint), on_cpu())
    tokenizer = word_tokenizer(eos_token_id=EOS_TOKEN_ID)
    served = ServedEngine(
        engine, tokenizer, str(checkpoint), torch.float32, strict=strict, deterministic=deterministic
    )
    client = TestClient(TestServer(build_app(served)))
    await client.start_server()
    return client, served


@pytest.fixture
async def strict(checkpoint: Path) -> AsyncIterator[tuple[TestClient, ServedEngine]]:
    client, served = await start(checkpoint)
    yield client, served
    await client.close()
    await served.engine.close()


async def generate(client: TestClient, sampling: dict) -> dict:
    response = await client.post("/generate", json={"input_ids": PROMPT, "sampling_params": sampling})
    assert response.status == 200, await response.text()
    return await response.json()


async def running_request(client: TestClient, served: ServedEngine) -> asyncio.Task:
    """A long /generate, returned once the server counts it as running."""
    task = asyncio.create_task(generate(client, LONG))
    while served.traffic.num_in_flight == 0:
        await asyncio.sleep(0.002)
    return task


async def test_a_flush_while_a_request_runs_is_refused_and_succeeds_once_idle(strict) -> None:
    client, served = strict
    request = await running_request(client, served)
    response = await client.post("/flush_cache")
    assert response.status == 400
    assert "Cache not flushed because there are running or waiting requests" in await response.text()
    assert (await request)["meta_info"]["finish_reason"] == {"type": "length", "length": 400}
    response = await client.post("/flush_cache")
    assert (response.status, await response.text()) == (200, "Cache flushed.\n")


async def test_a_flush_with_a_timeout_waits_for_the_running_request(strict) -> None:
    client, served = strict
    request = await running_request(client, served)
    response = await client.post("/flush_cache", params={"timeout": "60"})
    assert response.status == 200  # answered once the request had finished, not refused at once
    request = await running_request(client, served)
    response = await client.post("/flush_cache", params={"timeout": "0.01"})
    assert (response.status, await response.text()) == (400, "Timed out waiting for idle state.\n")
    await request


async def test_a_weight_update_waits_for_running_requests_and_holds_new_ones(strict, checkpoint) -> None:
    client, served = strict
    before = await running_request(client, served)
    update = asyncio.create_task(
        client.post("/update_weights_from_disk", json={"model_path": str(checkpoint), "weight_version": "5"})
    )
    while not served.traffic.updating:
        await asyncio.sleep(0.002)
    after = asyncio.create_task(generate(client, {"max_new_tokens": 2}))
    response = await update
    assert (response.status, (await response.json())["success"]) == (200, True)
    assert (await before)["meta_info"]["weight_version"] == "0"  # and it finished on the old weights
    assert (await after)["meta_info"]["weight_version"] == "5"  # the held request ran on the new ones


async def test_an_update_without_a_version_keeps_the_served_one(strict, checkpoint) -> None:
    client, _ = strict
    response = await client.post("/update_weights_from_disk", json={"model_path": str(checkpoint)})
    assert response.status == 200
    assert (await (await client.get("/model_info")).json())["weight_version"] == "0"


async def test_sampling_seeds_are_read_only_with_deterministic_inference(checkpoint) -> None:
    seeded = {"max_new_tokens": 16, "temperature": 1.0, "sampling_seed": 7}
    for deterministic in (False, True):
        client, served = await start(checkpoint, deterministic=deterministic)
        try:
            answers = [(await generate(client, seeded))["output_ids"] for _ in range(3)]
            unseeded = (await generate(client, {**seeded, "sampling_seed": None}))["output_ids"]
            seed_42 = (await generate(client, {**seeded, "sampling_seed": 42}))["output_ids"]
        finally:
            await client.close()
            await served.engine.close()
        if deterministic:
            assert answers == [answers[0]] * 3
            assert unseeded == seed_42  # SGLang's seed for a request that brings none
        else:
            assert len({tuple(answer) for answer in answers}) == 3  # the seed was not read


async def test_get_model_info_is_refused_and_model_info_answers(strict) -> None:
    client, _ = strict
    response = await client.get("/get_model_info")
    assert response.status == 404
    assert "use /model_info" in (await response.json())["error"]["message"]
    response = await client.get("/model_info")
    assert (response.status, (await response.json())["weight_version"]) == (200, "0")


async def test_memory_is_released_only_while_idle_and_resumed_only_where_released(strict) -> None:
    client, served = strict
    request = await running_request(client, served)
    response = await client.post("/release_memory_occupation", json={})
    assert response.status == 400
    assert "only when server is idle" in (await response.json())["error"]["message"]
    await request
    assert (await client.post("/release_memory_occupation", json={"tags": ["kv_cache"]})).status == 200
    response = await client.post("/resume_memory_occupation", json={"tags": ["weights"]})
    assert response.status == 400
    assert "cannot resume ['weights']: not released" in (await response.json())["error"]["message"]
    assert (await client.post("/resume_memory_occupation", json={"tags": ["kv_cache"]})).status == 200
    await generate(client, {"max_new_tokens": 1})


async def test_the_lenient_server_flushes_after_running_requests_instead(checkpoint) -> None:
    client, served = await start(checkpoint, strict=False)
    try:
        request = await running_request(client, served)
        response = await client.post("/flush_cache")
        assert response.status == 200
        await request
    finally:
        await client.close()
        await served.engine.close()
