"""The sandbox HTTP server, served for real on 127.0.0.1 (ephemeral port) over the bwrap backend."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest

from sandbox.executor import Executor
from sandbox.server import check_bind_allowed, create_app, serve
from sandbox.types import Language, RunLimits, RunRequest, StdioTest, Verdict

TOKEN = "s3cret-token"
ECHO = "print(input())"
CPP_ECHO = "#include <iostream>\nint main(){int x; std::cin >> x; std::cout << x << std::endl;}"
LIMITS = RunLimits(time_s=2, memory_mb=256)


def _stdio(code: str, stdin: str, expected: str, language: Language = Language.PYTHON) -> RunRequest:
    test = StdioTest(stdin=stdin, expected_stdout=expected)
    return RunRequest(language=language, code=code, tests=[test], limits=LIMITS)


MIXED_REQUESTS = [
    _stdio(ECHO, "7\n", "7\n"),  # AC
    _stdio(ECHO, "7\n", "8\n"),  # WA
    _stdio("raise SystemExit(3)", "", "x\n"),  # RE
    _stdio(CPP_ECHO, "5\n", "5\n", Language.CPP),  # AC
    _stdio("int main( {", "", "", Language.CPP),  # CE
]
MIXED_VERDICTS = [Verdict.AC, Verdict.WA, Verdict.RE, Verdict.AC, Verdict.CE]


async def _start(token: str | None = None, max_body_bytes: int = 1 << 20) -> AsyncIterator[str]:
    executor = await Executor.create(backend="bwrap", max_concurrency=2)
    async with serve(create_app(executor, token=token, max_body_bytes=max_body_bytes)) as url:
        yield url


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async for base_url in _start():
        yield base_url


@pytest.fixture
async def token_url() -> AsyncIterator[str]:
    async for base_url in _start(token=TOKEN):
        yield base_url


async def _post(url: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as answer:
        return answer.status, await answer.json()


async def test_batch_endpoint_gives_the_same_verdicts_as_the_executor(url: str) -> None:
    async with await Executor.create(backend="bwrap", max_concurrency=2) as executor:
        local = await executor.run_many(MIXED_REQUESTS)
    status, body = await _post(f"{url}/v1/run_batch", {"requests": [r.model_dump() for r in MIXED_REQUESTS]})
    assert status == 200
    assert [r.verdict for r in local] == MIXED_VERDICTS
    assert [answer["verdict"] for answer in body["responses"]] == [v.value for v in MIXED_VERDICTS]
    assert [answer["num_passed"] for answer in body["responses"]] == [r.num_passed for r in local]


async def test_single_run_endpoint_returns_the_judged_response(url: str) -> None:
    status, body = await _post(f"{url}/v1/run", _stdio(ECHO, "hello\n", "hello\n").model_dump())
    assert status == 200
    assert (body["verdict"], body["num_passed"], body["num_tests"]) == ("AC", 1, 1)
    assert body["tests"][0]["stdout"] == "hello\n"


async def test_health_reports_ok_and_the_backend(url: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/health") as answer:
        assert answer.status == 200
        assert await answer.json() == {"status": "ok", "backend": "bwrap"}


async def test_metrics_count_the_verdicts_served(url: str) -> None:
    requests = [_stdio(ECHO, "1\n", "1\n"), _stdio(ECHO, "1\n", "2\n"), _stdio(ECHO, "3\n", "3\n")]
    await _post(f"{url}/v1/run_batch", {"requests": [r.model_dump() for r in requests]})
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as answer:
        metrics = await answer.json()
    assert metrics["num_runs"] == 3
    assert (metrics["verdicts"]["AC"], metrics["verdicts"]["WA"], metrics["verdicts"]["TLE"]) == (2, 1, 0)
    assert (metrics["queue_depth"], metrics["in_flight"], metrics["max_concurrency"]) == (0, 0, 2)
    assert metrics["latency"]["num_samples"] == 3
    assert metrics["latency"]["p50_ms"] <= metrics["latency"]["p99_ms"]
    assert (metrics["container_recycles"], metrics["backend_stats"]) == (None, None)


@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
async def test_with_a_token_set_runs_without_the_right_bearer_token_are_401(
    token_url: str, headers: dict[str, str] | None
) -> None:
    status, body = await _post(f"{token_url}/v1/run", _stdio(ECHO, "1\n", "1\n").model_dump(), headers)
    assert status == 401
    assert body["error"] == "unauthorized"


async def test_with_a_token_set_the_right_token_runs_and_health_needs_none(token_url: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    status, body = await _post(f"{token_url}/v1/run", _stdio(ECHO, "1\n", "1\n").model_dump(), headers)
    assert (status, body["verdict"]) == (200, "AC")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{token_url}/health") as answer:
            assert answer.status == 200
        async with session.get(f"{token_url}/metrics") as answer:
            assert answer.status == 401


def test_binding_a_non_loopback_address_without_a_token_is_refused() -> None:
    with pytest.raises(ValueError, match="without a token"):
        check_bind_allowed("0.0.0.0", None)
    check_bind_allowed("0.0.0.0", TOKEN)
    check_bind_allowed("127.0.0.1", None)
    check_bind_allowed("localhost", None)


def test_the_server_command_refuses_a_public_bind_without_a_token_before_starting() -> None:
    env = {key: value for key, value in os.environ.items() if key != "AGENTRL_SANDBOX_TOKEN"}
    command = [sys.executable, "-m", "sandbox.server", "--host", "0.0.0.0", "--backend", "bwrap"]
    finished = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=60)
    assert finished.returncode == 1
    assert "refusing to bind non-loopback host '0.0.0.0' without a token" in finished.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_the_server_command_serves_then_closes_the_backend_on_sigterm() -> None:
    port = _free_port()
    command = ["-m", "sandbox.server", "--backend", "bwrap", "--port", str(port), "--token", TOKEN]
    server = await asyncio.create_subprocess_exec(sys.executable, *command, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(60), aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/health") as answer:
                        break
                except aiohttp.ClientConnectionError:
                    if server.returncode is not None:  # it died instead of serving: show why
                        raise AssertionError((await server.stderr.read()).decode()) from None
                    await asyncio.sleep(0.1)
            headers = {"Authorization": f"Bearer {TOKEN}"}
            body = _stdio(ECHO, "1\n", "1\n").model_dump()
            async with session.post(f"http://127.0.0.1:{port}/v1/run", json=body, headers=headers) as answer:
                assert (await answer.json())["verdict"] == "AC"
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = await server.communicate()
    assert server.returncode == 0
    assert "sandbox backend bwrap closed" in stderr.decode()


@pytest.mark.parametrize(
    "body,field",
    [
        ({"language": "cobol", "code": "x"}, "language"),
        ({"language": "python"}, "code"),
        ({"language": "python", "code": "", "limits": {"time_s": -1}}, "limits.time_s"),
    ],
)
async def test_a_bad_request_is_400_naming_the_field(url: str, body: dict, field: str) -> None:
    status, answer = await _post(f"{url}/v1/run", body)
    assert status == 400
    assert field in answer["message"]
    assert [".".join(map(str, item["loc"])) for item in answer["detail"]] == [field]


async def test_a_well_formed_but_impossible_request_in_a_batch_is_400_naming_it(url: str) -> None:
    call_test = {"kind": "call", "args": [1], "expected": 1}
    impossible = {"language": "cpp", "code": "", "entry_point": "f", "tests": [call_test]}
    status, answer = await _post(
        f"{url}/v1/run_batch", {"requests": [_stdio(ECHO, "", "").model_dump(), impossible]}
    )
    assert status == 400
    assert answer["message"].startswith("requests.1: tests[0] is a 'call' test")


async def test_limits_above_the_servers_maximums_are_400_naming_the_field_the_value_and_the_maximum(
    url: str,
) -> None:
    body = _stdio(ECHO, "", "").model_dump()
    body["limits"] |= {"time_s": 600, "max_output_bytes": 1 << 30}
    status, answer = await _post(f"{url}/v1/run", body)
    assert status == 400
    assert answer["message"] == (
        "limits.time_s is 600, above this server's maximum of 60 (--max-time-s); limits.max_output_bytes "
        "is 1073741824, above this server's maximum of 8388608 (--max-output-mb)"
    )
    assert [item["loc"] for item in answer["detail"]] == [
        ["limits", "time_s"],
        ["limits", "max_output_bytes"],
    ]


async def test_a_batch_item_above_the_maximum_memory_is_400_naming_it(url: str) -> None:
    big = _stdio(ECHO, "", "").model_dump()
    big["limits"]["memory_mb"] = 65536
    status, answer = await _post(
        f"{url}/v1/run_batch", {"requests": [_stdio(ECHO, "", "").model_dump(), big]}
    )
    assert status == 400
    assert answer["message"] == (
        "requests.1.limits.memory_mb is 65536, above this server's maximum of 4096 (--max-memory-mb)"
    )


async def test_a_body_that_is_not_json_is_400(url: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/run", data=b"{not json") as answer:
        assert answer.status == 400
        assert "Invalid JSON" in (await answer.json())["message"]


async def test_a_body_over_the_size_limit_is_413() -> None:
    async for base_url in _start(max_body_bytes=1024):
        big = _stdio("#" * 4096, "", "").model_dump()
        async with aiohttp.ClientSession() as session, session.post(f"{base_url}/v1/run", json=big) as answer:
            assert answer.status == 413
