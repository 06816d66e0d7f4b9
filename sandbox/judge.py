"""The judge (trusted, on the host): turn a `RunRequest` into jailed runs and the runs into verdicts.

Stage: request -> [compile once] -> run per test -> verdict per test -> `RunResponse`.
Verdicts are decided here from what the backend observed, never from what the program claims.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import signal
from importlib import resources

from sandbox import bounded_json
from sandbox.backends.base import Backend, JailSession, Limits, ProcessResult, SandboxFailure
from sandbox.compare import Comparison, compare_stdout, compare_values
from sandbox.languages import PYTHON_ARGV, LanguageSpec, language_spec
from sandbox.types import (
    AssertTest,
    CallTest,
    RunRequest,
    RunResponse,
    StdioTest,
    Test,
    TestResult,
    Verdict,
)

COMPILE_LIMITS = Limits(
    wall_time_s=60.0, cpu_time_s=30.0, memory_mb=2048, max_output_bytes=64 << 10, max_processes=32,
    max_file_size_mb=256,
)  # fmt: skip
logger = logging.getLogger(__name__)

TEST_TEXT_LIMIT = 8 << 10  # per-test stdout/stderr kept in the response; plain runs keep everything
HARNESS_FILE = "_harness.py"
TEST_FILE = "_test.json"
# In-jail files of call and assert tests (name in the jail: file of this package). The judge
# process (harness) runs the test; the program server runs the program and answers its calls.
JUDGE_FILES = {
    HARNESS_FILE: "harness.py",
    "_program.py": "program_server.py",
    "_plain_data.py": "plain_data.py",
}


def wall_clock_s(time_s: float) -> float:
    """The host's wall clock for a run: the CPU limit plus slack for start-up and a busy machine."""
    return time_s + max(1.0, time_s / 2)


def run_limits(request: RunRequest) -> Limits:
    return Limits(
        wall_time_s=request.limits.wall_time_s or wall_clock_s(request.limits.time_s),
        cpu_time_s=request.limits.time_s,
        memory_mb=request.limits.memory_mb,
        max_output_bytes=request.limits.max_output_bytes,
    )


def process_verdict(result: ProcessResult, spec: LanguageSpec) -> Verdict | None:
    """The verdict a failed process earns, or None when it exited cleanly (judge its output).

    Only what the backend observed from outside decides: its wall clock, CPU accounting,
    memory-kill counter, output caps and file sizes, and the real wait status.
    """
    if result.timed_out or result.signal == signal.SIGXCPU:
        return Verdict.TLE
    if result.memory_exceeded:
        return Verdict.MLE
    if result.output_exceeded or result.signal == signal.SIGXFSZ:
        return Verdict.OLE
    if result.exit_code == 0 and result.signal is None:
        return None
    # Never from what the program printed: "MemoryError" on stderr is text any program can write.
    return Verdict.RE


def overall_verdict(results: list[TestResult]) -> Verdict:
    """AC only if every result is AC; SANDBOX_ERROR if any; else the first non-AC verdict."""
    verdicts = [result.verdict for result in results]
    if Verdict.SANDBOX_ERROR in verdicts:
        return Verdict.SANDBOX_ERROR
    return next((verdict for verdict in verdicts if verdict != Verdict.AC), Verdict.AC)


def decode(data: bytes, limit: int | None = None) -> str:
    text = data.decode("utf-8", errors="replace")
    return text if limit is None or len(text) <= limit else text[:limit] + "\n[... truncated]"


def result_of(
    verdict: Verdict,
    process: ProcessResult,
    message: str = "",
    stdout: bytes | None = None,
    limit: int | None = None,
) -> TestResult:
    return TestResult(
        verdict=verdict,
        stdout=decode(process.stdout if stdout is None else stdout, limit),
        stderr=decode(process.stderr, limit),
        exit_code=process.exit_code,
        wall_time_s=process.wall_time_s,
        cpu_time_s=process.cpu_time_s,
        message=message or _failure_message(process),
    )


def _failure_message(process: ProcessResult) -> str:
    if process.timed_out:
        return "time limit exceeded"
    if process.signal is not None:
        try:
            return f"killed by signal {signal.Signals(process.signal).name}"
        except ValueError:
            return f"killed by signal {process.signal}"
    return ""


def validate_request(request: RunRequest) -> LanguageSpec:
    """Reject requests no language can honour, naming the fix."""
    spec = language_spec(request.language)
    for index, test in enumerate(request.tests):
        if isinstance(test, CallTest | AssertTest) and not spec.supports_harness:
            raise ValueError(
                f"tests[{index}] is a {test.kind!r} test, which {request.language.value} does not support; "
                "use stdio tests for compiled languages"
            )
        if isinstance(test, CallTest) and not request.entry_point:
            raise ValueError(f"tests[{index}] is a 'call' test but entry_point is not set; name the function")
    return spec


class _GuardedSession:
    """A session whose every failure is the sandbox's, raised as SandboxFailure."""

    def __init__(self, session: JailSession) -> None:
        self._session = session

    async def write_files(self, files: dict[str, bytes]) -> None:
        try:
            await self._session.write_files(files)
        except Exception as error:
            raise SandboxFailure(f"writing files failed: {type(error).__name__}: {error}") from error

    async def run(
        self, argv: list[str], stdin: bytes, limits: Limits, judge_process: bool = False
    ) -> ProcessResult:
        try:
            return await self._session.run(argv, stdin, limits, judge_process=judge_process)
        except Exception as error:
            raise SandboxFailure(f"running {argv[0]} failed: {type(error).__name__}: {error}") from error


async def judge(backend: Backend, request: RunRequest) -> RunResponse:
    """Judge one request on `backend`. Raises ValueError for an impossible request, nothing else.

    The session is released in `finally`, whatever happens while judging (a cancelled caller
    included): a leaked session is a jail that no later request can have.
    """
    spec = validate_request(request)
    try:
        session = await backend.open_session()
    except Exception as error:  # noqa: BLE001 - whatever the backend raises is the sandbox's failure
        return _sandbox_error(request, f"opening a session failed: {type(error).__name__}: {error}")
    response = _sandbox_error(request, "judging was interrupted")
    try:
        response = await _judge_in_session(_GuardedSession(session), request, spec)
    except SandboxFailure as error:
        response = _sandbox_error(request, str(error))
    except Exception as error:  # program output is judged per test: anything else is ours
        logger.exception("judging raised")
        response = _sandbox_error(request, f"the judge failed: {type(error).__name__}: {error}")
    finally:
        try:
            await asyncio.shield(session.close())  # a cancelled caller must not cut the release short
        except Exception as error:  # noqa: BLE001 - see above
            if response.verdict != Verdict.SANDBOX_ERROR:  # the verdict stands; the jail is gone anyway
                response.sandbox_error = f"closing the session failed: {type(error).__name__}: {error}"
    return response


def _sandbox_error(request: RunRequest, message: str) -> RunResponse:
    return RunResponse(verdict=Verdict.SANDBOX_ERROR, num_tests=len(request.tests), sandbox_error=message)


async def _judge_in_session(session: _GuardedSession, request: RunRequest, spec: LanguageSpec) -> RunResponse:
    await session.write_files(_initial_files(request, spec))
    compile_result = None
    if spec.compile_argv is not None:
        process = await session.run(list(spec.compile_argv), b"", COMPILE_LIMITS)
        ok = process.exit_code == 0 and not process.timed_out
        compile_result = result_of(
            Verdict.AC if ok else Verdict.CE,
            process,
            "" if ok else "compilation failed",
            limit=TEST_TEXT_LIMIT,
        )
        if not ok:
            return RunResponse(verdict=Verdict.CE, num_tests=len(request.tests), compile=compile_result)
    limits = run_limits(request)
    if not request.tests:
        process = await session.run(list(spec.run_argv), request.stdin.encode(), limits)
        run = result_of(process_verdict(process, spec) or Verdict.AC, process)
        return RunResponse(verdict=run.verdict, compile=compile_result, run=run)
    results = [await _run_test(session, request, spec, test, limits) for test in request.tests]
    return RunResponse(
        verdict=overall_verdict(results),
        num_passed=sum(result.verdict == Verdict.AC for result in results),
        num_tests=len(results),
        compile=compile_result,
        tests=results,
    )


def _initial_files(request: RunRequest, spec: LanguageSpec) -> dict[str, bytes]:
    files = {spec.source_file: request.code.encode()}
    if any(not isinstance(test, StdioTest) for test in request.tests):
        files.update({name: _package_file(source) for name, source in JUDGE_FILES.items()})
    return files


def _package_file(name: str) -> bytes:
    return resources.files("sandbox").joinpath(name).read_bytes()


async def _run_test(
    session: _GuardedSession, request: RunRequest, spec: LanguageSpec, test: Test, limits: Limits
) -> TestResult:
    if isinstance(test, StdioTest):
        process = await session.run(list(spec.run_argv), test.stdin.encode(), limits)
        verdict = process_verdict(process, spec)
        if verdict is not None:
            return result_of(verdict, process, limit=TEST_TEXT_LIMIT)
        comparison = compare_stdout(decode(process.stdout), test.expected_stdout, request.float_tolerance)
        return result_of(
            Verdict.AC if comparison.ok else Verdict.WA, process, comparison.message, limit=TEST_TEXT_LIMIT
        )
    # Every harness run gets fresh copies of every file: an earlier run of the program may have
    # rewritten them (a harness rewritten by the program would read the next run's marker).
    files = _initial_files(request, spec)
    if isinstance(test, CallTest):
        test_spec = {"entry_point": request.entry_point, "args": test.args, "kwargs": test.kwargs}
        mode = "call"
    else:
        test_spec = {"code": test.code}
        mode = "assert"
    files[TEST_FILE] = json.dumps(test_spec).encode()
    await session.write_files(files)
    marker = secrets.token_hex(16)
    argv = [*PYTHON_ARGV, f"/work/{HARNESS_FILE}", mode]
    process = await session.run(argv, marker.encode(), limits, judge_process=True)
    return _judge_harness_run(process, marker.encode(), test, request, spec)


def _judge_harness_run(
    process: ProcessResult,
    marker: bytes,
    test: CallTest | AssertTest,
    request: RunRequest,
    spec: LanguageSpec,
) -> TestResult:
    user_stdout, found, report_line = process.stdout.rpartition(b"\n" + marker + b" ")
    verdict = process_verdict(process, spec)
    if verdict is not None or not found:
        message = "" if verdict is not None else "the test did not run to completion"
        return result_of(verdict or Verdict.RE, process, message, limit=TEST_TEXT_LIMIT)
    try:
        report = bounded_json.loads(report_line.split(b"\n", 1)[0])
        if not isinstance(report, dict):
            raise TypeError(f"a report is a JSON object, got {type(report).__name__}")
        verdict, message = _report_verdict(report, test, request)
    # A call test's value was shaped by the program: whatever the host-side parsing or
    # comparison raises on it is the program's wrong answer, never a crash.
    except bounded_json.JsonTooLarge as error:
        verdict, message = Verdict.WA, f"return value rejected: {error}"
    except SandboxFailure:
        raise
    except Exception as error:  # noqa: BLE001
        verdict, message = (
            Verdict.RE,
            f"the harness report is unreadable: {type(error).__name__}: {error}"[:500],
        )
    return result_of(verdict, process, message, user_stdout, TEST_TEXT_LIMIT)


def _report_verdict(report: dict, test: CallTest | AssertTest, request: RunRequest) -> tuple[Verdict, str]:
    status, message = report.get("status"), str(report.get("message", ""))
    if status == "unprotected":  # printed before the program started: it cannot have forged it
        raise SandboxFailure("the backend started the judge process where the program could signal it")
    if status == "ok" and isinstance(test, AssertTest):
        return Verdict.AC, ""
    if status == "ok":
        comparison = _compare_call(report.get("value"), test, request.float_tolerance)
        return (Verdict.AC if comparison.ok else Verdict.WA), comparison.message
    if status == "assertion_failed":
        return Verdict.WA, f"assertion failed: {message}" if message else "assertion failed"
    if status == "unserialisable":
        return Verdict.WA, f"return value is not JSON-serialisable: {message}"
    if status == "not_plain":  # an object of its own could compare equal to anything
        return Verdict.WA, f"return value is not plain data: {message}"
    if status == "error":
        return Verdict.RE, f"{report.get('exception', '')}: {message}"
    if status == "exited":
        return Verdict.RE, message
    return Verdict.RE, "the program ended before the test completed"


def _compare_call(value_json: object, test: CallTest, float_tolerance: float | None) -> Comparison:
    if not isinstance(value_json, str):
        return Comparison(False, "no return value reported")
    try:
        actual = bounded_json.loads(value_json)
    except bounded_json.JsonTooLarge as error:
        return Comparison(False, f"return value rejected: {error}")
    except ValueError:
        return Comparison(False, "return value is not valid JSON")
    expected = json.loads(json.dumps(test.expected))  # tuples become lists, as they do in the jail
    return compare_values(actual, expected, float_tolerance)
