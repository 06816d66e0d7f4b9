"""SandboxFusion compatibility: its `/run_code` request and response, translated to and from ours.

Clients written for SandboxFusion (`POST /run_code`) work against this server by changing the URL.
The field names, defaults and status values below follow SandboxFusion's published API:

- request: `code`, `language`, `compile_timeout`, `run_timeout`, `memory_limit_MB` (-1: no limit),
  `stdin`, `files` (path -> base64 content), `fetch_files` (paths to return after the run);
- response: `status` (Success | Failed | SandboxError), `message`, `compile_result` and `run_result`
  (each `status` Finished | Error | TimeLimitExceeded, `execution_time`, `return_code`, `stdout`,
  `stderr`), `executor_pod_name`, `files`;
- a request it cannot accept answers HTTP 422 with `{"detail": [{"loc", "msg", "type"}]}`.

`run_timeout` is, as in SandboxFusion, the program's wall clock; it is also its CPU time limit. A
`run_timeout` or `memory_limit_MB` above the server's maximum is a 422 naming the field, the value
and the maximum; `memory_limit_MB` -1 (no limit) is the server's maximum memory, at most 4 GiB.

Differences, by design: only the languages in `sandbox.types.Language` run (others are a 422 naming
`language`); extra input files and fetched output files are not supported yet (a non-empty `files`
or `fetch_files` is a 422 naming the field); the compiler runs under the judge's own compile limits,
so `compile_timeout` is validated but not applied.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from sandbox.types import (
    MAX_MEMORY_MB,
    MIN_MEMORY_MB,
    Language,
    RunLimits,
    RunRequest,
    RunResponse,
    TestResult,
    Verdict,
)

# SandboxFusion's -1 means "no memory limit"; a jail always has one, so it gets this generous cap,
# the same as the per-run cgroup cap of SandboxFusion's own lightweight isolation (4 GiB).
NO_LIMIT_MEMORY_MB = 4096


class RunCodeRequest(BaseModel):
    """SandboxFusion's `/run_code` request body. Unknown keys are ignored, as SandboxFusion does."""

    code: str
    language: Language
    compile_timeout: float = Field(default=10.0, gt=0)
    run_timeout: float = Field(default=10.0, gt=0, le=600)
    memory_limit_MB: int = -1
    stdin: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)

    @field_validator("files")
    @classmethod
    def _no_input_files(cls, files: dict[str, str | None]) -> dict[str, str | None]:
        if any(content is not None for content in files.values()):
            raise ValueError(
                f"input files are not supported by this sandbox (got {sorted(files)}); "
                "inline the data in `code` or `stdin`, or send files: {}"
            )
        return files

    @field_validator("fetch_files")
    @classmethod
    def _no_fetch_files(cls, fetch_files: list[str]) -> list[str]:
        if fetch_files:
            raise ValueError(
                f"fetching files after the run is not supported by this sandbox (got {fetch_files}); "
                "print the content to stdout instead, or send fetch_files: []"
            )
        return fetch_files

    @field_validator("memory_limit_MB")
    @classmethod
    def _memory_is_positive_or_unlimited(cls, memory_mb: int) -> int:
        if memory_mb != -1 and not MIN_MEMORY_MB <= memory_mb <= MAX_MEMORY_MB:
            raise ValueError(
                f"memory_limit_MB must be -1 (no limit) or from {MIN_MEMORY_MB} to {MAX_MEMORY_MB}, got {memory_mb}"
            )
        return memory_mb


class RunStatus(str, Enum):
    """SandboxFusion's overall status of a `/run_code` call."""

    SUCCESS = "Success"  # compiled (if compiled) and ran to exit code 0 within the time limit
    FAILED = "Failed"  # the program failed: compile error, non-zero exit, time limit, ...
    SANDBOX_ERROR = "SandboxError"  # the sandbox failed; the program's outcome is unknown


class CommandRunStatus(str, Enum):
    """SandboxFusion's status of one command (the compiler or the program)."""

    FINISHED = "Finished"
    ERROR = "Error"
    TIME_LIMIT_EXCEEDED = "TimeLimitExceeded"


class CommandRunResult(BaseModel):
    """One command's result in SandboxFusion's shape."""

    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    """SandboxFusion's `/run_code` response body."""

    status: RunStatus
    message: str
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


# Our limit fields, by the SandboxFusion request field that sets them.
FIELD_OF_LIMIT = {"time_s": "run_timeout", "wall_time_s": "run_timeout", "memory_mb": "memory_limit_MB"}


def to_run_request(request: RunCodeRequest, no_limit_memory_mb: int = NO_LIMIT_MEMORY_MB) -> RunRequest:
    """A plain run (no tests) of the SandboxFusion request's program; `memory_limit_MB` -1 becomes
    `no_limit_memory_mb`."""
    memory_mb = no_limit_memory_mb if request.memory_limit_MB == -1 else request.memory_limit_MB
    return RunRequest(
        language=request.language,
        code=request.code,
        stdin=request.stdin or "",
        limits=RunLimits(time_s=request.run_timeout, wall_time_s=request.run_timeout, memory_mb=memory_mb),
    )


def limit_error_body(messages: dict[str, str]) -> dict[str, Any]:
    """Fields over the server's maximums (field -> message), as SandboxFusion answers HTTP 422."""
    return {
        "detail": [
            {"loc": ["body", field], "msg": message, "type": "value_error"}
            for field, message in messages.items()
        ]
    }


def _command_result(result: TestResult) -> CommandRunResult:
    if result.verdict == Verdict.SANDBOX_ERROR:
        return CommandRunResult(status=CommandRunStatus.ERROR, stderr=result.message or result.stderr)
    # SandboxFusion reports a timed-out command without a return code.
    timed_out = result.verdict == Verdict.TLE
    return CommandRunResult(
        status=CommandRunStatus.TIME_LIMIT_EXCEEDED if timed_out else CommandRunStatus.FINISHED,
        execution_time=result.wall_time_s,
        return_code=None if timed_out else _return_code(result),
        stdout=result.stdout,
        stderr=result.stderr,
    )


def _return_code(result: TestResult) -> int:
    if result.exit_code is not None:
        return result.exit_code
    # Killed by a signal (memory kill, crash): SandboxFusion clients only need "non-zero"; -9 is
    # what its own runner reports for a killed process.
    return -9


def from_run_response(response: RunResponse) -> RunCodeResponse:
    """Our judged plain run, in SandboxFusion's shape."""
    compile_result = _command_result(response.compile) if response.compile is not None else None
    run_result = _command_result(response.run) if response.run is not None else None
    if response.verdict == Verdict.SANDBOX_ERROR:
        status, message = RunStatus.SANDBOX_ERROR, response.sandbox_error or "sandbox error"
    elif response.verdict == Verdict.AC:
        status, message = RunStatus.SUCCESS, ""
    else:
        status, message = RunStatus.FAILED, _failure_message(response)
    return RunCodeResponse(
        status=status, message=message, compile_result=compile_result, run_result=run_result
    )


def _failure_message(response: RunResponse) -> str:
    # SandboxFusion leaves `message` empty on Failed; a short reason costs its clients nothing and
    # tells a human why an exit-code-0 run failed (e.g. output limit exceeded).
    failed = [r for r in (response.compile, response.run) if r is not None and r.verdict != Verdict.AC]
    detail = failed[0].message if failed else ""
    return f"{response.verdict.value}: {detail}" if detail else response.verdict.value


def validation_error_body(error: ValidationError) -> dict[str, Any]:
    """A pydantic error in the shape SandboxFusion (FastAPI) answers with HTTP 422."""
    detail = [
        {"loc": ["body", *error_item["loc"]], "msg": error_item["msg"], "type": error_item["type"]}
        for error_item in error.errors(include_url=False)
    ]
    return {"detail": detail}
