"""Translation between SandboxFusion's /run_code schema and ours (no server, no jail)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sandbox.sandboxfusion import (
    NO_LIMIT_MEMORY_MB,
    CommandRunStatus,
    RunCodeRequest,
    RunStatus,
    from_run_response,
    to_run_request,
    validation_error_body,
)
from sandbox.types import Language, RunResponse, TestResult, Verdict


def test_a_sandboxfusion_request_becomes_a_plain_run_with_its_timeout_memory_and_stdin() -> None:
    request = RunCodeRequest.model_validate(
        {
            "code": "print(input())",
            "language": "python",
            "run_timeout": 3,
            "memory_limit_MB": 256,
            "stdin": "hi",
        }
    )
    run = to_run_request(request)
    assert run.language == Language.PYTHON
    assert run.code == "print(input())"
    assert run.stdin == "hi"
    assert run.tests == []
    # run_timeout is SandboxFusion's wall clock: a program that sleeps past it is timed out.
    assert (run.limits.time_s, run.limits.wall_time_s, run.limits.memory_mb) == (3.0, 3.0, 256)


def test_memory_limit_minus_one_means_the_generous_cap_and_missing_stdin_means_empty() -> None:
    run = to_run_request(RunCodeRequest.model_validate({"code": "", "language": "cpp"}))
    assert run.limits.memory_mb == NO_LIMIT_MEMORY_MB
    assert run.stdin == ""


def test_unknown_keys_and_empty_files_are_accepted_as_sandboxfusion_does() -> None:
    request = RunCodeRequest.model_validate(
        {"code": "", "language": "python", "files": {}, "fetch_files": [], "extra": 1}
    )
    assert request.files == {}


def test_an_unsupported_language_is_a_422_body_naming_the_language_field() -> None:
    with pytest.raises(ValidationError) as caught:
        RunCodeRequest.model_validate({"code": "", "language": "cobol"})
    detail = validation_error_body(caught.value)["detail"]
    assert [item["loc"] for item in detail] == [["body", "language"]]


@pytest.mark.parametrize("field,value", [("files", {"data.txt": "aGk="}), ("fetch_files", ["out.txt"])])
def test_input_and_fetched_files_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        RunCodeRequest.model_validate({"code": "", "language": "python", field: value})
    assert [item["loc"] for item in validation_error_body(caught.value)["detail"]] == [["body", field]]


def _result(verdict: Verdict, exit_code: int | None, stdout: str = "", message: str = "") -> TestResult:
    return TestResult(verdict=verdict, stdout=stdout, exit_code=exit_code, wall_time_s=0.25, message=message)


def test_an_accepted_plain_run_is_success_with_a_finished_run_result() -> None:
    answer = from_run_response(RunResponse(verdict=Verdict.AC, run=_result(Verdict.AC, 0, stdout="3\n")))
    assert answer.status == RunStatus.SUCCESS
    assert answer.message == ""
    assert answer.compile_result is None
    assert answer.run_result is not None
    assert answer.run_result.model_dump() == {
        "status": CommandRunStatus.FINISHED,
        "execution_time": 0.25,
        "return_code": 0,
        "stdout": "3\n",
        "stderr": "",
    }


def test_a_timed_out_run_is_failed_with_time_limit_exceeded_and_no_return_code() -> None:
    answer = from_run_response(RunResponse(verdict=Verdict.TLE, run=_result(Verdict.TLE, None)))
    assert answer.status == RunStatus.FAILED
    assert answer.run_result is not None
    assert answer.run_result.status == CommandRunStatus.TIME_LIMIT_EXCEEDED
    assert answer.run_result.return_code is None


def test_a_process_killed_by_a_signal_reports_a_non_zero_return_code() -> None:
    answer = from_run_response(
        RunResponse(verdict=Verdict.MLE, run=_result(Verdict.MLE, None, message="oom"))
    )
    assert answer.status == RunStatus.FAILED
    assert answer.message == "MLE: oom"
    assert answer.run_result is not None
    assert answer.run_result.return_code == -9


def test_a_compile_error_is_failed_with_the_compiler_result_and_no_run_result() -> None:
    answer = from_run_response(RunResponse(verdict=Verdict.CE, compile=_result(Verdict.CE, 1)))
    assert answer.status == RunStatus.FAILED
    assert answer.run_result is None
    assert answer.compile_result is not None
    assert (answer.compile_result.status, answer.compile_result.return_code) == (CommandRunStatus.FINISHED, 1)


def test_a_sandbox_error_is_sandboxerror_with_the_reason_as_message() -> None:
    answer = from_run_response(RunResponse(verdict=Verdict.SANDBOX_ERROR, sandbox_error="jail failed"))
    assert answer.status == RunStatus.SANDBOX_ERROR
    assert answer.message == "jail failed"
    assert answer.run_result is None
