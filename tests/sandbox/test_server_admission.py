"""Admission by CPU: runs that sleep do not keep quick runs waiting; CPU-bound runs still queue and
are refused in time. Real jails (bwrap, and Docker containers whose CPU use is read from their
cgroups) and real processes throughout."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from sandbox.admission import Admission, AdmissionTimeout, descendant_cpu_usage
from sandbox.executor import Executor
from sandbox.server import create_app, serve

SPIN = "while True:\n    pass"


async def _run_code(session: aiohttp.ClientSession, url: str, body: dict, **headers: str) -> tuple[int, dict]:
    request = {"language": "python", "files": {}, "fetch_files": [], **body}
    async with session.post(f"{url}/run_code", json=request, headers=headers) as answer:
        return answer.status, {**await answer.json(), "retry_after": answer.headers.get("Retry-After")}


async def _wait_for(condition, within_s: float = 30.0) -> None:
    """Poll `condition` (an async callable) until it holds; a hang guard, not a timing assertion."""
    async with asyncio.timeout(within_s):
        while not await condition():
            await asyncio.sleep(0.05)


# verl's tests/utils/reward_score/reward_score/test_sandbox_fusion_on_cpu.py::
# test_integration_concurrency_high_load, against our /run_code. verl's client (check_correctness in
# verl/utils/reward_score/sandbox_fusion/utils.py) sends one request per case from a thread pool of
# max(32, 5 x cpus) workers (32 here), with compile_timeout = run_timeout = 15, memory_limit_MB = 1024
# and a read timeout of compile + run + 10 = 40 s; any answer but 2xx, 503 included, is an API
# error (-1), and only 504 is retried. 100 cases: those at 5, 30, 60, 90 sleep 20 s and must come
# back TimeLimitExceeded (-3); those at 10, 25, 50 are given a wrong expected output (their run is a
# Success with stdout output_i, judged False); every other one is a Success with stdout output_i.
VERL_NUM_CASES = 100
VERL_WORKERS = 32
VERL_TIMEOUT_S = 15
VERL_READ_TIMEOUT_S = VERL_TIMEOUT_S + VERL_TIMEOUT_S + 10
VERL_SLEEPERS = {5, 30, 60, 90}
VERL_CODE = """
import sys
import time
data = sys.stdin.read()
if data.startswith('input_timeout_'):
    time.sleep(20)
    print(f"output_{data.split('_')[-1]}\\n", end='')
elif data.startswith('input_'):
    print(f"output_{data.split('_')[-1]}\\n", end='')
else:
    print("unknown_input\\n", end='')
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_verls_high_load_test_passes_against_the_sandboxfusion_route(backend: str) -> None:
    executor = await Executor.create(backend)  # the server's defaults, as `python -m sandbox.server` has them
    async with serve(create_app(executor)) as url:
        workers = asyncio.Semaphore(VERL_WORKERS)
        timeout = aiohttp.ClientTimeout(total=VERL_READ_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def case(index: int) -> tuple[int, str, str | None, str | None]:
                stdin = f"input_timeout_{index}" if index in VERL_SLEEPERS else f"input_{index}"
                body = {
                    "code": VERL_CODE,
                    "stdin": stdin,
                    "compile_timeout": VERL_TIMEOUT_S,
                    "run_timeout": VERL_TIMEOUT_S,
                    "memory_limit_MB": 1024,
                }
                async with workers:
                    status, answer = await _run_code(session, url, body)
                run = answer.get("run_result") or {}
                return status, answer.get("status", answer.get("error")), run.get("status"), run.get("stdout")

            answers = await asyncio.gather(*(case(index) for index in range(VERL_NUM_CASES)))
    expected = [
        (200, "Failed", "TimeLimitExceeded") if index in VERL_SLEEPERS else (200, "Success", "Finished")
        for index in range(VERL_NUM_CASES)
    ]
    assert [answer[:3] for answer in answers] == expected
    assert all(
        stdout == f"output_{index}\n"
        for index, (*_, stdout) in enumerate(answers)
        if index not in VERL_SLEEPERS
    )


CORES = len(os.sched_getaffinity(0))


@pytest.fixture(params=["bwrap", "docker"])
async def url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    # The default admission, with jails enough for twice as many sleeping runs as cores (Docker's
    # default pool has them: it grows, while every container is in use, to 8 per core).
    options = {"num_uids": 4 * CORES + 8} if request.param == "bwrap" else {}
    executor = await Executor.create(request.param, **options)
    async with serve(create_app(executor)) as base_url:
        yield base_url


async def test_quick_runs_are_served_while_more_runs_than_cores_sleep(url: str) -> None:
    sleeper = {"code": "import time\ntime.sleep(60)", "run_timeout": 20, "memory_limit_MB": 256}
    cores = CORES
    async with aiohttp.ClientSession() as session:
        sleepers = [asyncio.create_task(_run_code(session, url, sleeper)) for _ in range(2 * cores)]

        async def all_sleeping() -> bool:
            async with session.get(f"{url}/metrics") as answer:
                return (await answer.json())["in_flight"] == 2 * cores

        await _wait_for(all_sleeping)
        quick = {"code": "print(input())", "stdin": "hi", "run_timeout": 2}
        status, answer = await _run_code(session, url, quick, **{"X-Sandbox-Deadline-S": "10"})
        for task in sleepers:
            task.cancel()
        await asyncio.gather(*sleepers, return_exceptions=True)
    assert (status, answer["status"], answer["run_result"]["stdout"]) == (200, "Success", "hi\n")


async def test_a_run_waits_while_cpu_bound_runs_fill_the_cpu_slots_and_is_refused_in_time() -> None:
    # One CPU slot, room for eight runs: a spinning program takes the core, so the next run cannot
    # start in time to finish within its deadline (3 s less its 1 s run) and is answered busy.
    executor = await Executor.create("bwrap", max_concurrency=8, cpu_slots=1)
    async with serve(create_app(executor)) as base_url, aiohttp.ClientSession() as session:
        spinner = asyncio.create_task(_run_code(session, base_url, {"code": SPIN, "run_timeout": 8}))

        async def spinning() -> bool:
            async with session.get(f"{base_url}/metrics") as answer:
                return ((await answer.json())["busy_cores"] or 0) >= 0.5

        await _wait_for(spinning)
        quick = {"code": "print(1)", "run_timeout": 1}
        status, answer = await _run_code(session, base_url, quick, **{"X-Sandbox-Deadline-S": "3"})
        spinner.cancel()
        await asyncio.gather(spinner, return_exceptions=True)
    assert (status, answer["error"], answer["retry_after"].isdigit()) == (503, "busy", True)


def test_descendant_cpu_usage_counts_a_grandchild() -> None:
    before = descendant_cpu_usage()
    # The spinner is the child of a shell that waits for it: only walking the tree finds its CPU.
    shell = subprocess.Popen(["sh", "-c", f'{sys.executable} -c "{SPIN}"; :'], start_new_session=True)
    try:
        deadline = time.monotonic() + 60  # hang guard
        while descendant_cpu_usage().cpu_s - before.cpu_s < 1.0:
            assert time.monotonic() < deadline, "the grandchild's CPU time was never counted"
            time.sleep(0.05)
        runnable = max(descendant_cpu_usage().num_runnable for _ in range(20))
    finally:
        os.killpg(shell.pid, signal.SIGKILL)  # the shell and its spinning child
        shell.wait()
    assert runnable >= 1


async def test_the_cpu_gate_holds_a_run_while_a_child_spins_and_admits_it_once_it_stops() -> None:
    admission = Admission(max_concurrency=4, cpu_slots=1, memory_budget_mb=1024)
    spinner = await asyncio.create_subprocess_exec(sys.executable, "-c", SPIN)
    try:
        async with admission.admit(64):  # the spinner stands for this run's program
            await _wait_for(_async(lambda: (admission.busy_cores() or 0) >= 0.5))
            with pytest.raises(AdmissionTimeout):
                async with admission.admit(64, max_wait_s=0.5):
                    pass
            waiting = asyncio.create_task(_enter(admission))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            spinner.kill()
            await spinner.wait()
            await asyncio.wait_for(waiting, timeout=30)
    finally:
        if spinner.returncode is None:
            spinner.kill()
            await spinner.wait()
    assert admission.state().num_waiting == 0


def _async(check):
    async def condition() -> bool:
        return check()

    return condition


async def _enter(admission: Admission, memory_mb: int = 64) -> None:
    async with admission.admit(memory_mb):
        pass


async def test_runs_beyond_the_memory_budget_wait_and_start_in_arrival_order() -> None:
    admission = Admission(max_concurrency=8, cpu_slots=8, memory_budget_mb=1000, cpu_probe=None)
    started: list[str] = []
    release = asyncio.Event()

    async def run(name: str, memory_mb: int) -> None:
        async with admission.admit(memory_mb):
            started.append(name)
            await release.wait()

    tasks = [asyncio.create_task(run(name, mb)) for name, mb in (("a", 600), ("b", 600), ("c", 100))]
    await asyncio.sleep(0.05)
    # c would fit beside a, but b came first: arrival order, so a large run is never starved.
    assert (started, admission.state().num_waiting, admission.state().memory_in_flight_mb) == (["a"], 2, 600)
    release.set()
    await asyncio.gather(*tasks)
    assert started == ["a", "b", "c"]
    with pytest.raises(ValueError, match="can never fit the memory budget of 1000 MB"):
        async with admission.admit(1001):
            pass


async def test_a_run_that_times_out_waiting_leaves_the_queue() -> None:
    admission = Admission(max_concurrency=1, cpu_slots=1, memory_budget_mb=1000, cpu_probe=None)
    async with admission.admit(10):
        with pytest.raises(AdmissionTimeout, match="within 0.2 s"):
            async with admission.admit(10, max_wait_s=0.2):
                pass
        assert admission.state().num_waiting == 0
    assert admission.state().num_running == 0


async def test_a_waiting_run_cancelled_as_a_place_frees_leaves_the_queue_and_the_next_one_starts() -> None:
    admission = Admission(max_concurrency=1, cpu_slots=1, memory_budget_mb=1000, cpu_probe=None)
    release = asyncio.Event()

    async def hold() -> None:
        async with admission.admit(10):
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    first, second = asyncio.create_task(_enter(admission, 10)), asyncio.create_task(_enter(admission, 10))
    await asyncio.sleep(0)
    release.set()  # the holder leaves, and passes over the first waiter, cancelled meanwhile
    first.cancel()
    await asyncio.wait_for(asyncio.gather(holder, second), timeout=30)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert (admission.state().num_waiting, admission.state().num_running) == (0, 0)
