"""The judge's verdict mapping and harness-report checks, on hand-made process results; the names an assert test gets."""

from __future__ import annotations

import gzip
import json
import signal
from pathlib import Path

import pytest

from sandbox.backends.base import Limits, ProcessResult, SandboxFailure
from sandbox.executor import Executor
from sandbox.harness import names_from_the_program
from sandbox.judge import _judge_harness_run, overall_verdict, process_verdict, validate_request
from sandbox.languages import LANGUAGES
from sandbox.types import AssertTest, CallTest, Language, RunRequest, StdioTest, TestResult, Verdict

PYTHON = LANGUAGES[Language.PYTHON]
CPP = LANGUAGES[Language.CPP]
MARKER = b"0123456789abcdef0123456789abcdef"


def _process(**fields) -> ProcessResult:
    base = {
        "exit_code": 0, "signal": None, "stdout": b"", "stderr": b"", "wall_time_s": 0.1, "cpu_time_s": 0.1,
        "timed_out": False, "memory_exceeded": False, "output_exceeded": False,
    }  # fmt: skip
    return ProcessResult(**(base | fields))


@pytest.mark.parametrize(
    ("fields", "verdict"),
    [
        ({}, None),
        ({"timed_out": True, "exit_code": None, "signal": 9}, Verdict.TLE),
        ({"exit_code": None, "signal": signal.SIGXCPU}, Verdict.TLE),
        ({"memory_exceeded": True, "exit_code": None, "signal": 9}, Verdict.MLE),
        ({"output_exceeded": True, "exit_code": None, "signal": 9}, Verdict.OLE),
        ({"exit_code": None, "signal": signal.SIGXFSZ}, Verdict.OLE),
        ({"exit_code": 1}, Verdict.RE),
        ({"exit_code": None, "signal": signal.SIGSEGV}, Verdict.RE),
        # What the program prints never decides: these are runtime errors like any other.
        ({"exit_code": 1, "stderr": b"Traceback ...\nMemoryError\n"}, Verdict.RE),
        ({"exit_code": 1, "stderr": b"OSError: [Errno 27] File too large\n"}, Verdict.RE),
        ({"exit_code": 1, "stderr": b"OSError: [Errno 28] No space left on device\n"}, Verdict.RE),
        ({"timed_out": True, "memory_exceeded": True}, Verdict.TLE),  # the clock ran out first
    ],
)
def test_process_results_map_to_verdicts(fields: dict, verdict: Verdict | None) -> None:
    assert process_verdict(_process(**fields), PYTHON) == verdict


def test_bad_alloc_text_is_a_runtime_error_in_every_language() -> None:
    crashed = _process(exit_code=None, signal=signal.SIGABRT, stderr=b"what():  std::bad_alloc\n")
    assert (process_verdict(crashed, CPP), process_verdict(crashed, PYTHON)) == (Verdict.RE, Verdict.RE)


def _result(verdict: Verdict) -> TestResult:
    return TestResult(verdict=verdict)


def test_overall_verdict_is_ac_only_when_all_tests_are_ac() -> None:
    assert overall_verdict([_result(Verdict.AC), _result(Verdict.AC)]) == Verdict.AC
    assert overall_verdict([_result(Verdict.AC), _result(Verdict.TLE), _result(Verdict.WA)]) == Verdict.TLE
    assert overall_verdict([_result(Verdict.WA), _result(Verdict.SANDBOX_ERROR)]) == Verdict.SANDBOX_ERROR


def test_requests_no_language_can_judge_are_rejected_naming_the_fix() -> None:
    with pytest.raises(ValueError, match=r"tests\[0\] is a 'call' test.*entry_point"):
        validate_request(RunRequest(language=Language.PYTHON, code="", tests=[CallTest(expected=1)]))
    with pytest.raises(ValueError, match=r"tests\[1\] is a 'assert' test, which cpp does not support"):
        tests = [StdioTest(expected_stdout=""), AssertTest(code="assert True")]
        validate_request(RunRequest(language=Language.CPP, code="", tests=tests))


def _harness_run(stdout: bytes, test, request: RunRequest | None = None) -> TestResult:
    request = request or RunRequest(language=Language.PYTHON, code="", entry_point="f", tests=[test])
    return _judge_harness_run(_process(stdout=stdout), MARKER, test, request, PYTHON)


def _report(**report) -> bytes:
    return b"\n" + MARKER + b" " + json.dumps(report).encode() + b"\n"


def test_a_call_result_is_compared_on_the_host_and_user_output_is_kept_without_the_marker() -> None:
    test = CallTest(args=[1], expected=[1, 2])
    accepted = _harness_run(b"debug\n" + _report(status="ok", value="[1, 2]"), test)
    assert (accepted.verdict, accepted.stdout) == (Verdict.AC, "debug\n")
    wrong = _harness_run(_report(status="ok", value="[2, 1]"), test)
    assert (wrong.verdict, wrong.message) == (Verdict.WA, "$[0]: expected 1, got 2")


def test_output_without_the_runs_marker_never_passes() -> None:
    forged = b"\n" + b"f" * 32 + b' {"status": "ok"}\n'
    result = _harness_run(forged, AssertTest(code="assert False"))
    assert (result.verdict, result.message) == (Verdict.RE, "the test did not run to completion")


@pytest.mark.parametrize(
    ("report", "verdict", "message"),
    [
        ({"status": "assertion_failed", "message": ""}, Verdict.WA, "assertion failed"),
        ({"status": "exited", "message": "exit(0) before the test completed"}, Verdict.RE, "exit(0) before the test completed"),
        ({"status": "error", "exception": "MemoryError", "message": ""}, Verdict.RE, "MemoryError: "),
        ({"status": "error", "exception": "ZeroDivisionError", "message": "division by zero"}, Verdict.RE, "ZeroDivisionError: division by zero"),
        ({"status": "no_report"}, Verdict.RE, "the program ended before the test completed"),
    ],
)  # fmt: skip
def test_harness_reports_map_to_verdicts(report: dict, verdict: Verdict, message: str) -> None:
    result = _harness_run(_report(**report), AssertTest(code="assert True"))
    assert (result.verdict, result.message) == (verdict, message)


@pytest.mark.parametrize(
    ("test_code", "names"),
    [
        # HumanEval: the entry point; `check` and `candidate` are the test's own, builtins are never the program's.
        ("def check(candidate):\n    assert abs(candidate(1)) == len(range(2))\n\ncheck(f)\n", {"f"}),
        # The test's imports and assignments are its own; a helper it calls but never defines is the program's.
        (
            (
                "import math\nfrom x import y as z\nMETADATA = {}\n\ndef check(candidate):\n    import random\n"
                "    assert math.isclose(candidate(z), poly(METADATA))\n\ncheck(find_zero)\n"
            ),
            {"find_zero", "poly"},
        ),
        # MBPP: every function the asserts call, in comprehensions too.
        ("assert set(g(1)) == {1} and [h(i) for i in range(2)]\n", {"g", "h"}),
        # Class bodies read globals; `global G; G = ...` binds G; dunders never come from the program.
        (
            (
                "class T:\n    y = helper()\n\ndef f():\n    global G\n    G = 1\n    return G\n\n"
                "if __name__ == '__main__':\n    f()\n"
            ),
            {"helper"},
        ),
    ],
    ids=["humaneval", "imports_and_helpers", "mbpp", "scopes"],
)
def test_the_test_code_gets_only_the_functions_it_reads_and_does_not_define(
    test_code: str, names: set
) -> None:
    assert names_from_the_program(test_code) == names


def test_each_humaneval_test_gets_its_entry_point_and_only_the_prompt_helpers_it_calls() -> None:
    with gzip.open(Path(__file__).parent / "data" / "HumanEval.jsonl.gz", "rt", encoding="utf-8") as data:
        problems = [json.loads(line) for line in data]
    helpers = {"HumanEval/32": {"poly"}, "HumanEval/38": {"encode_cyclic"}, "HumanEval/50": {"encode_shift"}}
    unexpected = [
        problem["task_id"]
        for problem in problems
        if names_from_the_program(f"{problem['test']}\n\ncheck({problem['entry_point']})\n")
        != {problem["entry_point"], *helpers.get(problem["task_id"], ())}
    ]
    assert (len(problems), unexpected) == (164, [])


class _BrokenBackend:
    """A backend whose jail fails: the judge must call that the sandbox's error, not the program's."""

    name = "broken"

    def __init__(self, fail_on: str) -> None:
        self.fail_on = fail_on

    async def open_session(self):
        if self.fail_on == "open":
            raise SandboxFailure("no jail available")
        return self

    async def write_files(self, files: dict[str, bytes]) -> None:
        pass

    async def run(
        self, argv: list[str], stdin: bytes, limits: Limits, judge_process: bool = False
    ) -> ProcessResult:
        raise RuntimeError("container vanished")

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("fail_on", "message"),
    [("open", "opening a session failed: SandboxFailure: no jail available"),
     ("run", "running python3 failed: RuntimeError: container vanished")],
)  # fmt: skip
async def test_backend_failures_become_sandbox_errors(fail_on: str, message: str) -> None:
    request = RunRequest(language=Language.PYTHON, code="print(1)", tests=[StdioTest(expected_stdout="1")])
    async with Executor(_BrokenBackend(fail_on), max_concurrency=1) as executor:
        response = await executor.run(request)
    assert (response.verdict, response.sandbox_error, response.num_tests) == (
        Verdict.SANDBOX_ERROR,
        message,
        1,
    )


def test_max_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="got 0"):
        Executor(_BrokenBackend("open"), max_concurrency=0)
