"""The built-in engine's SGLang-protocol routes, driven in process over real HTTP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer
from transformers import AutoTokenizer

from agentrl.engine.builtin.engine import TransformersEngine
from agentrl.engine.config import EngineConfig
from agentrl.engine.protocol import SamplingParams
from agentrl.engine.remote.sglang_client import SGLangEngine
from agentrl.engine.remote.sglang_protocol import EngineRequestError
from agentrl.engine.serve.__main__ import is_loopback, main
from agentrl.engine.serve.http_server import ServedEngine, build_app
from agentrl.tiny_policy import DEFAULT_MODEL_PATH

MODEL = str(DEFAULT_MODEL_PATH)
PROMPT = [1, 40, 41, 42, 43, 44]


async def start(api_key: str | None = None) -> tuple[TestClient, ServedEngine]:
    engine = TransformersEngine.from_pretrained(MODEL, EngineConfig(device="cpu", prefix_block_size=2))
    served = ServedEngine(engine, AutoTokenizer.from_pretrained(MODEL), MODEL, torch.float32, api_key=api_key)
    client = TestClient(TestServer(build_app(served)))
    await client.start_server()
    return client, served


@pytest.fixture
async def http() -> AsyncIterator[tuple[TestClient, ServedEngine]]:
    client, served = await start()
    yield client, served
    await client.close()
    await served.engine.close()


async def post(client: TestClient, path: str, body: object) -> tuple[int, object]:
    response = await client.post(path, json=body)
    return response.status, await response.json()


async def test_a_generate_answer_has_sglangs_shape(http) -> None:
    client, _ = http
    status, answer = await post(
        client,
        "/generate",
        {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0},
            "return_logprob": True,
        },
    )
    assert status == 200
    meta = answer["meta_info"]
    assert sorted(answer) == ["meta_info", "output_ids", "text"]
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["weight_version"]) == (6, 3, "0")
    assert [token_id for _, token_id, _ in meta["output_token_logprobs"]] == answer["output_ids"]
    assert [text for _, _, text in meta["output_token_logprobs"]] == [None, None, None]
    assert meta["output_token_logprobs_length"] == 3


async def test_logprobs_are_left_out_unless_asked_for(http) -> None:
    client, _ = http
    _, answer = await post(
        client, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}
    )
    assert "output_token_logprobs" not in answer["meta_info"]


async def test_a_batched_request_answers_one_result_per_prompt_in_order(http) -> None:
    client, _ = http
    greedy = {"max_new_tokens": 4, "temperature": 0}
    _, batch = await post(client, "/generate", {"input_ids": [PROMPT, PROMPT[:3]], "sampling_params": greedy})
    _, first = await post(client, "/generate", {"input_ids": PROMPT, "sampling_params": greedy})
    _, second = await post(client, "/generate", {"input_ids": PROMPT[:3], "sampling_params": greedy})
    assert [answer["output_ids"] for answer in batch] == [first["output_ids"], second["output_ids"]]
    assert [answer["meta_info"]["prompt_tokens"] for answer in batch] == [6, 3]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input_ids": PROMPT, "sampling_params": {"frequency_penalty": 0.5}}, "field 'sampling_params.frequency_penalty': not supported"),
        ({"input_ids": PROMPT, "sampling_params": {"top_p": 0}}, "field 'sampling_params.top_p': Input should be greater than 0"),
        ({"input_ids": PROMPT, "sampling_params": {"top_k": 0}}, "top_k=0 must be >= 1, or -1 to disable top-k"),
        ({"input_ids": PROMPT, "stream": True}, "field 'stream'"),
        ({"text": "hello"}, "field 'input_ids': Field required"),
        ({"input_ids": [1, 99999]}, "prompt token id 99999 is outside the vocabulary [0, 1024)"),
        ({"input_ids": [[1, 2], [3]], "sampling_params": [{}]}, "sampling_params is a list of 1; it needs one entry per"),
    ],
)  # fmt: skip
async def test_a_bad_generate_request_gets_a_400_naming_the_problem(http, body, message) -> None:
    client, _ = http
    status, answer = await post(client, "/generate", body)
    assert status == 400
    assert message in answer["error"]["message"]


async def test_update_weights_from_disk_refuses_a_path_that_is_not_a_checkpoint(http, tmp_path) -> None:
    client, served = http
    status, answer = await post(
        client, "/update_weights_from_disk", {"model_path": str(tmp_path / "missing")}
    )
    assert status == 400
    assert answer["success"] is False
    assert "is not a checkpoint directory on this server" in answer["message"]
    status, answer = await post(
        client, "/update_weights_from_disk", {"model_path": MODEL, "weight_version": "v2"}
    )
    assert (status, served.policy_version) == (400, 0)
    assert "field 'weight_version': must be a decimal policy version (got 'v2')" in answer["error"]["message"]


async def test_update_weights_from_disk_without_a_version_serves_the_next_one(http) -> None:
    client, served = http
    status, answer = await post(client, "/update_weights_from_disk", {"model_path": MODEL})
    assert (status, answer["success"]) == (200, True)
    info = await (await client.get("/get_model_info")).json()
    assert info["weight_version"] == "1"
    assert served.engine.policy_version == 1


async def test_flush_cache_drops_the_prefix_cache_and_keeps_the_version(http) -> None:
    client, served = http
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}}
    await post(client, "/generate", body)
    cached_before = served.engine.stats.num_prefix_cached_tokens
    await post(client, "/generate", body)
    assert served.engine.stats.num_prefix_cached_tokens > cached_before  # the repeat read the cache
    response = await client.post("/flush_cache")
    assert (response.status, await response.text()) == (200, "Cache flushed.\n")
    cached_before = served.engine.stats.num_prefix_cached_tokens
    await post(client, "/generate", body)
    assert served.engine.stats.num_prefix_cached_tokens == cached_before  # nothing left to read
    assert (served.engine.policy_version, served.policy_version) == (0, 0)


async def test_generation_is_refused_between_release_and_resume(http) -> None:
    client, _ = http
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}}
    status, answer = await post(client, "/release_memory_occupation", {})
    assert (status, answer["success"]) == (200, True)
    assert "keeps its weights and KV slots allocated" in answer["message"]
    status, answer = await post(client, "/generate", body)
    assert status == 503
    assert answer["error"]["message"] == "memory is released; POST /resume_memory_occupation first"
    await post(client, "/resume_memory_occupation", {})
    status, _ = await post(client, "/generate", body)
    assert status == 200


async def test_with_an_api_key_every_route_but_health_needs_it() -> None:
    client, served = await start(api_key="k3y")
    try:
        assert (await client.get("/health")).status == 200
        assert (await client.get("/get_model_info")).status == 401
        assert (await client.get("/get_model_info", headers={"Authorization": "Bearer wrong"})).status == 401
        assert (await client.get("/get_model_info", headers={"Authorization": "Bearer k3y"})).status == 200
    finally:
        await client.close()
        await served.engine.close()


async def test_the_sglang_client_sends_its_api_key() -> None:
    client, served = await start(api_key="k3y")
    url = str(client.make_url("")).rstrip("/")
    keyed, unkeyed = SGLangEngine(url, model_path=MODEL, api_key="k3y"), SGLangEngine(url, model_path=MODEL)
    try:
        generation = await keyed.generate(PROMPT, SamplingParams(max_new_tokens=2))
        assert len(generation.completion_ids) == 2
        with pytest.raises(EngineRequestError, match=r"refused \(HTTP 401\)"):
            await unkeyed.generate(PROMPT, SamplingParams(max_new_tokens=2))
    finally:
        await keyed.close()
        await unkeyed.close()
        await client.close()
        await served.engine.close()


def test_the_serve_command_refuses_a_public_bind_without_an_api_key() -> None:
    command = [sys.executable, "-m", "agentrl.engine.serve", "--model", "tiny", "--host", "0.0.0.0"]
    result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--host 0.0.0.0 is reachable from other machines; pass --api-key KEY as well" in result.stderr


def test_loopback_hosts_are_recognised_and_others_are_not() -> None:
    assert [is_loopback(h) for h in ["127.0.0.1", "::1", "localhost", "0.0.0.0", "10.0.0.2", "example.org"]] == [
        True, True, True, False, False, False,
    ]  # fmt: skip


def test_the_serve_command_names_a_model_path_it_cannot_load_and_exits_2(capsys) -> None:
    assert main(["--model", "/no/such/model", "--device", "cpu", "--port", "0"]) == 2
    assert capsys.readouterr().err == (
        "error: --model=/no/such/model: no such model directory; give a directory saved with "
        "save_pretrained, a hub id such as Qwen/Qwen2.5-0.5B-Instruct, or tiny or tiny_think (the bundled policies)\n"
    )
