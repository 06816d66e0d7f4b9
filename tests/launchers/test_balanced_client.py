"""BalancedEngine against two real built-in engine servers (the app of `python -m agentrl.engine.serve`).

Routing is observed on servers in this process, which record the prompts they receive. Weight
loads run on server processes of their own, as in a run: transformers' checkpoint loading is not
safe to run in two threads of one process at once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from aiohttp import web
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from agentrl.engine.builtin.engine import TransformersEngine
from agentrl.engine.config import EngineConfig
from agentrl.engine.protocol import SamplingParams
from agentrl.engine.remote.balanced_client import BalancedEngine
from agentrl.engine.remote.sglang_client import SGLangEngine
from agentrl.engine.remote.sglang_launcher import free_port
from agentrl.engine.remote.sglang_protocol import EngineRequestError
from agentrl.engine.serve.http_server import ServedEngine, build_app
from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from tests.engine.served import launch_served_engine, served_url, stop_served_engine

MODEL = str(DEFAULT_MODEL_PATH)
SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0, seed=3)


@dataclass
class Server:
    """A served engine and the prompts its /generate route received, in arrival order."""

    url: str
    prompts: list[list[int]] = field(default_factory=list)


async def start_server(stack: list) -> Server:
    engine = TransformersEngine.from_pretrained(MODEL, EngineConfig(device="cpu", max_batch_size=8))
    served = ServedEngine(engine, AutoTokenizer.from_pretrained(MODEL), MODEL, torch.float32)
    app = build_app(served)
    server = Server(url="")

    @web.middleware
    async def record_prompts(request: web.Request, handler):
        if request.path == "/generate":
            server.prompts.append((await request.json())["input_ids"])
        return await handler(request)

    app.middlewares.append(record_prompts)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    stack.append((runner, engine))
    return server


@pytest.fixture
async def servers() -> AsyncIterator[list[Server]]:
    stack: list = []
    try:
        yield [await start_server(stack), await start_server(stack)]
    finally:
        for runner, engine in stack:
            await runner.cleanup()
            await engine.close()


@pytest.fixture(scope="module")
def server_processes() -> Iterator[list[str]]:
    """Two `python -m agentrl.engine.serve` processes; their URLs."""
    processes = [launch_served_engine() for _ in range(2)]  # both load the model at once
    try:
        yield [served_url(process) for process in processes]
    finally:
        for process in processes:
            stop_served_engine(process)


def balanced(urls: list[str], tmp_path: Path, *, updates_weights: bool = True, **kwargs) -> BalancedEngine:
    clients = [SGLangEngine(url, model_path=MODEL, request_timeout_s=60, max_retries=0) for url in urls]
    return BalancedEngine(
        clients, model_path=MODEL, updates_weights=updates_weights, weights_dir=tmp_path / "sync", **kwargs
    )


async def episode(engine: BalancedEngine, opening: list[int], num_turns: int) -> list[list[int]]:
    """A multi-turn episode: each turn's prompt is the conversation so far plus an observation."""
    prompts, prompt_ids = [], list(opening)
    for _ in range(num_turns):
        prompts.append(list(prompt_ids))
        generation = await engine.generate(prompt_ids, SAMPLING)
        prompt_ids += generation.completion_ids + [7, 8]
    return prompts


async def test_every_turn_of_an_episode_reaches_the_server_its_first_turn_went_to(servers, tmp_path):
    engine = balanced([server.url for server in servers], tmp_path)
    first, second = await asyncio.gather(
        asyncio.create_task(episode(engine, [1, 40, 41], num_turns=3)),
        asyncio.create_task(episode(engine, [1, 50, 51], num_turns=3)),
    )
    await engine.close()
    assert servers[0].prompts == first
    assert servers[1].prompts == second


async def test_first_turns_go_to_the_server_with_the_fewest_requests_in_flight(servers, tmp_path):
    engine = balanced([server.url for server in servers], tmp_path)
    openings = [[1, 40 + i] for i in range(4)]
    await asyncio.gather(*(episode(engine, opening, num_turns=1) for opening in openings))
    await engine.close()
    assert sorted(servers[0].prompts) == [openings[0], openings[2]]
    assert sorted(servers[1].prompts) == [openings[1], openings[3]]
    assert engine.requests_sent == [2, 2]


async def test_an_episode_whose_server_failed_is_rerouted_to_one_that_answers(servers, tmp_path):
    unreachable = f"http://127.0.0.1:{free_port()}"
    engine = balanced([unreachable, servers[1].url], tmp_path)

    async def fail_then_rerun() -> None:
        with pytest.raises(EngineRequestError, match="failed 1 times"):
            await engine.generate([1, 40, 41], SAMPLING)
        await engine.generate([1, 40, 41], SAMPLING)

    await asyncio.create_task(fail_then_rerun())
    await engine.close()
    assert engine.requests_sent == [1, 1]
    assert servers[1].prompts == [[1, 40, 41]]


def zeroed_final_norm() -> dict[str, torch.Tensor]:
    """The tiny policy with its final norm zeroed: every logit is 0, so every logprob is -log(vocab)."""
    state_dict = AutoModelForCausalLM.from_pretrained(MODEL).state_dict()
    state_dict["model.norm.weight"] = torch.zeros_like(state_dict["model.norm.weight"])
    return state_dict


async def test_one_client_loads_the_weights_into_every_server_and_the_others_wait_for_them(
    server_processes, tmp_path
):
    urls = server_processes
    leader, follower = balanced(urls, tmp_path), balanced(urls, tmp_path, updates_weights=False)
    waiting = asyncio.create_task(follower.update_weights({}, version=1))
    await asyncio.sleep(0.5)
    assert not waiting.done()  # both servers still serve version 0
    await leader.update_weights(zeroed_final_norm(), version=1)
    await asyncio.wait_for(waiting, timeout=10)
    generations = await asyncio.gather(
        *(asyncio.create_task(follower.generate([1, 40 + i], SAMPLING)) for i in range(2))
    )
    uniform = -math.log(AutoConfig.from_pretrained(MODEL).vocab_size)
    for generation in generations:
        assert generation.policy_version == 1
        assert generation.logprobs == pytest.approx([uniform] * len(generation.logprobs), abs=1e-5)
    assert follower.requests_sent == [1, 1]  # both servers answered with the new weights
    await leader.update_weights(zeroed_final_norm(), version=2)
    assert sorted(path.name for path in (tmp_path / "sync").iterdir()) == ["version_2"]
    await leader.close()
    await follower.close()


async def test_a_waiting_client_gives_up_with_the_versions_the_servers_report(servers, tmp_path):
    follower = balanced(
        [server.url for server in servers], tmp_path, updates_weights=False, version_timeout_s=0.3
    )
    try:
        with pytest.raises(EngineRequestError, match=r"report weight versions \[0, 0\], not 1, after 0.3 s"):
            await follower.update_weights({}, version=1)
    finally:
        await follower.close()


def test_a_balanced_engine_needs_a_server():
    with pytest.raises(ValueError, match="at least one server"):
        BalancedEngine([], model_path=MODEL, updates_weights=True)
