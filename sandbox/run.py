"""`python -m sandbox.run PROGRAM_FILE`: run one program in the sandbox and print what it did.

python -m sandbox.run solution.py --stdin input.txt --timeout 2 --json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from sandbox.backends.select import BACKEND_NAMES
from sandbox.executor import Executor
from sandbox.languages import language_from_path
from sandbox.types import Language, RunLimits, RunRequest, RunResponse, Verdict


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.run", description="Run one program in the sandbox."
    )
    parser.add_argument("program", type=Path, help="source file (.py, .cpp)")
    parser.add_argument(
        "--language", choices=[language.value for language in Language], help="default: from extension"
    )
    parser.add_argument("--stdin", type=Path, help="file fed to the program's stdin")
    parser.add_argument("--timeout", type=float, default=10.0, help="CPU time limit in seconds (default 10)")
    parser.add_argument("--memory-mb", type=int, default=512, help="memory limit in MB (default 512)")
    parser.add_argument("--backend", choices=BACKEND_NAMES, default="auto")
    parser.add_argument("--json", action="store_true", help="print the RunResponse as JSON")
    return parser


def build_request(args: argparse.Namespace) -> RunRequest:
    if not args.program.is_file():
        raise ValueError(f"program file {str(args.program)!r} does not exist")
    language = Language(args.language) if args.language else language_from_path(args.program.name)
    if args.stdin is not None and not args.stdin.is_file():
        raise ValueError(f"stdin file {str(args.stdin)!r} does not exist")
    stdin = args.stdin.read_text() if args.stdin else ""
    limits = RunLimits(time_s=args.timeout, memory_mb=args.memory_mb)
    return RunRequest(language=language, code=args.program.read_text(), stdin=stdin, limits=limits)


def summary(response: RunResponse) -> str:
    """A few human lines: verdict, timing, then the program's output."""
    lines = [f"verdict: {response.verdict.value}"]
    if response.sandbox_error:
        lines.append(f"sandbox error: {response.sandbox_error}")
    if response.compile is not None and response.compile.verdict != Verdict.AC:
        lines.append(f"compiler output:\n{response.compile.stderr}")
    if response.run is not None:
        run = response.run
        lines.append(f"exit code: {run.exit_code}  wall: {run.wall_time_s:.3f}s  cpu: {run.cpu_time_s:.3f}s")
        if run.message:
            lines.append(f"message: {run.message}")
        lines += [f"--- stdout ---\n{run.stdout}", f"--- stderr ---\n{run.stderr}"]
    return "\n".join(lines)


async def run_program(request: RunRequest, backend: str) -> RunResponse:
    async with await Executor.create(backend, max_concurrency=1) as executor:
        return await executor.run(request)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        request = build_request(args)
    except ValueError as error:
        parser.error(str(error))
    response = asyncio.run(run_program(request, args.backend))
    print(response.model_dump_json(indent=2) if args.json else summary(response))
    return 0 if response.verdict == Verdict.AC else 1


if __name__ == "__main__":
    sys.exit(main())
