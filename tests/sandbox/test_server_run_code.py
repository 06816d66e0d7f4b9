"""SandboxFusion's POST /run_code on the real server (bwrap): its request in, its response shape out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from sandbox.executor import Executor
from sandbox.server import RequestCaps, create_app, serve

RESPONSE_KEYS = {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}
COMMAND_KEYS = {"status", "execution_time", "return_code", "stdout", "stderr"}


@pytest.fixture
async def url() -> AsyncIterator[str]:
    executor = await Executor.create(backend="bwrap", max_concurrency=2)
    async with serve(create_app(executor)) as base_url:
        yield base_url


async def _run_code(url: str, body: dict) -> tuple[int, dict]:
    request = {"compile_timeout": 10, "run_timeout": 2, "files": {}, "fetch_files": [], **body}
    async with aiohttp.ClientSession() as session, session.post(f"{url}/run_code", json=request) as answer:
        return answer.status, await answer.json()


async def test_a_successful_python_run_is_success_with_its_stdout(url: str) -> None:
    status, body = await _run_code(
        url, {"code": "print(int(input()) * 2)", "language": "python", "stdin": "21"}
    )
    assert status == 200
    assert set(body) == RESPONSE_KEYS
    assert (body["status"], body["message"], body["compile_result"], body["files"]) == (
        "Success",
        "",
        None,
        {},
    )
    assert set(body["run_result"]) == COMMAND_KEYS
    assert body["run_result"]["status"] == "Finished"
    assert (body["run_result"]["return_code"], body["run_result"]["stdout"]) == (0, "42\n")
    assert body["run_result"]["execution_time"] > 0


async def test_a_successful_cpp_run_has_a_finished_compile_result(url: str) -> None:
    code = '#include <cstdio>\nint main(){ std::puts("hi"); return 0; }'
    status, body = await _run_code(url, {"code": code, "language": "cpp"})
    assert (status, body["status"]) == (200, "Success")
    assert (body["compile_result"]["status"], body["compile_result"]["return_code"]) == ("Finished", 0)
    assert body["run_result"]["stdout"] == "hi\n"


async def test_a_runtime_error_is_failed_with_the_exit_code_and_stderr(url: str) -> None:
    code = "import sys\nprint('partial')\nsys.stderr.write('boom')\nsys.exit(3)"
    status, body = await _run_code(url, {"code": code, "language": "python"})
    assert (status, body["status"]) == (200, "Failed")
    assert body["run_result"]["status"] == "Finished"
    assert body["run_result"]["return_code"] == 3
    assert body["run_result"]["stdout"] == "partial\n"
    assert "boom" in body["run_result"]["stderr"]


async def test_a_timeout_is_failed_with_time_limit_exceeded(url: str) -> None:
    body = {"code": "while True: pass", "language": "python", "run_timeout": 1}
    status, answer = await _run_code(url, body)
    assert (status, answer["status"]) == (200, "Failed")
    assert answer["run_result"]["status"] == "TimeLimitExceeded"
    assert answer["run_result"]["return_code"] is None


async def test_a_compile_error_is_failed_with_the_compiler_output_and_no_run(url: str) -> None:
    status, body = await _run_code(url, {"code": "int main( {", "language": "cpp"})
    assert (status, body["status"], body["run_result"]) == (200, "Failed", None)
    assert body["compile_result"]["status"] == "Finished"
    assert body["compile_result"]["return_code"] != 0
    assert "error" in body["compile_result"]["stderr"]


async def test_an_unknown_language_is_422_in_sandboxfusions_validation_shape(url: str) -> None:
    status, body = await _run_code(url, {"code": "x", "language": "brainfuck"})
    assert status == 422
    assert [item["loc"] for item in body["detail"]] == [["body", "language"]]
    assert all(set(item) == {"loc", "msg", "type"} for item in body["detail"])


async def test_ping_answers_pong(url: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/ping") as answer:
        assert (answer.status, await answer.json()) == (200, "pong")


async def test_a_program_sleeping_past_run_timeout_is_time_limit_exceeded(url: str) -> None:
    # run_timeout is SandboxFusion's wall clock: a sleeping program uses no CPU and still times out
    # (a CPU limit with a wall clock 1.5 times as long, at least 1 s more, would let it finish).
    body = {"code": "import time\ntime.sleep(2.6)\nprint('woke')", "language": "python", "run_timeout": 2}
    status, answer = await _run_code(url, body)
    assert (status, answer["status"], answer["run_result"]["status"]) == (200, "Failed", "TimeLimitExceeded")


async def test_a_run_timeout_above_the_servers_maximum_is_422_naming_it_the_value_and_the_maximum(
    url: str,
) -> None:
    status, body = await _run_code(url, {"code": "print(1)", "language": "python", "run_timeout": 120})
    assert status == 422
    assert body["detail"] == [
        {
            "loc": ["body", "run_timeout"],
            "msg": "run_timeout is 120, above this server's maximum of 60 (--max-time-s)",
            "type": "value_error",
        }
    ]


async def test_no_memory_limit_means_the_servers_maximum_memory() -> None:
    executor = await Executor.create(backend="bwrap", max_concurrency=2)
    async with serve(create_app(executor, caps=RequestCaps(max_memory_mb=64))) as base_url:
        code = "data = bytearray(200 << 20)\nprint(len(data))"
        status, body = await _run_code(base_url, {"code": code, "language": "python", "memory_limit_MB": -1})
    assert (status, body["status"], body["message"].split(":")[0]) == (200, "Failed", "MLE")
