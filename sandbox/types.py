"""Request and response types of the sandbox: what a caller asks to run and what it gets back.

These are the values that cross every boundary of the sandbox (Python API, HTTP server, CLIs).
The judge turns a `RunRequest` into jailed process runs and the runs into a `RunResponse`.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Language(str, Enum):
    """A language the sandbox can compile and run (details in sandbox.languages)."""

    PYTHON = "python"
    CPP = "cpp"


class Verdict(str, Enum):
    """The outcome of one test (or of a whole request)."""

    AC = "AC"  # accepted
    WA = "WA"  # wrong answer
    TLE = "TLE"  # time limit exceeded (wall clock or CPU)
    MLE = "MLE"  # memory limit exceeded
    OLE = "OLE"  # output limit exceeded
    RE = "RE"  # runtime error: non-zero exit, signal, uncaught exception
    CE = "CE"  # compile error
    SANDBOX_ERROR = "SANDBOX_ERROR"  # the sandbox failed, not the program


MIN_MEMORY_MB, MAX_MEMORY_MB = 16, 65536


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StdioTest(_Strict):
    """Feed `stdin` to the program; its stdout must match `expected_stdout`."""

    kind: Literal["stdio"] = "stdio"
    stdin: str = ""
    expected_stdout: str


class CallTest(_Strict):
    """Call the request's `entry_point(*args, **kwargs)`; the JSON of its return must equal `expected`."""

    kind: Literal["call"] = "call"
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    expected: Any


class AssertTest(_Strict):
    """HumanEval style: `code` is appended to the program and must run to completion."""

    kind: Literal["assert"] = "assert"
    code: str


Test = Annotated[StdioTest | CallTest | AssertTest, Field(discriminator="kind")]


class RunLimits(_Strict):
    """Per-process limits of one program run (the compiler gets its own, larger ones)."""

    time_s: float = Field(default=10.0, gt=0, le=600)
    memory_mb: int = Field(default=512, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)
    max_output_bytes: int = Field(default=1 << 20, ge=1, le=1 << 30)
    # The host's wall clock per process run; None: time_s plus slack for start-up (judge.wall_clock_s).
    wall_time_s: float | None = Field(default=None, gt=0, le=900)


class RunRequest(_Strict):
    """Run `code` once per test (or once, as a plain run, when `tests` is empty)."""

    language: Language
    code: str
    tests: list[Test] = Field(default_factory=list)
    stdin: str = ""  # the plain run's stdin; tests carry their own
    entry_point: str | None = None  # function name for CallTests
    limits: RunLimits = Field(default_factory=RunLimits)
    float_tolerance: float | None = Field(default=None, ge=0)


class TestResult(_Strict):
    """What one process run did, judged. stdout/stderr are decoded with errors="replace" and truncated."""

    __test__ = False  # not a pytest test class despite the name

    verdict: Verdict
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    message: str = ""


class RunResponse(_Strict):
    """The judged request: AC only if every test is AC; otherwise the first non-AC verdict.

    SANDBOX_ERROR wins over every program verdict: the run says nothing about the program.
    """

    verdict: Verdict
    num_passed: int = 0
    num_tests: int = 0
    compile: TestResult | None = None
    tests: list[TestResult] = Field(default_factory=list)
    run: TestResult | None = None  # the plain run's result (no tests)
    sandbox_error: str | None = None
