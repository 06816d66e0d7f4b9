"""Hostile programs against the judge's integrity, on every real backend (issue classes a-d, g).

Each case is something a policy under optimisation pressure could learn: crash the host-side
judge, turn its failure into an excluded SANDBOX_ERROR, or get a verdict from text it prints.
The host is checked intact after every case by test_redteam's `sentinel` fixture.
"""

from __future__ import annotations

import asyncio

import pytest

from sandbox.executor import Executor
from sandbox.types import (
    AssertTest,
    CallTest,
    Language,
    RunLimits,
    RunRequest,
    RunResponse,
    StdioTest,
    Verdict,
)
from tests.sandbox.conftest import TEST_NUM_UIDS
from tests.sandbox.test_redteam import sentinel  # noqa: F401 - the host-intact check after every case

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMITS = RunLimits(time_s=2, memory_mb=256, max_output_bytes=64 << 10)
# Builds a directory tree 1,500 levels deep under the given directory, deeper than Python's
# recursion limit and than PATH_MAX allows as one path.
DEEP_TREE = """
import os
def deep_tree(top):
    fd = os.open(top, os.O_RDONLY)
    for _ in range(1500):
        os.mkdir('d', dir_fd=fd)
        child = os.open('d', os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
"""


def _call(code: str, expected: object, float_tolerance: float | None = None) -> RunRequest:
    test = CallTest(args=[], expected=expected)
    return RunRequest(
        language=Language.PYTHON, code=code, entry_point="f", tests=[test], limits=LIMITS,
        float_tolerance=float_tolerance,
    )  # fmt: skip


def _plain(code: str, limits: RunLimits = LIMITS) -> RunRequest:
    return RunRequest(language=Language.PYTHON, code=code, limits=limits)


async def _still_serves_every_session(executor: Executor) -> None:
    """More requests than the pool has jails: each must come back, so none was leaked."""
    requests = [_plain(f"print({index})") for index in range(TEST_NUM_UIDS + 2)]
    responses = await asyncio.wait_for(executor.run_many(requests), timeout=60)
    assert [response.run.stdout for response in responses] == [f"{i}\n" for i in range(len(requests))]


# --- (a) nothing a program returns escapes Executor.run ----------------------------------------


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            "def f():\n    value = []\n    for _ in range(980):\n        value = [value]\n    return value",
            "return value is not plain data: list: nested deeper than 100",
        ),
        (
            "def f():\n    value = {}\n    for _ in range(150):\n        value = {'k': value}\n    return value",
            "return value is not plain data: dict: nested deeper than 100",
        ),
    ],
    ids=["list_980_deep", "dict_150_deep"],
)
async def test_a_deeply_nested_return_value_is_wa_and_leaks_no_session(
    executor: Executor, code: str, message: str
) -> None:
    response = await executor.run(_call(code, [1]))
    assert (response.verdict, response.tests[0].message, response.sandbox_error) == (
        Verdict.WA,
        message,
        None,
    )
    await _still_serves_every_session(executor)


@pytest.mark.parametrize(
    ("returned", "expected", "verdict"),
    [("10**400", 10**400 + 1, Verdict.WA), ("10**400", 10**400, Verdict.AC), ("-(10**400)", 1.5, Verdict.WA)],
    ids=["differs_by_one", "equal", "against_a_float"],
)
async def test_integers_beyond_float_range_compare_exactly_under_a_tolerance(
    executor: Executor, returned: str, expected: object, verdict: Verdict
) -> None:
    response = await executor.run(_call(f"def f():\n    return {returned}", expected, float_tolerance=1e-6))
    assert (response.verdict, response.sandbox_error) == (verdict, None)


async def test_health_is_unhealthy_while_every_jail_is_held_and_healthy_after(executor: Executor) -> None:
    backend = executor.backend
    num_jails = backend.config.pool_size if backend.name == "docker" else TEST_NUM_UIDS
    sessions = [await backend.open_session() for _ in range(num_jails)]
    try:
        reason = await executor.unhealthy_reason(timeout_s=0.5)
    finally:
        for session in sessions:
            await session.close()
    assert reason == "no jail could be had within 0.5s although no request is running on every slot"
    assert await executor.unhealthy_reason(timeout_s=10) is None


# --- (b) exact exit statuses ---------------------------------------------------------------------


@pytest.mark.parametrize("code", [129, 137, 152, 153, 192])
async def test_exit_codes_above_128_are_exit_codes_not_signals(executor: Executor, code: int) -> None:
    response = await executor.run(_plain(f"import sys\nsys.exit({code})"))
    assert (response.verdict, response.run.exit_code, response.run.message) == (Verdict.RE, code, "")


@pytest.mark.parametrize(("name", "number"), [("SIGTERM", 15), ("SIGKILL", 9), ("SIGSEGV", 11)])
async def test_a_program_killed_by_a_signal_is_reported_with_that_signal(
    executor: Executor, name: str, number: int
) -> None:
    response = await executor.run(_plain(f"import os\nos.kill(os.getpid(), {number})"))
    assert (response.verdict, response.run.exit_code, response.run.message) == (
        Verdict.RE,
        None,
        f"killed by signal {name}",
    )


# Tries to take over the jail's PID 1 (ours on both backends), then exits 3.
ATTACK_PID_ONE = """
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
attached = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH
for number in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
    try:
        os.kill(1, number)
    except OSError:
        pass
try:
    open('/proc/1/mem', 'rb').read(1)
    readable = True
except OSError:
    readable = False
print(attached, readable, flush=True)
os._exit(3)
"""


async def test_a_program_cannot_take_over_pid_1_and_its_own_exit_status_stands(executor: Executor) -> None:
    response = await executor.run(_plain(ATTACK_PID_ONE))
    assert (response.verdict, response.run.exit_code, response.run.stdout) == (Verdict.RE, 3, "-1 False\n")


# --- (c) verdicts never come from program text ------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["MemoryError", "OSError: [Errno 27] File too large", "OSError: [Errno 28] No space left on device"],
)
async def test_printing_a_limit_error_to_stderr_is_a_plain_runtime_error(
    executor: Executor, text: str
) -> None:
    response = await executor.run(_plain(f"import sys\nsys.stderr.write({text!r} + '\\n')\nsys.exit(1)"))
    assert (response.verdict, response.run.exit_code) == (Verdict.RE, 1)


async def test_raising_memory_error_in_an_assert_test_is_a_runtime_error(executor: Executor) -> None:
    tests = [AssertTest(code="raise MemoryError()")]
    response = await executor.run(RunRequest(language=Language.PYTHON, code="", tests=tests, limits=LIMITS))
    assert (response.verdict, response.tests[0].message) == (Verdict.RE, "MemoryError: ")


@pytest.mark.parametrize("printed", ["١٠", "1_0", "１٠", "١٠.٠"])
async def test_non_ascii_digits_do_not_pass_a_float_tolerance(executor: Executor, printed: str) -> None:
    request = RunRequest(
        language=Language.PYTHON, code=f"print({printed!r})", tests=[StdioTest(expected_stdout="10\n")],
        limits=LIMITS, float_tolerance=1e-6,
    )  # fmt: skip
    assert (await executor.run(request)).verdict == Verdict.WA


# --- (d) nothing a program does within its limits is a SANDBOX_ERROR -------------------------------


async def test_a_directory_tree_deeper_than_the_stack_in_the_work_dir_is_cleaned_up(
    executor: Executor,
) -> None:
    tests = [StdioTest(expected_stdout="ok\n"), StdioTest(expected_stdout="ok\n")]
    code = (
        DEEP_TREE
        + "import os\nif not os.path.exists('/work/t'):\n    os.mkdir('/work/t')\n    deep_tree('/work/t')\nprint('ok')"
    )
    request = RunRequest(language=Language.PYTHON, code=code, tests=tests, limits=LIMITS)
    response: RunResponse = await executor.run(request)
    assert (response.verdict, response.num_passed, response.sandbox_error) == (Verdict.AC, 2, None)
    await _still_serves_every_session(executor)


async def test_replacing_the_harness_with_a_deep_tree_is_not_a_sandbox_error(executor: Executor) -> None:
    code = (
        DEEP_TREE
        + "import os\nos.remove('/work/_harness.py')\nos.mkdir('/work/_harness.py')\ndeep_tree('/work/_harness.py')"
    )
    tests = [AssertTest(code="assert True"), AssertTest(code="assert True")]
    response = await executor.run(RunRequest(language=Language.PYTHON, code=code, tests=tests, limits=LIMITS))
    assert (response.verdict, response.num_passed, response.sandbox_error) == (Verdict.AC, 2, None)


async def test_output_far_above_the_memory_limit_is_streamed_not_held(executor: Executor) -> None:
    # 190 MB of output with 128 MB of memory: the output limit is the request's business.
    code = "import sys\nblock = b'x' * (1 << 20)\nfor _ in range(190):\n    sys.stdout.buffer.write(block)"
    limits = RunLimits(time_s=20, memory_mb=128, max_output_bytes=256 << 20)
    response = await executor.run(_plain(code, limits))
    assert (response.verdict, len(response.run.stdout), response.sandbox_error) == (
        Verdict.AC,
        190 << 20,
        None,
    )


async def test_output_past_a_large_limit_is_ole_and_cut_at_the_limit(executor: Executor) -> None:
    code = "import sys\nblock = b'y' * (1 << 20)\nwhile True:\n    sys.stderr.buffer.write(block)"
    limits = RunLimits(time_s=5, memory_mb=64, max_output_bytes=100 << 20)
    response = await executor.run(_plain(code, limits))
    assert (response.verdict, len(response.run.stderr), response.sandbox_error) == (
        Verdict.OLE,
        100 << 20,
        None,
    )


# --- (g) limits hold over the whole run, across processes and files ---------------------------

BURN_IN_WORKERS = """
import os, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
workers = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        burn(0.6)
        os._exit(0)
    workers.append(pid)
for pid in workers:
    os.waitpid(pid, 0)
print('done')
"""
HOLD_IN_CHILDREN = """
import os, time
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        block = bytearray(100 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(0.5)
        os._exit(0)
    children.append(pid)
print([os.waitpid(pid, 0)[1] for pid in children])
"""
# Memory-backed directories a program can write: Docker's /tmp tmpfs, the /dev tmpfs bwrap makes.
MEMORY_DIRECTORY = {"docker": "/tmp", "bwrap": "/dev"}


async def test_cpu_time_of_forked_workers_counts_toward_the_time_limit(executor: Executor) -> None:
    limits = RunLimits(time_s=1, memory_mb=256, max_output_bytes=1024)
    response = await executor.run(_plain(BURN_IN_WORKERS, limits))
    assert response.verdict == Verdict.TLE


async def test_memory_of_two_children_counts_together(executor: Executor) -> None:
    limits = RunLimits(time_s=5, memory_mb=128, max_output_bytes=1024)
    assert (await executor.run(_plain(HOLD_IN_CHILDREN, limits))).verdict == Verdict.MLE


async def test_one_process_past_the_memory_limit_is_mle(executor: Executor) -> None:
    code = (
        "block = bytearray(220 << 20)\nfor i in range(0, len(block), 4096):\n    block[i] = 1\nprint('held')"
    )
    limits = RunLimits(time_s=5, memory_mb=128, max_output_bytes=1024)
    assert (await executor.run(_plain(code, limits))).verdict == Verdict.MLE


async def test_files_in_memory_backed_directories_count_toward_the_memory_limit(
    executor: Executor, backend_name: str
) -> None:
    directory = MEMORY_DIRECTORY[backend_name]
    code = f"for index in range(7):\n    open(f'{directory}/fill{{index}}', 'wb').write(b'x' * (8 << 20))\nprint('kept')"
    limits = RunLimits(time_s=5, memory_mb=32, max_output_bytes=1024)
    response = await executor.run(_plain(code, limits))
    assert (response.verdict, response.sandbox_error) == (Verdict.MLE, None)
    await _still_serves_every_session(executor)
