"""Benchmark: how long 32 sandbox sessions take to be ready, by start concurrency.

    python benchmarks/sandbox_sessions.py [--backend docker|bwrap|both] [--sessions 32] [--starting 1 2 4]

A pool of `--sessions` warm sessions is created and timed until every one is ready (and then
until one command has run in each); the baseline is one start at a time (`max_starting=1`),
measured in the same run, and every other setting is printed as a ratio against it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from sandbox.sessions import SessionPool, SessionPoolSettings


async def time_to_ready(backend: str, num_sessions: int, max_starting: int) -> tuple[float, float]:
    settings = SessionPoolSettings(
        backend=backend, num_warm=num_sessions, max_sessions=num_sessions, max_starting=max_starting
    )
    started = time.monotonic()
    async with await SessionPool.create(settings) as pool:
        await pool.wait_ready(num_sessions)
        ready_s = time.monotonic() - started
        sessions = [await pool.acquire() for _ in range(num_sessions)]
        await asyncio.gather(*(session.exec("true") for session in sessions))
        first_command_s = time.monotonic() - started
        await asyncio.gather(*(session.close() for session in sessions))
    return ready_s, first_command_s


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="both", choices=["docker", "bwrap", "both"])
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--starting", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    backends = ["bwrap", "docker"] if args.backend == "both" else [args.backend]
    print(f"{args.sessions} sessions, {len(os.sched_getaffinity(0))} cores; baseline: max_starting=1")
    for backend in backends:
        baseline = None
        for max_starting in sorted({1, *args.starting}):
            ready_s, command_s = await time_to_ready(backend, args.sessions, max_starting)
            baseline = baseline or ready_s
            print(
                f"{backend:6s} max_starting={max_starting}: all ready in {ready_s:6.2f} s "
                f"({ready_s / args.sessions * 1000:5.0f} ms/session), one command in each by {command_s:6.2f} s, "
                f"{baseline / ready_s:4.2f}x the baseline's speed"
            )


if __name__ == "__main__":
    asyncio.run(main())
