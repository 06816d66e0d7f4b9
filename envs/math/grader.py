"""Reward stage of the math env: answer equivalence by math_verify in a child process.

math_verify bounds its own work with `signal.alarm`, which only works in a process's main
thread, while envs are stepped from worker threads and event loops. Some answers also make
sympy run for minutes (`9^{9^{9}}`) while holding the GIL, which would freeze every
rollout of the process. So grading runs in a child process whose main thread can use
math_verify's timeouts, and the parent kills the child when even those do not fire.

Its `serve()` function is that child: it reads one JSON request
per line on stdin and writes one JSON verdict per line on stdout.
"""

from __future__ import annotations

import atexit
import enum
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

READY_LINE = "ready"
STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core machine can take a while
CHILD_OPERATION_TIMEOUT_S = 3  # math_verify's own per-parse / per-comparison limit (whole seconds)


class Verdict(str, enum.Enum):
    """Outcome of grading one answer against the ground truth."""

    CORRECT = "correct"
    INCORRECT = "incorrect"
    TIMED_OUT = "timed_out"  # the answer could not be compared within the time limit


def as_latex_math(text: str) -> str:
    """Wrap bare LaTeX in `$...$` so math_verify's LaTeX extraction sees it."""
    return text if "$" in text or "\\boxed" in text else f"${text}$"


def verify_in_this_process(answer: str, ground_truth: str, operation_timeout_s: int | None) -> bool:
    """math_verify equivalence; `operation_timeout_s` must be None outside a main thread."""
    from math_verify import parse, verify

    gold = parse(as_latex_math(ground_truth), parsing_timeout=operation_timeout_s)
    predicted = parse(as_latex_math(answer), parsing_timeout=operation_timeout_s)
    return bool(gold and predicted and verify(gold, predicted, timeout_seconds=operation_timeout_s))


class AnswerGrader:
    """Grades answers in a child process; thread-safe; one request in flight at a time."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"grading timeout_s must be > 0 seconds, got {timeout_s}")
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def grade(self, answer: str, ground_truth: str) -> Verdict:
        """Whether `answer` is mathematically equivalent to `ground_truth`."""
        request = json.dumps({"answer": answer, "ground_truth": ground_truth}) + "\n"
        with self._lock:
            process = self._running_process()
            process.stdin.write(request)
            process.stdin.flush()
            line = self._read_line(process, self.timeout_s)
            if line is None:
                self._stop()  # the child may be stuck in C code; only a kill frees it
                return Verdict.TIMED_OUT
        return Verdict.CORRECT if json.loads(line)["correct"] else Verdict.INCORRECT

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _running_process(self) -> subprocess.Popen[str]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        repository_root = str(Path(__file__).resolve().parents[2])
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [repository_root, environment.get("PYTHONPATH")])
        )
        environment["OMP_NUM_THREADS"] = "1"
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from envs.math.grader import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
        )
        if self._read_line(self._process, STARTUP_TIMEOUT_S) != READY_LINE:
            self._stop()
            raise RuntimeError("the math grader process failed to start; see its stderr above")
        return self._process

    def _read_line(self, process: subprocess.Popen[str], timeout_s: float) -> str | None:
        """The child's next line, None on timeout; raises if the child died."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([process.stdout], [], [], remaining)
            if readable:
                break
        line = process.stdout.readline()
        if not line:
            code = process.wait()
            self._process = None
            raise RuntimeError(f"the math grader process exited with code {code}; see its stderr above")
        return line.rstrip("\n")

    def _stop(self) -> None:
        if self._process is None:
            return
        self._process.kill()
        self._process.wait()
        for stream in (self._process.stdin, self._process.stdout):
            stream.close()
        self._process = None


_shared_grader: AnswerGrader | None = None
_shared_lock = threading.Lock()


def shared_grader() -> AnswerGrader:
    """The process-wide grader every MathEnv uses unless given its own."""
    global _shared_grader
    with _shared_lock:
        if _shared_grader is None:
            _shared_grader = AnswerGrader()
            atexit.register(_shared_grader.close)
        return _shared_grader


def serve() -> None:
    """Child side: answer grading requests until stdin closes."""
    import math_verify  # noqa: F401  # import before announcing readiness so requests are fast

    print(READY_LINE, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        correct = verify_in_this_process(
            request["answer"], request["ground_truth"], CHILD_OPERATION_TIMEOUT_S
        )
        print(json.dumps({"correct": correct}), flush=True)
