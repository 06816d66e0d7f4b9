"""Hostile programs against every real backend: each must get the right verdict and leave the host intact.

"Intact" is checked after every case: no process of the jail uids (or tagged as a red-team
helper) survives, no session dir or mount is left, and a file outside the jail is unchanged.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import docker
import pytest

from sandbox.backends.base import WORK_TMPFS_MB
from sandbox.backends.docker_container import INSTANCE_LABEL
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
from tests.sandbox.conftest import DAEMON_TAG, TEST_NUM_UIDS, TEST_UID_BASE, processes_matching

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMITS = RunLimits(time_s=2, memory_mb=256, max_output_bytes=64 << 10)
SENTINEL_TEXT = "untouched"
SECRET_ENV = "SANDBOX_REDTEAM_SECRET"
SECRET_VALUE = "hunter2-4d1c9e"


def _plain(code: str, stdin: str = "") -> RunRequest:
    return RunRequest(language=Language.PYTHON, code=code, stdin=stdin, limits=LIMITS)


async def _run(executor: Executor, code: str, stdin: str = "") -> RunResponse:
    response = await executor.run(_plain(code, stdin))
    assert response.sandbox_error is None, response.sandbox_error
    print(response.model_dump_json(exclude_defaults=True)[:2000])
    return response


def _jail_leftovers(backend_name: str, jail_root: Path) -> list[str]:
    uids = range(TEST_UID_BASE, TEST_UID_BASE + TEST_NUM_UIDS) if backend_name == "bwrap" else range(0)
    leftovers = processes_matching(uids, DAEMON_TAG)
    leftovers += [str(path) for path in jail_root.glob("sandbox-bwrap/session-*")]
    mounts = Path("/proc/self/mountinfo").read_text()
    leftovers += [line for line in mounts.splitlines() if str(jail_root) in line]
    return leftovers


@pytest.fixture(autouse=True)
def sentinel(backend_name: str, jail_root: Path, tmp_path: Path):
    """A file outside the jail that no program may change; leftovers are checked after each case."""
    path = tmp_path / "sentinel.txt"
    path.write_text(SENTINEL_TEXT)
    yield path
    deadline = time.monotonic() + 5.0  # a killed process may take a moment to be reaped
    while (leftovers := _jail_leftovers(backend_name, jail_root)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers == []
    assert path.read_text() == SENTINEL_TEXT


# --- time ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "while True:\n    pass",
        "import time\ntime.sleep(100)",
        "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass",
    ],
    ids=["infinite_loop", "long_sleep", "sigstop_self", "ignores_sigterm"],
)
async def test_a_program_that_never_finishes_is_killed_as_tle(executor: Executor, code: str) -> None:
    response = await _run(executor, code)
    assert response.verdict == Verdict.TLE


# --- processes ----------------------------------------------------------------------------


async def test_a_python_fork_bomb_is_contained_and_times_out(executor: Executor) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    assert (await _run(executor, code)).verdict == Verdict.TLE
    assert (await _run(executor, "print('after')")).run.stdout == "after\n"


async def test_a_shell_fork_bomb_is_contained(executor: Executor) -> None:
    code = (
        "import subprocess, time\n"
        "subprocess.run(['bash', '-c', ':(){ :|:& };:'])\n"
        "time.sleep(10)\n"
        "print('still running')"
    )
    assert (await _run(executor, code)).verdict == Verdict.TLE
    assert (await _run(executor, "print('after')")).run.stdout == "after\n"


async def test_a_double_forked_daemon_dies_with_the_run(executor: Executor) -> None:
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execvp('python3', ['python3', '-c', 'import time; time.sleep(1000)', '{DAEMON_TAG}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('parent done')"
    )
    response = await _run(executor, code)
    assert (response.verdict, response.run.stdout) == (Verdict.AC, "parent done\n")


# multiprocessing starts a resource tracker that exits on its own a moment after the program.
SHARED_MEMORY_AND_POOL = (
    "import multiprocessing\n"
    "from multiprocessing import shared_memory\n"
    "if __name__ == '__main__':\n"
    "    with multiprocessing.Pool(2) as pool:\n        print(pool.map(abs, [-1, -2, 3]))\n"
    "    block = shared_memory.SharedMemory(create=True, size=8)\n"
    "    block.buf[0] = 7\n    print(block.buf[0])\n    block.close()\n    block.unlink()\n"
)


async def test_a_program_using_shared_memory_and_a_pool_is_accepted_without_recycling(
    executor: Executor, backend_name: str
) -> None:
    recycled_before = executor.backend.stats.num_recycled if backend_name == "docker" else 0
    response = await _run(executor, SHARED_MEMORY_AND_POOL)
    assert (response.verdict, response.run.stdout) == (Verdict.AC, "[1, 2, 3]\n7\n")
    if backend_name == "docker":  # the helper was killed with the run: nothing to recycle for
        assert executor.backend.stats.num_recycled == recycled_before


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        (
            "import os\ntry:\n    os.kill(os.getppid(), 9)\nexcept OSError:\n    pass\nprint('alive')",
            Verdict.AC,
        ),
        ("import os\nos.killpg(0, 9)\nprint('alive')", Verdict.RE),
        ("import os\ntry:\n    os.kill(-1, 9)\nexcept OSError:\n    pass\nprint('alive')", Verdict.AC),
    ],
    ids=["kill_parent", "kill_own_process_group", "kill_minus_one"],
)
async def test_killing_everything_in_reach_only_hurts_the_program(
    executor: Executor, code: str, verdict: Verdict
) -> None:
    assert (await _run(executor, code)).verdict == verdict
    assert (await _run(executor, "print('after')")).run.stdout == "after\n"


# --- memory, recursion, output, files -------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    ["x = bytearray(1 << 33)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"],
    ids=["one_huge_allocation", "growing_allocation"],
)
async def test_allocating_past_the_memory_limit_is_mle(executor: Executor, code: str) -> None:
    assert (await _run(executor, code)).verdict == Verdict.MLE


async def test_unbounded_recursion_is_a_runtime_error(executor: Executor) -> None:
    assert (await _run(executor, "def f():\n    return f()\nf()")).verdict == Verdict.RE


@pytest.mark.parametrize(
    ("code", "stream"),
    [
        (
            "import sys\nblock = b'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.buffer.write(block)",
            "stdout",
        ),
        ("import sys\nwhile True:\n    sys.stderr.write('e' * 1000)", "stderr"),
    ],
    ids=["one_gigabyte_of_stdout", "endless_stderr"],
)
async def test_flooding_output_is_ole_and_capped(executor: Executor, code: str, stream: str) -> None:
    response = await _run(executor, code)
    assert response.verdict == Verdict.OLE
    assert len(getattr(response.run, stream).encode()) <= LIMITS.max_output_bytes


@pytest.mark.parametrize("directory", ["/work", "/tmp"])
async def test_writing_a_huge_file_is_ole(executor: Executor, directory: str) -> None:
    code = f"block = b'x' * (1 << 20)\nwith open('{directory}/big', 'wb') as f:\n    for _ in range(1024):\n        f.write(block)"
    assert (await _run(executor, code)).verdict == Verdict.OLE


async def test_creating_files_without_end_is_stopped_and_cleaned_up(executor: Executor) -> None:
    code = "i = 0\nwhile True:\n    open(f'/work/f{i}', 'w').close()\n    i += 1"
    # /work is a tmpfs with an inode limit on both backends: the loop runs out of inodes, which
    # is the program exceeding its output allowance.
    assert (await _run(executor, code)).verdict == Verdict.OLE


# Fills one directory with 8 MiB files (each below the file size limit) until a write fails:
# prints the error's errno (or None) and how many MiB were written.
FILL_DIRECTORY = """
import os
written, error = 0, None
try:
    for index in range(40):
        with open(f'{directory}/fill{{index}}', 'wb') as handle:
            for _ in range(8):
                handle.write(b'x' * (1 << 20))
                written += 1
except OSError as raised:
    error = raised.errno
print(error, written)
"""


@pytest.mark.parametrize("directory", ["/work", "/tmp"])
async def test_writing_past_the_disk_quota_fails_with_enospc_and_is_ole(
    executor: Executor, directory: str
) -> None:
    response = await _run(executor, FILL_DIRECTORY.format(directory=directory))
    error, written_mb = response.run.stdout.split()
    assert (response.verdict, error) == (Verdict.OLE, str(errno.ENOSPC))
    assert int(written_mb) <= WORK_TMPFS_MB  # the quota of /work and of /tmp alike
    assert (await _run(executor, "print('after')")).run.stdout == "after\n"


async def test_opening_too_many_files_is_a_runtime_error(executor: Executor) -> None:
    code = "files = [open(f'/work/f{i}', 'w') for i in range(100000)]"
    response = await _run(executor, code)
    assert response.verdict == Verdict.RE
    assert "Too many open files" in response.run.stderr


# --- what the program may see and touch -----------------------------------------------------


async def test_host_secrets_are_not_readable(executor: Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET_VALUE)
    code = (
        "import os, glob\n"
        "seen = [repr(dict(os.environ))]\n"
        "for path in ['/etc/shadow', '/etc/passwd', '/root/.bashrc'] + glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        seen.append(path + ':' + open(path, errors='replace').read())\n"
        "    except OSError:\n"
        "        pass\n"
        "print('\\n'.join(seen))"
    )
    response = await _run(executor, code)
    assert response.verdict == Verdict.AC
    assert SECRET_VALUE not in response.run.stdout
    assert "root:" not in response.run.stdout  # neither shadow nor passwd entries


async def test_writes_outside_work_and_tmp_fail(executor: Executor, sentinel: Path) -> None:
    targets = ["/usr/evil", "/etc/evil", "/evil", "/work/../evil", "/proc/evil", str(sentinel), "/bin/sh"]
    code = (
        "written = []\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        with open(path, 'a') as f:\n"
        "            f.write('pwned')\n"
        "        written.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(written)"
    )
    response = await _run(executor, code)
    assert (response.verdict, response.run.stdout) == (Verdict.AC, "[]\n")


async def test_runs_cannot_see_each_others_files(executor: Executor) -> None:
    writer = _plain(
        "import time\n"
        "open('/work/secret-of-a', 'w').write('a')\n"
        "open('/tmp/secret-of-a', 'w').write('a')\n"
        "time.sleep(1.5)"
    )
    reader = _plain(
        "import os, time\n"
        "time.sleep(0.7)\n"
        "found = []\n"
        "for d, dirs, files in os.walk('/'):\n"
        "    if d == '/':  # read-only system trees cannot hold another run's files (and /usr is slow to walk)\n"
        "        dirs[:] = [name for name in dirs if name not in ('proc', 'sys', 'usr')]\n"
        "    found += [os.path.join(d, f) for f in files if 'secret-of-a' in f]\n"
        "print(found)"
    )
    _, concurrent = await executor.run_many([writer, reader])
    after = await _run(executor, "import os\nprint(sorted(os.listdir('/work')), os.listdir('/tmp'))")
    assert concurrent.run.stdout == "[]\n"
    assert "secret-of-a" not in after.run.stdout


async def test_the_network_is_unreachable(executor: Executor) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = (
        "import socket\n"
        "reached = []\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "    reached.append('tcp')\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        "    socket.getaddrinfo('example.com', 80)\n"
        "    reached.append('dns')\n"
        "except OSError:\n"
        "    pass\n"
        "print(reached)"
    )
    try:
        response = await _run(executor, code)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    assert (response.verdict, response.run.stdout) == (Verdict.AC, "[]\n")


# Tries to make or enter a namespace every way there is, each in a fresh child (an attempt that
# succeeded would change what the next one can do) and returns {attempt: errno, 0 if it succeeded}.
MAKE_NAMESPACES = """
import ctypes, errno, os, platform, subprocess
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CLONE_NUMBERS = {'x86_64': (56, 435), 'aarch64': (220, 435)}[platform.machine()]
NEWUSER, NEWNET, NEWNS, SIGCHLD = 0x10000000, 0x40000000, 0x20000, 17

def errno_of(result):
    return ctypes.get_errno() if result < 0 else 0

def in_child(attempt):
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(attempt())
        finally:
            os._exit(255)  # the attempt raised: neither refused nor done
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

def raw_clone(number, *args):
    pid = libc.syscall(number, *[ctypes.c_long(arg) for arg in args])
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
    return errno_of(pid)

def clone3_user():
    clone_args = (ctypes.c_uint64 * 8)(NEWUSER, 0, 0, 0, SIGCHLD, 0, 0, 0)
    return raw_clone(CLONE_NUMBERS[1], ctypes.addressof(clone_args), ctypes.sizeof(clone_args))

def unshare_command():
    done = subprocess.run(['unshare', '-Ur', 'true'], capture_output=True)
    return 0 if done.returncode == 0 else errno.EPERM if b'Operation not permitted' in done.stderr else 255

def attempts():
    return {
        'unshare_user': in_child(lambda: errno_of(libc.unshare(NEWUSER))),
        'unshare_net': in_child(lambda: errno_of(libc.unshare(NEWNET))),
        'unshare_mount': in_child(lambda: errno_of(libc.unshare(NEWNS))),
        'unshare_command': in_child(unshare_command),
        'setns_net': in_child(lambda: errno_of(libc.setns(os.open('/proc/self/ns/net', os.O_RDONLY), 0))),
        'clone_user': in_child(lambda: raw_clone(CLONE_NUMBERS[0], NEWUSER | SIGCHLD, 0, 0, 0, 0)),
        'clone_net': in_child(lambda: raw_clone(CLONE_NUMBERS[0], NEWNET | SIGCHLD, 0, 0, 0, 0)),
        'clone3_user': in_child(clone3_user),
    }
"""
# EPERM from the filter for all but clone3, which must look absent so that libc falls back to clone.
NAMESPACES_REFUSED = {
    "unshare_user": errno.EPERM, "unshare_net": errno.EPERM, "unshare_mount": errno.EPERM,
    "unshare_command": errno.EPERM, "setns_net": errno.EPERM, "clone_user": errno.EPERM,
    "clone_net": errno.EPERM, "clone3_user": errno.ENOSYS,
}  # fmt: skip


async def test_a_program_can_make_or_enter_no_namespace(executor: Executor) -> None:
    response = await _run(executor, MAKE_NAMESPACES + "import json\nprint(json.dumps(attempts()))")
    assert (response.verdict, json.loads(response.run.stdout)) == (Verdict.AC, NAMESPACES_REFUSED)


async def test_under_the_judge_of_call_and_assert_tests_a_program_can_make_no_namespace(
    executor: Executor,
) -> None:
    """The judge's own user and PID namespaces exist here: the program still makes none of its own."""
    tests = [CallTest(expected=NAMESPACES_REFUSED)]
    call = RunRequest(
        language=Language.PYTHON, code=MAKE_NAMESPACES, entry_point="attempts", tests=tests, limits=LIMITS
    )
    test_code = f"found = attempts()\nassert found == {NAMESPACES_REFUSED!r}, found"
    call_response = await executor.run(call)
    assert_response = await executor.run(_assert_request(MAKE_NAMESPACES, test_code))
    assert call_response.verdict == Verdict.AC, call_response.tests[0]
    assert assert_response.verdict == Verdict.AC, assert_response.tests[0]


# --- judging tricks -------------------------------------------------------------------------


def _assert_request(code: str, test_code: str) -> RunRequest:
    return RunRequest(language=Language.PYTHON, code=code, tests=[AssertTest(code=test_code)], limits=LIMITS)


@pytest.mark.parametrize(
    "code",
    [
        "import sys\ndef f(x):\n    return x\nsys.exit(0)",
        "import os\ndef f(x):\n    return x\nos._exit(0)",
        "import os\ndef f(x):\n    os._exit(0)",
        "def f(x):\n    raise SystemExit(0)",
        "import os, signal\ndef f(x):\n    os.kill(os.getppid(), signal.SIGKILL)\n    os._exit(0)",
    ],
    ids=["sys_exit_at_import", "os_exit_at_import", "os_exit_in_call", "system_exit_in_call", "kill_harness"],
)
async def test_exiting_before_the_asserts_run_is_not_accepted(executor: Executor, code: str) -> None:
    response = await executor.run(_assert_request(code, "assert f(1) == 2"))
    assert response.verdict == Verdict.RE


FORGE_FROM_MEMORY = """
import os, re
candidates = set()
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    for name in ('environ', 'cmdline', 'fd/0'):
        try:
            candidates.update(re.findall(rb'[0-9a-f]{32}', open(f'/proc/{pid}/{name}', 'rb').read()))
        except OSError:
            pass
    try:
        with open(f'/proc/{pid}/maps') as maps, open(f'/proc/{pid}/mem', 'rb') as mem:
            for line in maps:
                start, end = (int(x, 16) for x in line.split()[0].split('-'))
                if 'r' in line.split()[1] and end - start < (64 << 20):
                    mem.seek(start)
                    candidates.update(re.findall(rb'[0-9a-f]{32}', mem.read(end - start)))
    except (OSError, ValueError, OverflowError):
        pass
for candidate in list(candidates)[:200]:
    os.write(1, b'\\n' + candidate + b' {"status": "ok"}\\n')
os.kill(os.getppid(), 9)  # the harness would print the real report last
os._exit(0)
"""


STEAL_REPORT_LINE = """
import ctypes, os, re, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # a daemon that reads the harness's report back out of the stdout pipe
        try:
            ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: may open /proc/self/fd again
            pipe, seen = os.open('/proc/self/fd/1', os.O_RDONLY), b''
            while chunk := os.read(pipe, 65536):
                seen += chunk
                if found := re.search(rb'\\n([0-9a-f]{32}) ', seen):
                    os.write(1, b'\\n' + found.group(1) + b' {"status": "ok"}\\n')
                    break
        finally:
            os._exit(0)
    os._exit(0)
time.sleep(0.2)
"""


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        (  # the judge is out of the program's reach: it survives the kill and reports the failed assert
            "import os\nos.write(1, b'\\n' + b'0' * 32 + b' {\"status\": \"ok\"}\\n')\nos.kill(os.getppid(), 9)",
            Verdict.WA,
        ),
        (
            "print(open('/work/_harness.py').read()[:0] + '\\n' + 'a' * 32 + ' {\"status\": \"ok\"}')\nraise SystemExit",
            Verdict.RE,
        ),
        (FORGE_FROM_MEMORY, Verdict.RE),
        (STEAL_REPORT_LINE, Verdict.WA),  # the daemon is dead before the report is printed: assert False
    ],
    ids=["guessed_marker", "marker_format_from_harness_source", "marker_searched_in_memory", "report_stolen"],
)
async def test_forged_completion_markers_are_rejected(
    executor: Executor, code: str, verdict: Verdict
) -> None:
    response = await executor.run(_assert_request(code, "assert False"))
    assert response.verdict == verdict


# A harness that would pass anything: it echoes the run's marker with an "ok" report.
FORGED_HARNESS = (
    'import os\nmarker = os.read(0, 32)\nos.write(1, b"\\n" + marker + b\' {"status": "ok"}\\n\')\n'
)
REWRITE_HARNESS = (
    f"import os\nos.remove('/work/_harness.py')\nopen('/work/_harness.py', 'w').write({FORGED_HARNESS!r})"
)


async def test_a_program_that_rewrites_the_harness_cannot_pass_later_tests(executor: Executor) -> None:
    tests = [AssertTest(code="assert False"), AssertTest(code="assert False")]
    request = RunRequest(language=Language.PYTHON, code=REWRITE_HARNESS, tests=tests, limits=LIMITS)
    response = await executor.run(request)
    assert [test.verdict for test in response.tests] == [Verdict.WA, Verdict.WA]


async def test_replacing_judge_files_with_directories_is_not_a_sandbox_error(executor: Executor) -> None:
    code = (
        "import os\n"
        "for name in ['_harness.py', '_program.py', '_plain_data.py', '_test.json']:\n"
        "    os.remove(name)\n"
        "    os.makedirs(name + '/deeper')\n"
    )
    tests = [AssertTest(code="assert True"), AssertTest(code="assert True")]
    response = await executor.run(RunRequest(language=Language.PYTHON, code=code, tests=tests, limits=LIMITS))
    assert (response.verdict, response.num_passed, response.sandbox_error) == (Verdict.AC, 2, None)


def _call_request(code: str, expected: object) -> RunRequest:
    test = CallTest(args=[1], expected=expected)
    return RunRequest(language=Language.PYTHON, code=code, entry_point="f", tests=[test], limits=LIMITS)


@pytest.mark.parametrize(
    "code",
    [
        "class AlwaysEqual:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return AlwaysEqual()",
        "class Sneaky(int):\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Sneaky(0)",
        "class Sneaky(list):\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Sneaky()",
        'import os\ndef f(x):\n    os.write(1, b\'\\n\' + b\'0\' * 32 + b\' {"status": "ok", "value": "[1, 2]"}\\n\')\n    os._exit(0)',
    ],
    ids=["always_equal_object", "int_subclass", "list_subclass", "forged_return_value"],
)
async def test_return_values_are_compared_on_the_host(executor: Executor, code: str) -> None:
    response = await executor.run(_call_request(code, [1, 2]))
    assert response.verdict in (Verdict.WA, Verdict.RE)
    assert response.tests[0].verdict != Verdict.AC


async def test_an_unserialisable_return_value_is_wa_with_a_message(executor: Executor) -> None:
    response = await executor.run(_call_request("def f(x):\n    return object()", 1))
    assert response.verdict == Verdict.WA
    assert response.tests[0].message == "return value is not plain data: object: object is not plain data"


async def test_printing_only_a_prefix_of_the_expected_output_is_wa(executor: Executor) -> None:
    test = StdioTest(expected_stdout="1\n2\n3\n")
    request = RunRequest(language=Language.PYTHON, code="print(1)\nprint(2)", tests=[test], limits=LIMITS)
    response = await executor.run(request)
    assert response.verdict == Verdict.WA
    assert response.tests[0].message == "expected 3 lines, got 2"


async def test_invalid_utf8_and_nul_bytes_in_output_come_back_replaced(executor: Executor) -> None:
    code = "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x00abc\\n')\nsys.stderr.buffer.write(b'\\x80')"
    response = await _run(executor, code)
    assert response.run.stdout == "\ufffd\ufffd\x00abc\n"
    assert response.run.stderr == "\ufffd"
    assert RunResponse.model_validate_json(response.model_dump_json()) == response


# Every run leaves traces that must not reach the next one: files in /work and /tmp, a SysV
# shared memory segment and, every tenth run, a detached daemon. It prints what it found first.
LEAVE_TRACES = f"""
import ctypes, os
seen = (sorted(os.listdir('/work')), os.listdir('/tmp'), len(open('/proc/sysvipc/shm').readlines()) - 1)
open('/work/left', 'w').write('x')
open('/tmp/left', 'w').write('x')
ctypes.CDLL(None).shmget(0x5EED, 4096, 0o1600)
if {{index}} % 10 == 0 and os.fork() == 0:
    os.setsid()
    os.execvp('python3', ['python3', '-c', 'import time; time.sleep(100)', '{DAEMON_TAG}'])
print({{index}}, *seen)
"""


def _held_test_uids(jail_root: Path) -> list[int]:
    """Test uids whose machine-wide lock is still held (flock conflicts across open files)."""
    held = []
    for uid in range(TEST_UID_BASE, TEST_UID_BASE + TEST_NUM_UIDS):
        path = Path(tempfile.gettempdir()) / "sandbox-bwrap-uids" / f"{uid}.lock"
        if not path.exists():
            continue
        with path.open("rb") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(uid)
    return held


def _test_uid_cgroups() -> list[str]:
    """Session cgroups that a test uid may join (their cgroup.procs belong to it)."""
    uids = range(TEST_UID_BASE, TEST_UID_BASE + TEST_NUM_UIDS)
    procs_files = Path("/sys/fs/cgroup").glob("**/sandbox-bwrap/*/cgroup.procs")
    return [str(path.parent) for path in procs_files if path.stat().st_uid in uids]


@pytest.mark.slow
async def test_many_sequential_runs_leave_nothing_behind(
    executor: Executor, backend_name: str, jail_root: Path
) -> None:
    """Volume: SANDBOX_SOAK_RUNS runs (300 by default; the README's soak command runs 10,000)."""
    num_runs = int(os.environ.get("SANDBOX_SOAK_RUNS", "300"))
    started = time.monotonic()
    for index in range(num_runs):
        request = _plain(LEAVE_TRACES.format(index=index)).model_copy(update={"limits": RunLimits(time_s=10)})
        response = await executor.run(request)
        assert response.run is not None, response.model_dump_json(exclude_defaults=True)
        assert (response.verdict, response.run.stdout) == (Verdict.AC, f"{index} ['main.py'] [] 0\n"), (
            response
        )
    elapsed = time.monotonic() - started
    print(f"{backend_name}: {num_runs} sequential runs, {1000 * elapsed / num_runs:.1f} ms per run")
    assert _held_test_uids(jail_root) == []
    assert _test_uid_cgroups() == []
    if backend_name == "docker":
        containers = docker.from_env().containers.list(
            all=True, filters={"label": f"{INSTANCE_LABEL}={executor.backend.instance_id}"}
        )
        assert len(containers) <= executor.backend.config.pool_size
