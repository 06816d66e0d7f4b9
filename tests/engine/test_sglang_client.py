"""The SGLang client end to end against `python -m agentrl.engine.serve` running the bundled tiny policy.

The server runs with `--strict-sglang`, so it answers as SGLang would at run time too: a flush
while requests run is refused, and seeds are read only with `--enable-deterministic-inference`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import torch
from aiohttp import web
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from agentrl.engine.builtin.engine import TransformersEngine
from agentrl.engine.config import EngineConfig
from agentrl.engine.protocol import FinishReason, SamplingParams
from agentrl.engine.remote.sglang_client import SGLangEngine
from agentrl.engine.remote.sglang_launcher import free_port
from agentrl.engine.remote.sglang_protocol import EngineRequestError
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from tests.engine.served import start_served_engine, stop_served_engine

MODEL = str(DEFAULT_MODEL_PATH)
PROMPT = [1, 40, 41, 42, 43, 44]
SEEDED = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """One server for the module; single-threaded so its arithmetic matches the in-process engine."""
    process, url = start_served_engine("--strict-sglang", "--enable-deterministic-inference")
    try:
        yield url
    finally:
        assert stop_served_engine(process) == 0  # SIGTERM is a clean shutdown


@pytest.fixture
async def client(server_url: str) -> AsyncIterator[SGLangEngine]:
    engine = SGLangEngine(server_url, model_path=MODEL, request_timeout_s=120)
    yield engine
    await engine.close()


@pytest.fixture(scope="module")
def in_process() -> Iterator[TransformersEngine]:
    engine = TransformersEngine.from_pretrained(MODEL, EngineConfig(device="cpu", max_batch_size=64))
    yield engine
    asyncio.run(engine.close())


async def test_a_seeded_request_gets_the_same_tokens_and_logprobs_as_the_in_process_engine(
    client: SGLangEngine, in_process: TransformersEngine
) -> None:
    remote = await client.generate(PROMPT, SEEDED)
    local = await in_process.generate(PROMPT, SEEDED)
    assert remote.completion_ids == local.completion_ids
    assert remote.logprobs == local.logprobs  # JSON carries a float's repr, so nothing is rounded
    assert remote.finish_reason == local.finish_reason
    assert remote.policy_version == 0


async def test_concurrent_requests_each_get_their_own_seeded_completion(
    client: SGLangEngine, in_process: TransformersEngine
) -> None:
    requests = [
        ([1, 40 + i, 41, 42], SamplingParams(max_new_tokens=8, temperature=1.0, seed=100 + i))
        for i in range(16)
    ]
    remote = await asyncio.gather(*(client.generate(ids, params) for ids, params in requests))
    local = await asyncio.gather(*(in_process.generate(ids, params) for ids, params in requests))
    assert [g.completion_ids for g in remote] == [g.completion_ids for g in local]
    for remote_one, local_one in zip(remote, local, strict=True):
        # Batched differently on each side, so the float sums may round differently.
        assert remote_one.logprobs == pytest.approx(local_one.logprobs, abs=1e-5)


async def test_stop_token_ids_end_a_completion_with_that_token(
    client: SGLangEngine, in_process: TransformersEngine
) -> None:
    free_run = await in_process.generate(PROMPT, SamplingParams(max_new_tokens=12, temperature=0.0))
    stop_id = free_run.completion_ids[2]
    stopped = await client.generate(
        PROMPT, SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(stop_id,))
    )
    first_stop = free_run.completion_ids.index(stop_id)
    assert stopped.completion_ids == free_run.completion_ids[: first_stop + 1]
    assert stopped.finish_reason is FinishReason.STOP


async def test_a_weight_update_from_disk_changes_the_served_logprobs_and_version(
    client: SGLangEngine, tmp_path
) -> None:
    before = await client.generate(PROMPT, SEEDED)
    version = await client.policy_version()
    perturbed = AutoModelForCausalLM.from_pretrained(MODEL)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in perturbed.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=noise))
    await client.update_weights(perturbed.state_dict(), version=version + 1)

    after = await client.generate(PROMPT, SEEDED)
    assert after.policy_version == version + 1
    assert await client.policy_version() == version + 1
    assert after.logprobs[0] != before.logprobs[0]
    async with TransformersEngine(
        perturbed, AutoTokenizer.from_pretrained(MODEL), EngineConfig(device="cpu")
    ) as expected_engine:
        expected = await expected_engine.generate(PROMPT, SEEDED)
    assert after.completion_ids == expected.completion_ids
    assert after.logprobs == pytest.approx(expected.logprobs, abs=1e-5)

    # The original checkpoint directory, loaded by path, serves the original policy again.
    await client.update_weights_from_disk(MODEL, version=version + 2)
    restored = await client.generate(PROMPT, SEEDED)
    assert (restored.completion_ids, restored.logprobs) == (before.completion_ids, before.logprobs)
    assert restored.policy_version == version + 2


async def test_update_weights_keeps_only_the_served_export_on_disk(server_url: str, tmp_path) -> None:
    engine = SGLangEngine(server_url, model_path=MODEL, weights_dir=tmp_path)
    try:
        state_dict = AutoModelForCausalLM.from_pretrained(MODEL).state_dict()
        version = await engine.policy_version()
        await engine.update_weights(state_dict, version=version + 1)
        await engine.update_weights(state_dict, version=version + 2)
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"version_{version + 2}"]
        assert sorted(p.name for p in (tmp_path / f"version_{version + 2}").iterdir()) == [
            "config.json",
            "model.safetensors",
        ]
    finally:
        await engine.close()
    assert tmp_path.exists()  # a weights_dir the user chose is not removed


async def test_weight_syncs_while_multi_turn_episodes_keep_generating_all_succeed(
    client: SGLangEngine, tmp_path
) -> None:
    """Async rollout: episodes keep generating across every weight sync, as `rollout.mode=async` does.

    SGLang (and the strict server) refuses a /flush_cache while any request runs; a client that
    flushed after each load died here at the first sync.
    """
    state_dict = AutoModelForCausalLM.from_pretrained(MODEL).state_dict()
    first = await client.policy_version()
    syncs_done = asyncio.Event()
    served_versions: set[int] = set()

    async def episode(opening: int) -> None:
        prompt_ids = [1, opening, 41, 42]
        while not syncs_done.is_set():
            generation = await client.generate(prompt_ids, SamplingParams(max_new_tokens=6, temperature=1.0))
            served_versions.add(generation.policy_version)
            prompt_ids = [*prompt_ids, *generation.completion_ids, 7, 8][-48:]  # the next turn

    episodes = [asyncio.create_task(episode(40 + i)) for i in range(8)]
    try:
        for version in range(first + 1, first + 4):
            await asyncio.sleep(0.2)  # every episode is mid-conversation
            await client.update_weights(state_dict, version=version)
            assert await client.policy_version() == version
    finally:
        syncs_done.set()
        await asyncio.gather(*episodes)
    assert served_versions == set(range(first, first + 4))


async def test_a_bfloat16_server_is_sent_a_bfloat16_export(server_url: str, tmp_path) -> None:
    engine = SGLangEngine(server_url, model_path=MODEL, dtype="bfloat16", weights_dir=tmp_path)
    try:
        state_dict = AutoModelForCausalLM.from_pretrained(MODEL).state_dict()  # float32, as the trainer's
        version = await engine.policy_version() + 1
        await engine.update_weights(state_dict, version=version)
        assert (await engine.generate(PROMPT, SEEDED)).policy_version == version
    finally:
        await engine.close()
    export = tmp_path / f"version_{version}"
    with safe_open(export / "model.safetensors", framework="pt") as weights:
        names = weights.keys()
        assert {weights.get_slice(name).get_dtype() for name in names} == {"BF16"}
    assert AutoConfig.from_pretrained(export).dtype == torch.bfloat16


# ---- failures: fake servers that fail on purpose ----


async def counting_server(status: int, text: str) -> tuple[web.AppRunner, str, list[str]]:
    """A server answering every request with `status`; returns the paths it was asked for."""
    hits: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(status=status, text=text)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}", hits


async def test_a_dead_server_gives_an_error_after_the_bounded_retries() -> None:
    engine = SGLangEngine(f"http://127.0.0.1:{free_port()}", model_path=MODEL, max_retries=2)
    with pytest.raises(EngineRequestError, match=r"failed 3 times \(engine.max_retries=2\); last failure: "):
        await engine.generate(PROMPT, SEEDED)
    await engine.close()


async def test_5xx_answers_are_retried_exactly_max_retries_times() -> None:
    runner, url, hits = await counting_server(503, "overloaded")
    engine = SGLangEngine(url, model_path=MODEL, max_retries=2)
    try:
        with pytest.raises(EngineRequestError, match="last failure: HTTP 503: overloaded"):
            await engine.generate(PROMPT, SEEDED)
        assert hits == ["/generate"] * 3
    finally:
        await engine.close()
        await runner.cleanup()


async def test_a_refused_request_is_not_retried_and_carries_the_servers_reason() -> None:
    runner, url, hits = await counting_server(400, '{"error": {"message": "field \'top_p\': bad"}}')
    engine = SGLangEngine(url, model_path=MODEL, max_retries=2)
    try:
        with pytest.raises(EngineRequestError, match=r"refused \(HTTP 400\).*field 'top_p': bad"):
            await engine.generate(PROMPT, SEEDED)
        assert hits == ["/generate"]
    finally:
        await engine.close()
        await runner.cleanup()


async def test_a_server_that_never_answers_gives_an_error_at_the_deadline() -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accept the request, never answer it

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    engine = SGLangEngine(f"http://127.0.0.1:{port}", model_path=MODEL, request_timeout_s=0.5)
    try:
        with pytest.raises(EngineRequestError, match=r"no answer within engine.request_timeout_s=0.5"):
            await engine.generate(PROMPT, SEEDED)
    finally:
        await engine.close()
        silent.close()


async def test_a_refused_weight_load_says_the_server_must_read_the_export(tmp_path) -> None:
    runner, url, hits = await counting_server(400, '{"success": false, "message": "no such directory"}')
    engine = SGLangEngine(url, model_path=MODEL, weights_dir=tmp_path)
    try:
        with pytest.raises(
            EngineRequestError, match="no such directory.*the server must be able to read .*version_1"
        ):
            await engine.update_weights(AutoModelForCausalLM.from_pretrained(MODEL).state_dict(), version=1)
        assert hits == ["/update_weights_from_disk"]
    finally:
        await engine.close()
        await runner.cleanup()
