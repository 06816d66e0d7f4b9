"""The HTTP server under hostile load, on every real backend (issue class e): bursts of programs
that run past their limits, clients that give up, malformed fields."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from sandbox.client import SandboxClient
from sandbox.executor import Executor
from sandbox.server import create_app, serve
from sandbox.types import Language, RunLimits, RunRequest, Verdict

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEFAULT_DEADLINE_S = 3.0
SPIN = {
    "code": "while True:\n    pass",
    "language": "python",
    "run_timeout": 1,
    "files": {},
    "fetch_files": [],
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def url(backend_name: str) -> AsyncIterator[str]:
    executor = await Executor.create(backend_name)  # the server's default admission
    async with serve(create_app(executor, default_deadline_s=DEFAULT_DEADLINE_S)) as base_url:
        yield base_url


async def _metrics(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(f"{url}/metrics") as answer:
        return await answer.json()


async def _idle(session: aiohttp.ClientSession, url: str, within_s: float) -> bool:
    """Whether nothing is queued or running within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        metrics = await _metrics(session, url)
        if (metrics["queue_depth"], metrics["in_flight"]) == (0, 0):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_burst_of_over_limit_programs_gets_verdicts_or_busy_and_then_serves_at_once(url: str) -> None:
    # 100 SandboxFusion-style clients (no deadline header, 10 s read timeout); CPU-bound programs take
    # a core each, so they start about two at a time on two cores.
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def spin() -> tuple[int, str | None, str]:
            async with session.post(f"{url}/run_code", json=SPIN) as answer:
                body = await answer.json()
                kind = body["run_result"]["status"] if answer.status == 200 else body["error"]
                return answer.status, answer.headers.get("Retry-After"), kind

        answers = await asyncio.gather(*(spin() for _ in range(100)))
        started = time.monotonic()
        request = {**SPIN, "code": "print('ordinary')"}
        async with session.post(f"{url}/run_code", json=request) as answer:
            ordinary = (answer.status, (await answer.json())["run_result"]["stdout"])
        served_s = time.monotonic() - started
    kinds = {(status, retry_after is not None, kind) for status, retry_after, kind in answers}
    assert kinds <= {(200, False, "TimeLimitExceeded"), (503, True, "busy")}
    assert (200, False, "TimeLimitExceeded") in kinds
    assert ordinary == (200, "ordinary\n")
    assert served_s < 5.0


async def test_work_of_a_client_that_disconnected_leaves_the_queue_and_is_killed(url: str) -> None:
    sleeper = {**SPIN, "code": "import time\ntime.sleep(60)", "run_timeout": 30}
    # They say they would wait two minutes (so the server queues them), then hang up after one second.
    headers = {"X-Sandbox-Deadline-S": "120"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as impatient:
        for outcome in await asyncio.gather(
            *(impatient.post(f"{url}/run_code", json=sleeper, headers=headers) for _ in range(6)),
            return_exceptions=True,
        ):
            assert isinstance(outcome, TimeoutError)
    async with aiohttp.ClientSession() as session:
        assert await _idle(session, url, within_s=10.0)


async def test_a_request_that_cannot_start_before_its_deadline_is_busy_with_retry_after(url: str) -> None:
    spinner = {**SPIN, "run_timeout": 4}  # two CPU-bound runs fill both slots
    async with aiohttp.ClientSession() as session:
        blockers = [asyncio.create_task(session.post(f"{url}/run_code", json=spinner)) for _ in range(2)]
        await asyncio.sleep(0.5)
        headers = {"X-Sandbox-Deadline-S": "0.5"}
        async with session.post(f"{url}/run_code", json=SPIN, headers=headers) as answer:
            busy = (answer.status, answer.headers.get("Retry-After", ""), (await answer.json())["error"])
        for blocker in blockers:
            (await blocker).release()
    assert (busy[0], busy[1].isdigit() and int(busy[1]) >= 1, busy[2]) == (503, True, "busy")


async def test_every_malformed_field_is_named_in_a_4xx(url: str) -> None:
    body = {"language": "cobol", "code": 3, "limits": {"time_s": -1, "memory_mb": 100000}}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/run", json=body) as answer:
            status, detail = answer.status, (await answer.json())["detail"]
        fusion = {"code": "print(1)", "language": "python", "memory_limit_MB": 100000, "run_timeout": 0}
        async with session.post(f"{url}/run_code", json=fusion) as answer:
            fusion_status, fusion_body = answer.status, await answer.json()
        async with session.post(
            f"{url}/run_code", json=SPIN, headers={"X-Sandbox-Deadline-S": "soon"}
        ) as answer:
            header_status, header_message = answer.status, (await answer.json())["message"]
    assert status == 400
    assert sorted(".".join(map(str, error["loc"])) for error in detail) == [
        "code", "language", "limits.memory_mb", "limits.time_s",
    ]  # fmt: skip
    assert fusion_status == 422
    assert sorted(error["loc"][-1] for error in fusion_body["detail"]) == ["memory_limit_MB", "run_timeout"]
    assert header_status == 400
    assert header_message == "header X-Sandbox-Deadline-S must be a positive number of seconds, got 'soon'"


async def test_the_client_waits_out_a_busy_servers_retry_after_and_then_gets_its_answer() -> None:
    # A real HTTP server that is busy once, then answers: the client must wait Retry-After (1 s).
    calls: list[float] = []
    answer = {"responses": [{"verdict": "AC"}]}

    async def run_batch(request: web.Request) -> web.Response:
        calls.append(time.monotonic())
        assert float(request.headers["X-Sandbox-Deadline-S"]) > 0
        if len(calls) == 1:
            return web.json_response({"error": "busy"}, status=503, headers={"Retry-After": "1"})
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/v1/run_batch", run_batch)
    async with serve(app) as base_url, SandboxClient(base_url, backoff_initial_s=0.01) as client:
        response = await client.run(RunRequest(language=Language.PYTHON, code="", limits=RunLimits()))
    assert (response.verdict, len(calls)) == (Verdict.AC, 2)
    assert calls[1] - calls[0] >= 1.0
