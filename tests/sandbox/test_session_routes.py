"""The session routes of the HTTP service and the client's sessions, end to end on bwrap."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from sandbox.client import SandboxClient, SandboxRequestError
from sandbox.executor import Executor
from sandbox.server import DEADLINE_HEADER, create_app, serve
from sandbox.sessions import SessionFailure

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def url():
    executor = await Executor.create("bwrap")
    async with serve(create_app(executor)) as base_url:
        yield base_url


async def test_a_remote_session_keeps_its_files_between_commands(url):
    async with SandboxClient(url, deadline_s=30) as client:
        session = await client.open_session()
        await session.write_file("notes/a.txt", b"x\ny\n")
        result = await session.exec("wc -l notes/a.txt && echo $HOME", timeout_s=5)
        assert (result.exit_code, result.stdout) == (0, "2 notes/a.txt\n/work\n")
        assert (await session.read_file("/work/notes/a.txt")).data == b"x\ny\n"
        await session.reset()
        assert not (await session.read_file("notes/a.txt")).exists
        await session.close()
        with pytest.raises(SandboxRequestError, match="HTTP 404"):
            await session.exec("true")


async def test_a_second_command_on_a_busy_session_is_answered_busy_then_retried(url):
    async with SandboxClient(url, deadline_s=30) as client:
        session = await client.open_session()
        async with aiohttp.ClientSession() as http:
            first = asyncio.ensure_future(session.exec("sleep 1; echo first"))
            await asyncio.sleep(0.3)
            async with http.post(
                f"{url}/v1/sessions/{session.session_id}/exec", json={"command": "true"}
            ) as answer:
                assert answer.status == 503 and answer.headers["Retry-After"] == "1"
            second = await session.exec("echo second")  # the client waits out the busy answers
        assert ((await first).stdout, second.stdout) == ("first\n", "second\n")
        await session.close()


async def test_a_command_longer_than_the_deadline_is_refused(url):
    async with SandboxClient(url, deadline_s=30) as client:
        session = await client.open_session()
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{url}/v1/sessions/{session.session_id}/exec",
                json={"command": "sleep 5", "timeout_s": 20},
                headers={DEADLINE_HEADER: "10"},
            ) as answer,
        ):
            assert answer.status == 400
            assert "longer than the request's 10 s deadline" in (await answer.json())["message"]
        await session.close()


async def test_an_unreachable_server_is_a_session_failure():
    async with SandboxClient("http://127.0.0.1:9", deadline_s=2, max_retries=1) as client:
        with pytest.raises(SessionFailure, match="sandbox server"):
            await client.open_session()
