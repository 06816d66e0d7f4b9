"""Sandbox throughput: executions/s and per-test overhead of each backend, against a baseline of one
`docker run --rm --network none IMAGE ...` per test (how a per-test-container sandbox works),
measured in the same run.

    python -m benchmarks.sandbox_throughput [--backends bwrap,docker] [--workloads trivial,moderate]
        [--concurrency N] [--num-requests 24] [--tests-per-request 4] [--latency-requests 12]
        [--baseline-tests 12] [--image agentrl-sandbox:latest] [--via inproc|http]

Per backend and workload:
  latency phase    requests one at a time; overhead per test = its wall time minus the program's own
                   CPU time (both as the backend measured them), p50 / p99; and end-to-end overhead
                   per test = the request's wall time seen by the caller / its number of tests, minus
                   the wall time of the same program run bare on the host (no jail), p50 / p99;
  throughput phase `num_requests` requests at `concurrency`; executions (tests run) per second.
Baseline: the same programs and inputs, one `docker run` per test at the same concurrency.
Every execution must be AC, otherwise the numbers would describe failures; the count is printed.

    python -m benchmarks.sandbox_throughput --admission [--backends bwrap] [--sleepers 0,4,8]
        [--quick-runs 100] [--clients 32] [--spinners 40] [--burst-deadline-s 10]

Admission phase, through the HTTP server's SandboxFusion route (/run_code), per backend:
  quick runs       `quick-runs` one-line programs from `clients` concurrent clients while `sleepers`
                   programs sleep to their 10 s limit (every program asks for 256 MB); answers per
                   second, latency p50 / p99, and how many were answered 503. Baseline, in the same
                   run: the same server admitting one run per core (max_concurrency = cpu_slots =
                   cores).
  CPU-bound burst  `spinners` programs that spin to their 1 s limit, sent at once with a
                   `burst-deadline-s` deadline: how many got a verdict and how many 503 (with
                   Retry-After), and when the last answer came.

    python -m benchmarks.sandbox_throughput --idle-connections 19500 [--backends bwrap]

Idle connections: `python -m sandbox.server` with its defaults, and that many connections that send
half a request's headers and nothing more; how soon `/health` and a run are answered while they are
open, whether the server closed every one of them, and how much it logged meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import socket
import sys
import tempfile
import time
from dataclasses import dataclass

import aiohttp

from sandbox.client import CodeRunner, SandboxClient
from sandbox.executor import Executor, default_max_concurrency
from sandbox.metrics import nearest_rank_percentile
from sandbox.server import create_app, serve
from sandbox.types import Language, RunLimits, RunRequest, RunResponse, StdioTest, Verdict

TRIVIAL = "print(int(input()) + 1)"
# About 30 ms of CPU per test: enough work that the jail's overhead is not the whole story.
MODERATE = "n = int(input())\nprint(sum(i * i % 7 for i in range(n)))"
MODERATE_N = 200_000
LIMITS = RunLimits(time_s=10, memory_mb=256)


@dataclass(frozen=True)
class Workload:
    """One program with `tests_per_request` stdio tests whose expected output the host computed."""

    name: str
    code: str
    inputs: list[int]
    expected: list[str]

    def request(self) -> RunRequest:
        tests = [StdioTest(stdin=f"{n}\n", expected_stdout=out) for n, out in zip(self.inputs, self.expected)]
        return RunRequest(language=Language.PYTHON, code=self.code, tests=tests, limits=LIMITS)


def make_workload(name: str, tests_per_request: int) -> Workload:
    if name == "trivial":
        inputs = list(range(tests_per_request))
        return Workload(name, TRIVIAL, inputs, [f"{n + 1}\n" for n in inputs])
    if name == "moderate":
        inputs = [MODERATE_N + i for i in range(tests_per_request)]
        return Workload(name, MODERATE, inputs, [f"{sum(i * i % 7 for i in range(n))}\n" for n in inputs])
    raise ValueError(f"unknown workload {name!r}; choose from trivial, moderate")


@dataclass
class Measurement:
    """One backend (or the baseline) on one workload."""

    label: str
    executions_per_s: float
    overhead_p50_ms: float | None  # jail-reported wall - cpu; None for the baseline (no CPU time)
    overhead_p99_ms: float | None
    e2e_overhead_p50_ms: float  # caller-seen wall per test minus the bare host run's wall
    e2e_overhead_p99_ms: float
    wall_p50_ms: float  # per test, one at a time
    num_executions: int
    num_not_ac: int


def _ms(sorted_seconds: list[float], fraction: float) -> float:
    return 1000 * nearest_rank_percentile(sorted_seconds, fraction)


async def measure_runner(
    label: str, runner: CodeRunner, workload: Workload, bare_wall_s: float, args: argparse.Namespace
) -> Measurement:
    """Latency phase (sequential) then throughput phase (concurrent) on an already warm runner."""
    sequential: list[RunResponse] = []
    per_test_walls: list[float] = []
    for _ in range(args.latency_requests):
        started = time.perf_counter()
        sequential.append(await runner.run(workload.request()))
        per_test_walls.append((time.perf_counter() - started) / len(workload.inputs))
    tests = [test for response in sequential for test in response.tests]
    overheads = sorted(test.wall_time_s - test.cpu_time_s for test in tests)
    e2e_overheads = sorted(wall - bare_wall_s for wall in per_test_walls)

    started = time.perf_counter()
    concurrent = await runner.run_many([workload.request() for _ in range(args.num_requests)])
    elapsed = time.perf_counter() - started
    num_executions = sum(len(response.tests) for response in concurrent)
    all_tests = tests + [test for response in concurrent for test in response.tests]
    not_ac = sum(test.verdict != Verdict.AC for test in all_tests)
    not_ac += sum(response.verdict == Verdict.SANDBOX_ERROR for response in sequential + concurrent)
    return Measurement(
        label=label,
        executions_per_s=num_executions / elapsed,
        overhead_p50_ms=_ms(overheads, 0.5),
        overhead_p99_ms=_ms(overheads, 0.99),
        e2e_overhead_p50_ms=_ms(e2e_overheads, 0.5),
        e2e_overhead_p99_ms=_ms(e2e_overheads, 0.99),
        wall_p50_ms=_ms(sorted(test.wall_time_s for test in tests), 0.5),
        num_executions=num_executions + len(tests),
        num_not_ac=not_ac,
    )


async def bare_run_wall_s(workload: Workload, num_runs: int) -> float:
    """Median wall time of the program run directly on the host: the cost no jail can avoid."""
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    walls = []
    for index in range(num_runs):
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            python,
            "-I",
            "-B",
            "-c",
            workload.code,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        await process.communicate(f"{workload.inputs[index % len(workload.inputs)]}\n".encode())
        walls.append(time.perf_counter() - started)
    return nearest_rank_percentile(sorted(walls), 0.5)


async def docker_run_once(image: str, workload: Workload, index: int) -> tuple[float, bool]:
    """One test as its own container; returns (wall seconds, output correct)."""
    argv = ["docker", "run", "--rm", "-i", "--network", "none", image, "python3", "-c", workload.code]
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, _ = await process.communicate(f"{workload.inputs[index]}\n".encode())
    wall = time.perf_counter() - started
    return wall, process.returncode == 0 and stdout.decode() == workload.expected[index]


async def measure_baseline(
    image: str, workload: Workload, bare_wall_s: float, args: argparse.Namespace
) -> Measurement:
    count = len(workload.inputs)
    sequential = [await docker_run_once(image, workload, i % count) for i in range(args.baseline_tests)]
    slots = asyncio.Semaphore(args.concurrency)

    async def bounded(index: int) -> tuple[float, bool]:
        async with slots:
            return await docker_run_once(image, workload, index % count)

    started = time.perf_counter()
    concurrent = await asyncio.gather(*(bounded(i) for i in range(args.baseline_tests)))
    elapsed = time.perf_counter() - started
    walls = sorted(wall for wall, _ in sequential)
    return Measurement(
        label="docker run per test",
        executions_per_s=len(concurrent) / elapsed,
        overhead_p50_ms=None,
        overhead_p99_ms=None,
        e2e_overhead_p50_ms=_ms(walls, 0.5) - 1000 * bare_wall_s,
        e2e_overhead_p99_ms=_ms(walls, 0.99) - 1000 * bare_wall_s,
        wall_p50_ms=_ms(walls, 0.5),
        num_executions=len(sequential) + len(concurrent),
        num_not_ac=sum(not ok for _, ok in sequential + concurrent),
    )


async def measure_backend(
    name: str, workloads: list[Workload], bare_walls_s: dict[str, float], args: argparse.Namespace
) -> list[Measurement]:
    backend_kwargs = {"image": args.image} if name == "docker" else {}
    executor = await Executor.create(backend=name, max_concurrency=args.concurrency, **backend_kwargs)
    label = f"{name} ({args.via})"
    async with contextlib.AsyncExitStack() as stack:
        runner: CodeRunner = await stack.enter_async_context(executor)
        if args.via == "http":
            url = await stack.enter_async_context(serve(create_app(executor)))
            runner = await stack.enter_async_context(SandboxClient(url))
        results = []
        for workload in workloads:
            # Warm-up: fills the Docker pool and the page cache, so both phases see steady state.
            await runner.run_many([workload.request() for _ in range(args.concurrency)])
            results.append(await measure_runner(label, runner, workload, bare_walls_s[workload.name], args))
        return results


def print_report(
    workload: Workload,
    rows: list[Measurement],
    baseline: Measurement | None,
    bare_wall_s: float,
    num_cpus: int,
) -> None:
    print(
        f"\n== workload {workload.name}: {len(workload.inputs)} tests per request; "
        f"bare host run {1000 * bare_wall_s:.1f} ms =="
    )
    print(
        f"{'runner':<22}{'exec/s':>8}{'/core':>7}{'jail overhead p50/p99':>23}{'e2e overhead p50/p99':>22}"
        f"{'wall p50':>10}{'vs baseline':>13}{'not AC':>9}"
    )
    for row in rows + ([baseline] if baseline else []):
        jail = (
            f"{row.overhead_p50_ms:.1f} / {row.overhead_p99_ms:.1f} ms"
            if row.overhead_p50_ms is not None and row.overhead_p99_ms is not None
            else "-"
        )
        e2e = f"{row.e2e_overhead_p50_ms:.1f} / {row.e2e_overhead_p99_ms:.1f} ms"
        ratio = f"{row.executions_per_s / baseline.executions_per_s:.1f}x" if baseline else "n/a"
        print(
            f"{row.label:<22}{row.executions_per_s:>8.1f}{row.executions_per_s / num_cpus:>7.1f}{jail:>23}{e2e:>22}"
            f"{row.wall_p50_ms:>7.1f} ms{ratio:>13}{row.num_not_ac:>5}/{row.num_executions}"
        )


SLEEPER = "import time\ntime.sleep(60)"
SPINNER = "while True:\n    pass"
SLEEPER_TIMEOUT_S = 10
SPINNER_TIMEOUT_S = 1


@dataclass
class QuickRuns:
    """Quick runs answered while other programs sleep, under one admission."""

    label: str
    num_sleepers: int
    answered_per_s: float
    p50_ms: float
    p99_ms: float
    num_busy: int  # answered 503
    num_wrong: int  # answered, but not Success with the expected stdout


async def _run_code(
    session: aiohttp.ClientSession, url: str, code: str, run_timeout: float, stdin: str = "", **headers: str
) -> tuple[int, dict]:
    body = {
        "code": code,
        "language": "python",
        "stdin": stdin,
        "run_timeout": run_timeout,
        "memory_limit_MB": 256,
    }
    async with session.post(f"{url}/run_code", json=body, headers=headers) as answer:
        return answer.status, await answer.json()


async def measure_quick_runs(
    label: str, executor: Executor, num_sleepers: int, args: argparse.Namespace
) -> QuickRuns:
    """`args.quick_runs` quick programs from `args.clients` clients while `num_sleepers` programs sleep."""
    timeout = aiohttp.ClientTimeout(total=3 * SLEEPER_TIMEOUT_S + 60)
    async with serve(create_app(executor)) as url, aiohttp.ClientSession(timeout=timeout) as session:
        sleepers = [
            asyncio.create_task(_run_code(session, url, SLEEPER, SLEEPER_TIMEOUT_S))
            for _ in range(num_sleepers)
        ]
        async with asyncio.timeout(60):
            while executor.admission.state().num_running < min(num_sleepers, executor.max_concurrency):
                await asyncio.sleep(0.01)
        clients = asyncio.Semaphore(args.clients)

        async def quick(index: int) -> tuple[int, bool, float]:
            async with clients:
                started = time.perf_counter()
                status, body = await _run_code(session, url, TRIVIAL, 2, f"{index}\n")
                correct = body.get("status") == "Success" and body["run_result"]["stdout"] == f"{index + 1}\n"
                return status, correct, time.perf_counter() - started

        started = time.perf_counter()
        answers = await asyncio.gather(*(quick(index) for index in range(args.quick_runs)))
        elapsed = time.perf_counter() - started
        for task in sleepers:
            task.cancel()
        await asyncio.gather(*sleepers, return_exceptions=True)
    answered = sorted(latency for status, _, latency in answers if status == 200)
    return QuickRuns(
        label=label,
        num_sleepers=num_sleepers,
        answered_per_s=len(answered) / elapsed,
        p50_ms=_ms(answered, 0.5) if answered else float("nan"),
        p99_ms=_ms(answered, 0.99) if answered else float("nan"),
        num_busy=sum(status == 503 for status, _, _ in answers),
        num_wrong=sum(status == 200 and not correct for status, correct, _ in answers),
    )


async def measure_cpu_burst(executor: Executor, args: argparse.Namespace) -> str:
    """`args.spinners` CPU-bound programs at once with a deadline: verdicts, 503s, last answer."""
    deadline = {"X-Sandbox-Deadline-S": str(args.burst_deadline_s)}
    async with serve(create_app(executor)) as url, aiohttp.ClientSession() as session:

        async def spin() -> tuple[int, str, float, bool]:
            status, body = await _run_code(session, url, SPINNER, SPINNER_TIMEOUT_S, **deadline)
            kind = body["run_result"]["status"] if status == 200 else body.get("error", "")
            return status, kind, time.perf_counter() - started, status != 503 or "retry_after_s" in body

        started = time.perf_counter()
        answers = await asyncio.gather(*(spin() for _ in range(args.spinners)))
    verdicts = sorted({kind for status, kind, _, _ in answers if status == 200})
    num_busy = sum(status == 503 for status, _, _, _ in answers)
    return (
        f"{args.spinners} programs spinning to a {SPINNER_TIMEOUT_S} s limit, sent at once with a "
        f"{args.burst_deadline_s:g} s deadline: {len(answers) - num_busy} got a verdict "
        f"({', '.join(verdicts)}), "
        f"{num_busy} got 503 (all with Retry-After: {all(ok for *_, ok in answers)}); "
        f"last answer after {max(at for _, _, at, _ in answers):.1f} s"
    )


async def measure_admission(name: str, args: argparse.Namespace) -> None:
    cores = default_max_concurrency()
    rows = []
    for num_sleepers in [int(n) for n in args.sleepers.split(",")]:
        for label, options in (
            ("by CPU (default)", {}),
            ("one per core (baseline)", {"max_concurrency": cores, "cpu_slots": cores}),
        ):
            executor = await Executor.create(backend=name, **options)
            rows.append(await measure_quick_runs(label, executor, num_sleepers, args))
    print(
        f"\n== admission, {name}, /run_code, {cores} cores: {args.quick_runs} quick runs "
        f"from {args.clients} clients =="
    )
    print(
        f"{'sleepers':>8}  {'admission':<24}{'answered/s':>11}{'p50':>9}{'p99':>9}{'503':>6}{'wrong':>7}"
        f"{'vs baseline':>13}"
    )
    for row in rows:
        baseline = next(
            other
            for other in rows
            if other.num_sleepers == row.num_sleepers and other.label.endswith("(baseline)")
        )
        ratio = row.answered_per_s / baseline.answered_per_s if baseline.answered_per_s else float("inf")
        print(
            f"{row.num_sleepers:>8}  {row.label:<24}{row.answered_per_s:>11.1f}{row.p50_ms:>7.0f}ms"
            f"{row.p99_ms:>7.0f}ms{row.num_busy:>6}{row.num_wrong:>7}{ratio:>12.2f}x"
        )
    print(await measure_cpu_burst(await Executor.create(backend=name), args))


async def measure_idle_connections(name: str, num_connections: int) -> str:
    """`num_connections` half-sent requests against the server command; see the module docstring."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    idle: list[asyncio.StreamWriter] = []
    with tempfile.TemporaryFile() as log:
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sandbox.server", "--backend", name, "--port", str(port), stderr=log
        )
        try:
            async with aiohttp.ClientSession() as session:
                while True:
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(f"{url}/health"):
                            break
                    if server.returncode is not None:
                        raise RuntimeError(f"the server exited with {server.returncode} before it served")
                    await asyncio.sleep(0.1)
                log_start = os.fstat(log.fileno()).st_size
                readers = []
                for _ in range(num_connections):
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(b"POST /v1/run HTTP/1.1\r\nHost: sandbox\r\nContent-Ty")
                    readers.append(reader)
                    idle.append(writer)
                opened = time.perf_counter()
                async with session.get(f"{url}/health") as answer:
                    health = f"HTTP {answer.status} in {time.perf_counter() - opened:.2f} s"
                started = time.perf_counter()
                body = {"language": "python", "code": "print(input())", "stdin": "hi\n"}
                async with session.post(f"{url}/v1/run", json=body) as answer:
                    run = f"{(await answer.json())['verdict']} in {time.perf_counter() - started:.2f} s"

                async def closed(reader: asyncio.StreamReader) -> bool:
                    try:
                        return await reader.read(1 << 16) == b""
                    except ConnectionError:
                        return True

                num_closed = sum(await asyncio.gather(*(closed(reader) for reader in readers)))
                closed_s = time.perf_counter() - opened
        finally:
            for writer in idle:
                writer.close()
            server.terminate()
            await server.wait()
        log_bytes = os.fstat(log.fileno()).st_size - log_start
    return (
        f"{num_connections} connections that never finish their headers ({name}): /health {health}, "
        f"a run {run}; the server closed {num_closed} of them within {closed_s:.1f} s of the last one "
        f"opening; it logged {log_bytes} bytes meanwhile"
    )


async def main(args: argparse.Namespace) -> None:
    if args.idle_connections:
        _, hard_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard_limit, hard_limit))
        for name in [name for name in args.backends.split(",") if name]:
            print(await measure_idle_connections(name, args.idle_connections))
        return
    if args.admission:
        for name in [name for name in args.backends.split(",") if name]:
            await measure_admission(name, args)
        return
    workloads = [make_workload(name, args.tests_per_request) for name in args.workloads.split(",")]
    backends = [name for name in args.backends.split(",") if name]
    num_cpus = len(os.sched_getaffinity(0))
    print(f"cpus={num_cpus} concurrency={args.concurrency} requests={args.num_requests} via={args.via}")
    print(
        "targets: bwrap overhead p50 <= 15 ms; docker p50 <= 30 ms, p99 <= 100 ms; >= 30 trivial exec/s/core;"
    )
    print("         >= 10x the docker-run-per-test baseline")
    bare_walls_s = {
        workload.name: await bare_run_wall_s(workload, args.latency_requests) for workload in workloads
    }
    results: dict[str, list[Measurement]] = {workload.name: [] for workload in workloads}
    for name in backends:
        for measurement, workload in zip(
            await measure_backend(name, workloads, bare_walls_s, args), workloads
        ):
            results[workload.name].append(measurement)
    for workload in workloads:
        bare_wall_s = bare_walls_s[workload.name]
        baseline = None
        if args.baseline_tests > 0:
            baseline = await measure_baseline(args.image, workload, bare_wall_s, args)
        print_report(workload, results[workload.name], baseline, bare_wall_s, num_cpus)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backends", default="bwrap,docker", help="comma-separated: bwrap, docker, unsafe-local"
    )
    parser.add_argument("--workloads", default="trivial,moderate")
    parser.add_argument("--concurrency", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--num-requests", type=int, default=24)
    parser.add_argument("--tests-per-request", type=int, default=4)
    parser.add_argument("--latency-requests", type=int, default=12)
    parser.add_argument("--baseline-tests", type=int, default=12, help="0 skips the docker-run baseline")
    parser.add_argument("--image", default=os.environ.get("AGENTRL_SANDBOX_IMAGE", "agentrl-sandbox:latest"))
    parser.add_argument(
        "--via", default="inproc", choices=["inproc", "http"], help="Executor or server+client"
    )
    parser.add_argument("--admission", action="store_true", help="run the admission phase instead")
    parser.add_argument("--sleepers", default="0,4,8", help="admission: sleeping programs per measurement")
    parser.add_argument("--quick-runs", type=int, default=100)
    parser.add_argument("--clients", type=int, default=32, help="admission: concurrent quick-run clients")
    parser.add_argument("--spinners", type=int, default=40)
    parser.add_argument("--burst-deadline-s", type=float, default=10.0)
    parser.add_argument(
        "--idle-connections", type=int, default=0, help="run the idle-connections phase instead"
    )
    args = parser.parse_args()
    for flag in (
        "concurrency",
        "num_requests",
        "tests_per_request",
        "latency_requests",
        "quick_runs",
        "clients",
    ):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
