"""The server against clients that hold connections: idle sockets past the cap, bodies that never
arrive, a cap full of requests in service, and the logs all that would write."""

from __future__ import annotations

import asyncio
import io
import logging
import resource
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from sandbox.executor import Executor
from sandbox.http_guard import RateLimitedLog
from sandbox.server import create_app, serve

PARTIAL_HEADER = b"POST /v1/run HTTP/1.1\r\nHost: sandbox\r\nContent-Type: appl"
ECHO_RUN = {"language": "python", "code": "print(input())", "stdin": "hi\n", "limits": {"time_s": 2}}
NUM_IDLE = 600  # more than the server's descriptor limit below
SERVER_FILE_LIMIT = 512
MAX_CONNECTIONS = 64
HEADER_TIMEOUT_S = 3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SERVER_FILE_LIMIT, SERVER_FILE_LIMIT))


async def _closed_by_peer(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read(1 << 16) == b""
    except ConnectionError:  # a reset is a close too
        return True


async def test_idle_connections_past_the_cap_are_dropped_while_health_and_runs_are_served(
    tmp_path: Path,
) -> None:
    # The server may open 512 files; 600 clients connect and never finish their headers. Without a
    # cap it runs out of descriptors and logs every failed accept (hundreds of MB in seconds).
    port, log_path = _free_port(), tmp_path / "server.log"
    command = [
        sys.executable, "-m", "sandbox.server", "--backend", "bwrap", "--port", str(port),
        "--max-connections", str(MAX_CONNECTIONS), "--header-timeout-s", str(HEADER_TIMEOUT_S),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        server = await asyncio.create_subprocess_exec(
            *command, stdout=log, stderr=log, preexec_fn=_limit_open_files
        )
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        async with asyncio.timeout(120), aiohttp.ClientSession() as session:
            while "serving on" not in log_path.read_text():
                assert server.returncode is None, log_path.read_text()
                await asyncio.sleep(0.1)
            for _ in range(NUM_IDLE):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(PARTIAL_HEADER)
                idle.append((reader, writer))
            async with session.get(f"http://127.0.0.1:{port}/health") as answer:
                health = (answer.status, (await answer.json())["status"])
            async with session.post(f"http://127.0.0.1:{port}/v1/run", json=ECHO_RUN) as answer:
                run = (answer.status, (await answer.json())["run"]["stdout"])
            # Checked here too, so that a server flooding its log is stopped at once.
            assert log_path.stat().st_size < 16 << 10, log_path.read_text()[:4000]
            closed = await asyncio.gather(*(_closed_by_peer(reader) for reader, _ in idle))
            async with session.get(f"http://127.0.0.1:{port}/metrics") as answer:
                connections = (await answer.json())["connections"]
    finally:
        for _, writer in idle:
            writer.close()
        server.terminate()
        await server.wait()
    log_bytes = log_path.stat().st_size
    assert health == (200, "ok")
    assert run == (200, "hi\n")
    assert all(closed)  # by the cap, or by the header timeout: the server closed every idle socket
    assert connections["num_dropped"] >= NUM_IDLE - MAX_CONNECTIONS
    assert log_bytes < 16 << 10, log_path.read_text()[:4000]


@pytest.fixture
async def guarded() -> AsyncIterator[tuple[str, Executor]]:
    executor = await Executor.create("bwrap", max_concurrency=4)
    async with serve(create_app(executor, max_connections=2, body_timeout_s=1)) as url:
        yield url, executor


async def test_a_body_that_does_not_arrive_in_time_is_408_and_the_connection_closed(
    guarded: tuple[str, Executor],
) -> None:
    port = int(guarded[0].rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b'POST /v1/run HTTP/1.1\r\nHost: sandbox\r\nContent-Length: 100\r\n\r\n{"lang')
    try:
        async with asyncio.timeout(60):  # hang guard: the server must answer, not wait for the body
            answer = await reader.read()  # to the end: the server closes the connection
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"the request body did not arrive within 1 s" in answer


async def test_at_the_cap_with_every_connection_in_service_a_new_one_is_answered_503(
    guarded: tuple[str, Executor],
) -> None:
    url, executor = guarded
    sleeper = {"language": "python", "code": "import time\ntime.sleep(60)", "run_timeout": 30}
    async with aiohttp.ClientSession() as first, aiohttp.ClientSession() as second:
        sleepers = [
            asyncio.create_task(session.post(f"{url}/run_code", json=sleeper)) for session in (first, second)
        ]
        async with asyncio.timeout(30):  # hang guard
            while executor.admission.state().num_running < 2:
                await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as third, third.get(f"{url}/health") as answer:
            busy = (answer.status, answer.headers.get("Retry-After"), (await answer.json())["error"])
        for task in sleepers:
            task.cancel()
        await asyncio.gather(*sleepers, return_exceptions=True)
    assert busy == (503, "1", "busy")


def test_a_repeated_log_message_passes_once_per_interval_with_the_count_it_held_back() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RateLimitedLog(interval_s=1.0))
    log = logging.getLogger("test.rate_limited")
    log.addHandler(handler)
    log.propagate = False
    try:
        for attempt in range(200):
            log.error("accept failed on fd %d", 6 + attempt % 2)
        log.error("another message")
        time.sleep(1.1)
        log.error("accept failed on fd %d", 6)
    finally:
        log.removeHandler(handler)
    assert stream.getvalue().splitlines() == [
        "accept failed on fd 6",
        "another message",
        "accept failed on fd 6 [199 more like this in the last 1 s]",
    ]
