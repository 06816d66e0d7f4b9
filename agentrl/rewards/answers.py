"""Reward stage: the final `\\boxed{...}` answer of a reply, and its math equivalence with the truth.

Every math grade goes through `AnswerGrader`: the math env, the tool_calling env and the
`math_accuracy` reward function, so an answer gets the same verdict wherever it is graded.

math_verify bounds its own work with `signal.alarm`, which only works in a process's main
thread, while envs are stepped from worker threads and event loops. Some answers also make
sympy run for minutes (`9^{9^{9}}`) while holding the GIL, which would freeze every rollout of
the process, or the trainer. So grading runs in a pebble process pool: each worker's main
thread can use math_verify's timeouts, answers are graded in parallel, and a worker that
overruns the grader's own limit is killed and replaced by the pool.
"""

from __future__ import annotations

import atexit
import enum
import multiprocessing
import os
import re
import threading
from concurrent.futures import TimeoutError as FutureTimeout

from pebble import ProcessPool

_BOXED = re.compile(r"\\boxed\s*\{")
WORKER_OPERATION_TIMEOUT_S = 3  # math_verify's own per-parse / per-comparison limit (whole seconds)


def extract_boxed_answer(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (nested braces allowed), or None if absent, unclosed or empty."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    depth = 1
    index = start
    while index < len(text):
        character = text[index]
        if character == "\\" and text[index + 1 : index + 2] in ("{", "}"):
            index += 2  # an escaped brace (set notation) does not open or close a group
            continue
        depth += {"{": 1, "}": -1}.get(character, 0)
        if depth == 0:
            return text[start:index].strip() or None
        index += 1
    return None  # the last \boxed never closes, e.g. a reply cut off by the token budget


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


def _verify_in_worker(answer: str, ground_truth: str) -> bool:
    return verify_in_this_process(answer, ground_truth, WORKER_OPERATION_TIMEOUT_S)


def _warm_worker() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import math_verify  # noqa: F401  # import once per worker, so the first grade is fast


class AnswerGrader:
    """Grades answers in worker processes; thread-safe; up to `max_workers` grades run at once."""

    def __init__(self, timeout_s: float = 10.0, max_workers: int = 2) -> None:
        if not timeout_s > 0:
            raise ValueError(f"grading timeout_s must be > 0 seconds, got {timeout_s}")
        if max_workers < 1:
            raise ValueError(f"grading max_workers must be >= 1, got {max_workers}")
        self.timeout_s, self.max_workers = timeout_s, max_workers
        self._pool: ProcessPool | None = None
        self._lock = threading.Lock()

    def grade(self, answer: str, ground_truth: str) -> Verdict:
        """Whether `answer` is mathematically equivalent to `ground_truth`."""
        future = self._running_pool().schedule(
            _verify_in_worker, args=(answer, ground_truth), timeout=self.timeout_s
        )
        try:
            return Verdict.CORRECT if future.result() else Verdict.INCORRECT
        except FutureTimeout:  # the pool killed the stuck worker and starts a fresh one
            return Verdict.TIMED_OUT

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.stop()
                self._pool.join()
                self._pool = None

    def _running_pool(self) -> ProcessPool:
        with self._lock:
            if self._pool is None:
                # spawn: forking a process that holds torch's threads and CUDA state is unsafe.
                self._pool = ProcessPool(
                    max_workers=self.max_workers,
                    initializer=_warm_worker,
                    context=multiprocessing.get_context("spawn"),
                )
            return self._pool


_shared_grader: AnswerGrader | None = None
_shared_lock = threading.Lock()


def shared_grader() -> AnswerGrader:
    """The process-wide grader of every env and reward function not given its own."""
    global _shared_grader
    with _shared_lock:
        if _shared_grader is None:
            _shared_grader = AnswerGrader()
            atexit.register(_shared_grader.close)
        return _shared_grader
