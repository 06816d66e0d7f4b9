"""Hostile programs against the judge of call and assert tests, and the seccomp filter, on every real backend.

The dataset's test code runs in a judge process apart from the program, which the program can
neither signal nor ptrace, and only plain data crosses between them (issue classes 1 and 5); the
test code gets only the program's functions it calls, never a builtin or a name of its own.
The host is checked intact after every case by test_redteam's `sentinel` fixture.
"""

from __future__ import annotations

import errno
import json

import pytest

from sandbox.executor import Executor
from sandbox.types import AssertTest, CallTest, Language, RunLimits, RunRequest, Verdict
from tests.sandbox.test_redteam import sentinel  # noqa: F401 - the host-intact check after every case

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMITS = RunLimits(time_s=3, memory_mb=256, max_output_bytes=64 << 10)


def _assert_request(code: str, *test_codes: str) -> RunRequest:
    tests = [AssertTest(code=test_code) for test_code in test_codes]
    return RunRequest(language=Language.PYTHON, code=code, tests=tests, limits=LIMITS)


# --- the judge is out of the program's reach -----------------------------------------------

WRITE_EVERY_FD = """
import os
def add(a, b):
    return 0
for fd in range(3, 256):
    for forged in (b'{"status": "ok"}\\n', b'{"ready": {}}\\n', b'{"value": 3}\\n'):
        try:
            os.write(fd, forged)
        except OSError:
            pass
os._exit(0)
"""

KILL_EVERYTHING_IN_SIGHT = """
import os, signal
def add(a, b):
    for target in [-1] + [int(pid) for pid in os.listdir('/proc') if pid.isdigit()]:
        if target != os.getpid():
            for number in (signal.SIGSTOP, signal.SIGKILL):
                try:
                    os.kill(target, number)
                except OSError:
                    pass
    return 0
"""

WALK_THE_STACK = """
import sys
def add(a, b):
    frame = sys._getframe()
    while frame is not None:  # only the program server's own frames: no report, no marker here
        for names in (frame.f_locals, frame.f_globals):
            for name in list(names):
                if name in ('report_fd', 'marker', '_dumps', 'json'):
                    names[name] = None
        frame = frame.f_back
    return 0
"""


KILL_OWN_PROCESS_GROUP = "import os, signal\ndef add(a, b):\n    os.killpg(0, signal.SIGKILL)\n"


@pytest.mark.parametrize(
    "code",
    [WRITE_EVERY_FD, KILL_EVERYTHING_IN_SIGHT, WALK_THE_STACK, KILL_OWN_PROCESS_GROUP],
    ids=[
        "write_every_fd_then_exit",
        "kill_and_stop_every_visible_process",
        "walk_the_stack",
        "kill_own_group",
    ],
)
async def test_attacks_on_the_judge_do_not_pass_a_failing_assert(executor: Executor, code: str) -> None:
    response = await executor.run(_assert_request(code, "assert add(1, 2) == 3"))
    assert response.verdict in (Verdict.WA, Verdict.RE)
    assert response.sandbox_error is None


async def test_the_judge_survives_every_signal_the_program_sends_and_reports_the_failed_assert(
    executor: Executor,
) -> None:
    response = await executor.run(_assert_request(KILL_EVERYTHING_IN_SIGHT, "assert add(1, 2) == 3"))
    assert (response.verdict, response.tests[0].message) == (Verdict.WA, "assertion failed")


@pytest.mark.parametrize(
    "returned",
    [
        "type('AlwaysEqual', (), {'__eq__': lambda self, other: True})()",
        "type('EqualInt', (int,), {'__eq__': lambda self, other: True})(0)",
        "type('EqualList', (list,), {'__eq__': lambda self, other: True})()",
    ],
    ids=["object", "int_subclass", "list_subclass"],
)
async def test_a_value_that_equals_everything_does_not_pass_an_assert(
    executor: Executor, returned: str
) -> None:
    code = f"def add(a, b):\n    return {returned}\n"
    response = await executor.run(_assert_request(code, "assert add(1, 2) == 3"))
    assert response.verdict == Verdict.WA
    assert response.tests[0].message.startswith("return value is not plain data: ")


async def test_plain_values_keep_their_types_across_the_boundary(executor: Executor) -> None:
    code = "def f():\n    return (1, 2), {1: 'a'}, {3}, frozenset({4}), b'x', 2j, [None, True, 1.5]\n"
    test = (
        "assert f() == ((1, 2), {1: 'a'}, {3}, frozenset({4}), b'x', 2j, [None, True, 1.5])\n"
        "assert type(f()[0]) is tuple and f()[0] != [1, 2]\n"
    )
    response = await executor.run(_assert_request(code, test))
    assert (response.verdict, response.num_passed) == (Verdict.AC, 1)


async def test_exceptions_of_the_program_reach_the_test_as_builtin_types(executor: Executor) -> None:
    code = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    test = "try:\n    f(-1)\n    raise AssertionError('no error')\nexcept ValueError as error:\n    assert str(error) == 'negative'\nassert f(2) == 2\n"
    response = await executor.run(_assert_request(code, test))
    assert (response.verdict, response.num_passed) == (Verdict.AC, 1)


async def test_a_call_test_still_compares_on_the_host(executor: Executor) -> None:
    code = "def f(x):\n    return (x, [x])\n"
    tests = [CallTest(args=[2], expected=[2, [2]]), CallTest(args=[2], expected=[2, [3]])]
    request = RunRequest(language=Language.PYTHON, code=code, entry_point="f", tests=tests, limits=LIMITS)
    response = await executor.run(request)
    assert [test.verdict for test in response.tests] == [Verdict.AC, Verdict.WA]


# --- the test sees the program's functions it names, never a builtin or a name of its own ------

# Each task: (test code, a right program, a wrong program that shadows what the test relies on).
# HumanEval style (`check(candidate)` then `check(entry_point)`) and MBPP style (`assert f(...)`).
ROOT_TEST = "def check(candidate):\n    assert abs(candidate(2.0) - 1.41421) < 1e-4\n\ncheck(root)\n"
ROOT = "def root(x):\n    return x ** 0.5\n"
WRONG_ROOT = "def root(x):\n    return 0.0\n"
MATH_TEST = "import math\n\ndef check(candidate):\n    assert math.isclose(candidate(2.0), 1.41421, rel_tol=1e-4)\n\ncheck(root)\n"
FORGED_NAME = (  # the program rewrites the listing its server sends: `__name__` is not main, `check` never runs
    "import sys\n_server = sys._getframe(1).f_globals\n"
    "_server['_names'] = lambda namespace: {'root': 'function', '__name__': {'value': 'x'}, '__builtins__': 'function'}\n"
)
SHADOWING = {
    "abs": (ROOT_TEST, ROOT, WRONG_ROOT + "def abs(x):\n    return 0\n"),
    "range": (
        "def check(candidate):\n    for n in range(1, 5):\n        assert candidate(n) == n * n\n\ncheck(square)\n",
        "def square(n):\n    return n * n\n",
        "def square(n):\n    return n\ndef range(*args):\n    return []\n",
    ),
    "set": (
        "assert set(unique([3, 1, 3])) == set([1, 3])\n",
        "def unique(items):\n    return sorted(set(items))\n",
        "def unique(items):\n    return []\ndef set(*args):\n    return 1\n",
    ),
    "len": (
        "assert len(pad('ab', 5)) == 5\n",
        "def pad(text, width):\n    return text.ljust(width)\n",
        "def pad(text, width):\n    return text\ndef len(value):\n    return 5\n",
    ),
    "sorted": (
        "assert sorted(evens([4, 1, 2, 3])) == [2, 4]\n",
        "def evens(items):\n    return [item for item in items if item % 2 == 0]\n",
        "def evens(items):\n    return items\ndef sorted(items):\n    return [2, 4]\n",
    ),
    "isinstance": (
        "def check(candidate):\n    assert isinstance(candidate(3), float)\n\ncheck(half)\n",
        "def half(n):\n    return n / 2\n",
        "def half(n):\n    return n // 2\ndef isinstance(*args):\n    return True\n",
    ),
    "round": (
        "assert round(area(2), 2) == 12.57\n",
        "import math\ndef area(r):\n    return math.pi * r * r\n",
        "def area(r):\n    return 0\ndef round(*args):\n    return 12.57\n",
    ),
    "math_class": (
        MATH_TEST,
        ROOT,
        WRONG_ROOT
        + "class math:\n    @staticmethod\n    def isclose(*args, **kwargs):\n        return True\n",
    ),
    "math_module": (
        "import math\nassert math.isclose(root(2.0), 1.41421, rel_tol=1e-4)\n",
        ROOT,
        WRONG_ROOT + "import types\nmath = types.SimpleNamespace(isclose=lambda *args, **kwargs: True)\n",
    ),
    "candidate": (ROOT_TEST, ROOT, WRONG_ROOT + "def candidate(x):\n    return 1.41421\n"),
    "check": (ROOT_TEST, ROOT, WRONG_ROOT + "def check(candidate):\n    pass\n"),
    "forged_dunder_listing": (
        "def check(candidate):\n    assert candidate(2.0) == 2.0 ** 0.5\n\nif __name__ == '__main__':\n    check(root)\n",
        ROOT,
        WRONG_ROOT + FORGED_NAME,
    ),
}


@pytest.mark.parametrize("task", SHADOWING.values(), ids=SHADOWING.keys())
async def test_a_wrong_program_that_shadows_what_the_test_uses_fails_and_the_right_one_passes(
    executor: Executor, task: tuple[str, str, str]
) -> None:
    test, right, wrong = task
    response = await executor.run(_assert_request(right, test))
    assert response.verdict == Verdict.AC, response.tests[0].message
    response = await executor.run(_assert_request(wrong, test))
    assert (response.verdict, response.tests[0].message) == (Verdict.WA, "assertion failed")


async def test_a_programs_constants_modules_and_unnamed_functions_never_become_test_globals(
    executor: Executor,
) -> None:
    code = "import math\nLIMIT = 7\ndef helper():\n    return 1\ndef f():\n    return LIMIT + helper()\n"
    test = (
        "assert f() == 8\n"
        "for name in ('LIMIT', 'math', 'helper'):\n"
        "    assert name not in globals(), name\n"
        "try:\n    LIMIT\nexcept NameError:\n    pass\nelse:\n    raise AssertionError('LIMIT is a test global')\n"
    )
    response = await executor.run(_assert_request(code, test))
    assert (response.verdict, response.num_passed) == (Verdict.AC, 1), response.tests[0].message


# --- the seccomp filter ---------------------------------------------------------------------

# Each call would succeed here without the filter (on itself, with valid arguments, needing no
# capability); the program prints the errno each one got (0: it succeeded).
DENIED_CALLS = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(number, *args):
    result = libc.syscall(number, *[ctypes.c_long(arg) for arg in args])
    return ctypes.get_errno() if result < 0 else 0
buffer = ctypes.create_string_buffer(64)
iovec = (ctypes.c_void_p * 2)(ctypes.addressof(buffer), 8)
params = ctypes.create_string_buffer(120)
pidfd = os.pidfd_open(os.getpid())
print(json.dumps({
    "ptrace": call(101, 0, 0, 0, 0),  # PTRACE_TRACEME
    "process_vm_readv": call(310, os.getpid(), ctypes.addressof(iovec), 1, ctypes.addressof(iovec), 1, 0),
    "process_vm_writev": call(311, os.getpid(), ctypes.addressof(iovec), 1, ctypes.addressof(iovec), 1, 0),
    "pidfd_getfd": call(438, pidfd, 1, 0),
    "kcmp": call(312, os.getpid(), os.getpid(), 0, 0, 0),  # KCMP_FILE of fd 0 with itself
    "io_uring_setup": call(425, 1, ctypes.addressof(params)),
    "keyctl": call(250, 0, -2, 1),  # KEYCTL_GET_KEYRING_ID of the process keyring, created
    "userfaultfd": call(323, 1),  # UFFD_USER_MODE_ONLY
    "mount": call(165, 0, 0, 0, 0, 0),
    "fsopen": call(430, 0, 0),
}))
"""


async def test_calls_that_reach_other_processes_or_risky_kernel_interfaces_fail_with_eperm(
    executor: Executor,
) -> None:
    response = await executor.run(RunRequest(language=Language.PYTHON, code=DENIED_CALLS, limits=LIMITS))
    assert response.verdict == Verdict.AC, response.run.stderr
    errnos = json.loads(response.run.stdout)
    assert errnos == dict.fromkeys(errnos, errno.EPERM)


async def test_the_judge_of_an_assert_test_cannot_be_ptraced(executor: Executor) -> None:
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def attach_errors():\n"
        "    pids = [int(pid) for pid in os.listdir('/proc') if pid.isdigit() and int(pid) != os.getpid()]\n"
        "    return sorted({ctypes.get_errno() if libc.ptrace(16, pid, 0, 0) < 0 else 0 for pid in pids})\n"
    )
    response = await executor.run(_assert_request(code, f"assert attach_errors() == [{errno.EPERM}]"))
    assert response.verdict == Verdict.AC, response.tests[0].message
