"""The CPU use of the Docker backend's containers, read from their cgroups: real containers that spin
and sleep, on this host's cgroup hierarchies (v1 cpuacct, and the unified v2 one mounted beside it)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator

import docker
import pytest

from sandbox.backends.base import Limits
from sandbox.backends.docker import DockerBackend, DockerSession
from sandbox.backends.docker_container import INSTANCE_LABEL
from sandbox.backends.docker_cpu import ContainerCgroup, container_cgroup
from sandbox.executor import RUNS_PER_CPU, Executor, default_max_concurrency

SPIN = ["python3", "-c", "while True:\n    pass"]
SLEEP = ["python3", "-c", "import time\ntime.sleep(60)"]
LONG = Limits(wall_time_s=30.0, cpu_time_s=30.0, memory_mb=128)


@pytest.fixture
def docker_client() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture
async def backend() -> AsyncIterator[DockerBackend]:
    backend = await DockerBackend.create(pool_size=2)
    yield backend
    await backend.close()


def _cgroup(client: docker.DockerClient, session: DockerSession, version: int) -> ContainerCgroup:
    init_pid = client.containers.get(session.container_id).attrs["State"]["Pid"]
    cgroup = container_cgroup(session.container_id, init_pid, versions=(version,))
    assert cgroup is not None and cgroup.version == version
    return cgroup


async def _wait_until(condition, within_s: float = 60.0) -> None:
    """Poll `condition` until it holds; a hang guard, not a timing assertion."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("version", [1, 2])
async def test_a_spinning_containers_cpu_time_grows_and_a_sleeping_ones_does_not(
    backend: DockerBackend, docker_client: docker.DockerClient, version: int
) -> None:
    spinning, sleeping = await backend.open_session(), await backend.open_session()
    runs = [
        asyncio.create_task(session.run(argv, b"", LONG))
        for session, argv in ((spinning, SPIN), (sleeping, SLEEP))
    ]
    try:
        spinner = _cgroup(docker_client, spinning, version)
        sleeper = _cgroup(docker_client, sleeping, version)
        await _wait_until(lambda: sleeper.num_runnable() == 0 and spinner.num_runnable() == 1)
        spinner_start, sleeper_start = spinner.cpu_s(), sleeper.cpu_s()
        await _wait_until(lambda: spinner.cpu_s() - spinner_start >= 1.0)
        sleeper_growth = sleeper.cpu_s() - sleeper_start
        runnable = [(spinner.num_runnable(), sleeper.num_runnable()) for _ in range(20)]
    finally:
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        await asyncio.gather(spinning.close(), sleeping.close())
    assert sleeper_growth < 0.1  # the runner waiting on the sleeping program: CPU time of milliseconds
    assert max(spinner for spinner, _ in runnable) == 1
    assert max(sleeper for _, sleeper in runnable) == 0


async def test_the_pools_cpu_time_counts_a_spinning_container_and_keeps_it_once_the_container_is_gone(
    backend: DockerBackend, docker_client: docker.DockerClient
) -> None:
    assert backend.measures_cpu
    before = backend.cpu_usage()
    session = await backend.open_session()
    # Spins to its 1 s CPU limit; the timed-out container is then removed and replaced.
    result = await session.run(SPIN, b"", Limits(wall_time_s=10.0, cpu_time_s=1.0, memory_mb=128))
    spun = backend.cpu_usage()
    await session.close()
    label = {"label": f"{INSTANCE_LABEL}={backend.instance_id}"}
    await _wait_until(
        lambda: backend.stats.num_started == 3 and len(docker_client.containers.list(filters=label)) == 2
    )
    after = backend.cpu_usage()
    assert (result.timed_out, backend.stats.num_recycled) == (True, 1)
    assert spun.cpu_s - before.cpu_s >= 0.9
    assert after.cpu_s >= spun.cpu_s


async def test_two_spinning_processes_in_one_container_count_as_its_one_core(
    backend: DockerBackend, docker_client: docker.DockerClient
) -> None:
    session = await backend.open_session()
    spin_twice = ["sh", "-c", f"{SPIN[0]} -c '{SPIN[2]}' & {SPIN[0]} -c '{SPIN[2]}'; wait"]
    run = asyncio.create_task(session.run(spin_twice, b"", LONG))
    try:
        cgroup = _cgroup(docker_client, session, 1)
        await _wait_until(lambda: cgroup.num_runnable() == 2)
        pool_runnable = max(backend.cpu_usage().num_runnable for _ in range(20))
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await session.close()
    assert (backend.config.cpus, pool_runnable) == (1.0, 1)


def test_a_process_whose_cgroup_does_not_name_the_container_gives_no_cgroup() -> None:
    # What a pid of another PID namespace than the engine's would look like: not the container.
    container_id = "0" * 64
    assert container_cgroup(container_id, os.getpid()) is None
    assert container_cgroup(container_id, 2**22 + 1) is None  # no such process


async def test_the_executor_admits_several_runs_per_core_on_docker_measuring_its_containers() -> None:
    async with await Executor.create("docker") as executor:
        cores = default_max_concurrency()
        backend = executor.backend
        assert isinstance(backend, DockerBackend)
        assert executor.max_concurrency == backend.config.pool_size == RUNS_PER_CPU * cores
        assert backend.stats.num_started == 4  # the warm ones; the others start on demand
