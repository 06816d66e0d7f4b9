"""SandboxClient: retries only sandbox-side failures, bounds every call by its deadline.

The failing peers are real aiohttp servers on 127.0.0.1 that answer the way a broken sandbox
server would (503s, SANDBOX_ERROR answers, silence); the happy paths use the real server on bwrap.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from sandbox.client import SandboxClient, SandboxRequestError, SandboxUnavailableError
from sandbox.executor import Executor
from sandbox.server import create_app, serve
from sandbox.types import Language, RunLimits, RunRequest, RunResponse, StdioTest, Verdict

FAST_BACKOFF = {"backoff_initial_s": 0.01, "backoff_max_s": 0.02}
TOKEN = "client-token"


def _echo(stdin: str, expected: str) -> RunRequest:
    test = StdioTest(stdin=stdin, expected_stdout=expected)
    return RunRequest(
        language=Language.PYTHON, code="print(input())", tests=[test], limits=RunLimits(time_s=2)
    )


def _answer(verdict: Verdict, num_passed: int = 0) -> dict:
    error = "jail died" if verdict == Verdict.SANDBOX_ERROR else None
    return RunResponse(verdict=verdict, num_passed=num_passed, num_tests=1, sandbox_error=error).model_dump()


class ScriptedPeer:
    """A real HTTP server whose /v1/run_batch plays `script` (one handler per call, last one repeats)."""

    def __init__(self, script: list[Callable[[list[dict]], Awaitable[web.Response]]]) -> None:
        self.script = script
        self.batches: list[list[dict]] = []  # the requests of every call received

    async def handle(self, request: web.Request) -> web.Response:
        batch = (await request.json())["requests"]
        self.batches.append(batch)
        step = self.script[min(len(self.batches), len(self.script)) - 1]
        return await step(batch)


@pytest.fixture
async def peer_url() -> AsyncIterator[Callable[[ScriptedPeer], Awaitable[str]]]:
    async with contextlib.AsyncExitStack() as stack:

        async def start(peer: ScriptedPeer) -> str:
            app = web.Application()
            app.router.add_post("/v1/run_batch", peer.handle)
            return await stack.enter_async_context(serve(app))

        yield start


async def unavailable(batch: list[dict]) -> web.Response:
    return web.Response(status=503, text="overloaded")


def answering(*verdicts: Verdict) -> Callable[[list[dict]], Awaitable[web.Response]]:
    async def respond(batch: list[dict]) -> web.Response:
        return web.json_response({"responses": [_answer(verdict) for verdict in verdicts[: len(batch)]]})

    return respond


async def test_a_server_failing_twice_with_503_is_retried_until_it_answers(peer_url) -> None:
    peer = ScriptedPeer([unavailable, unavailable, answering(Verdict.AC)])
    async with SandboxClient(await peer_url(peer), max_retries=3, **FAST_BACKOFF) as client:
        response = await client.run(_echo("1\n", "1\n"))
    assert response.verdict == Verdict.AC
    assert len(peer.batches) == 3


async def test_a_request_whose_body_timed_out_on_the_server_is_sent_again(peer_url) -> None:
    async def body_timed_out(batch: list[dict]) -> web.Response:
        return web.json_response({"error": "request timeout"}, status=408)

    peer = ScriptedPeer([body_timed_out, answering(Verdict.AC)])
    async with SandboxClient(await peer_url(peer), max_retries=3, **FAST_BACKOFF) as client:
        response = await client.run(_echo("1\n", "1\n"))
    assert (response.verdict, len(peer.batches)) == (Verdict.AC, 2)


async def test_a_wrong_answer_is_returned_at_once_without_retrying(peer_url) -> None:
    peer = ScriptedPeer([answering(Verdict.WA)])
    async with SandboxClient(await peer_url(peer), max_retries=3, **FAST_BACKOFF) as client:
        response = await client.run(_echo("1\n", "2\n"))
    assert response.verdict == Verdict.WA
    assert len(peer.batches) == 1


async def test_only_the_sandbox_error_answers_of_a_batch_are_sent_again(peer_url) -> None:
    peer = ScriptedPeer([answering(Verdict.AC, Verdict.SANDBOX_ERROR, Verdict.WA), answering(Verdict.TLE)])
    requests = [_echo("1\n", "1\n"), _echo("2\n", "2\n"), _echo("3\n", "4\n")]
    async with SandboxClient(await peer_url(peer), max_retries=3, **FAST_BACKOFF) as client:
        responses = await client.run_batch(requests)
    assert [r.verdict for r in responses] == [Verdict.AC, Verdict.TLE, Verdict.WA]
    assert [len(batch) for batch in peer.batches] == [3, 1]
    assert peer.batches[1][0]["tests"][0]["stdin"] == "2\n"


async def test_an_answer_missing_responses_is_retried_like_a_server_failure(peer_url) -> None:
    async def short(batch: list[dict]) -> web.Response:
        return web.json_response({"responses": []})

    peer = ScriptedPeer([short, answering(Verdict.RE)])
    async with SandboxClient(await peer_url(peer), max_retries=1, **FAST_BACKOFF) as client:
        response = await client.run(_echo("1\n", "1\n"))
    assert response.verdict == Verdict.RE
    assert len(peer.batches) == 2


async def test_when_retries_run_out_the_answer_is_sandbox_error_saying_so(peer_url) -> None:
    peer = ScriptedPeer([unavailable])
    async with SandboxClient(await peer_url(peer), max_retries=2, **FAST_BACKOFF) as client:
        response = await client.run(_echo("1\n", "1\n"))
    assert response.verdict == Verdict.SANDBOX_ERROR
    assert "gave up after 3 attempts" in (response.sandbox_error or "")
    assert "HTTP 503" in (response.sandbox_error or "")
    assert len(peer.batches) == 3


async def test_a_call_past_its_deadline_returns_sandbox_error_instead_of_waiting(peer_url) -> None:
    answered = asyncio.Event()

    async def silent(batch: list[dict]) -> web.Response:
        await answered.wait()
        return web.json_response({"responses": []})

    peer = ScriptedPeer([silent])
    async with SandboxClient(await peer_url(peer), deadline_s=0.2, **FAST_BACKOFF) as client:
        async with asyncio.timeout(10):  # guards the test run itself; the client must return well before
            response = await client.run(_echo("1\n", "1\n"))
    answered.set()
    assert response.verdict == Verdict.SANDBOX_ERROR
    assert "deadline of 0.2 s exceeded" in (response.sandbox_error or "")


async def test_a_refused_connection_is_retried_then_reported_as_sandbox_error() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago and has no listener now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with SandboxClient(f"http://127.0.0.1:{port}", max_retries=1, **FAST_BACKOFF) as client:
        response = await client.run(_echo("1\n", "1\n"))
    assert response.verdict == Verdict.SANDBOX_ERROR
    assert "gave up after 2 attempts" in (response.sandbox_error or "")
    assert "ClientConnectorError" in (response.sandbox_error or "")


async def test_a_health_probe_of_an_unreachable_server_raises_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with SandboxClient(f"http://127.0.0.1:{port}") as client:
        with pytest.raises(SandboxUnavailableError, match="ClientConnectorError on /health"):
            await client.health()


@pytest.fixture
async def server_url() -> AsyncIterator[str]:
    executor = await Executor.create(backend="bwrap", max_concurrency=2)
    async with serve(create_app(executor, token=TOKEN)) as url:
        yield url


async def test_run_many_through_the_real_server_keeps_request_order_across_batches(server_url: str) -> None:
    requests = [_echo(f"{i}\n", f"{i if i % 2 == 0 else -1}\n") for i in range(5)]
    async with SandboxClient(server_url, token=TOKEN, max_batch_size=2) as client:
        responses = await client.run_many(requests)
        metrics = await client.metrics()
    assert [r.verdict for r in responses] == [Verdict.AC, Verdict.WA, Verdict.AC, Verdict.WA, Verdict.AC]
    assert metrics.num_runs == 5  # the wrong answers were not retried


async def test_health_reports_the_backend(server_url: str) -> None:
    async with SandboxClient(server_url) as client:
        assert await client.health() == {"status": "ok", "backend": "bwrap"}


async def test_a_missing_token_raises_a_request_error_with_status_401(server_url: str) -> None:
    async with SandboxClient(server_url, **FAST_BACKOFF) as client:
        with pytest.raises(SandboxRequestError) as caught:
            await client.run(_echo("1\n", "1\n"))
    assert caught.value.status == 401


def test_a_base_url_without_a_scheme_is_rejected_naming_it() -> None:
    with pytest.raises(ValueError, match="'localhost:8090'"):
        SandboxClient("localhost:8090")
