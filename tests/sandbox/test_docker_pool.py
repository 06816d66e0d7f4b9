"""The Docker backend's warm pool: reuse, recycling, orphan collection, start-up errors."""

from __future__ import annotations

import asyncio
import os
import socket

import docker
import pytest

from sandbox.backends.base import Limits, SandboxFailure
from sandbox.backends.docker import DEFAULT_IMAGE, DockerBackend
from sandbox.backends.docker_container import INSTANCE_LABEL, OWNER_HOST_LABEL, OWNER_PID_LABEL, SANDBOX_LABEL

QUICK = Limits(wall_time_s=2.0, cpu_time_s=2.0, memory_mb=256)


@pytest.fixture
def docker_client():
    client = docker.from_env()
    yield client
    client.close()


def _sandbox_containers(client: docker.DockerClient, instance_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{INSTANCE_LABEL}={instance_id}"})


async def _container_of_one_session(backend: DockerBackend, argv: list[str], limits: Limits = QUICK) -> str:
    session = await backend.open_session()
    await session.run(argv, b"", limits)
    await session.close()
    return session.container_id


async def test_pool_warms_up_its_containers_and_reuses_them_across_sessions(docker_client):
    backend = await DockerBackend.create(pool_size=2)
    try:
        assert len(_sandbox_containers(docker_client, backend.instance_id)) == 2
        first = await _container_of_one_session(backend, ["true"])
        second = await _container_of_one_session(backend, ["true"])
        third = await _container_of_one_session(backend, ["true"])
        # Idle containers are taken in order: the two warm ones, then the first one again.
        assert first != second
        assert third == first
        assert backend.stats.num_started == 2
        assert backend.stats.num_recycled == 0
    finally:
        await backend.close()
    assert _sandbox_containers(docker_client, backend.instance_id) == []


async def test_a_container_is_recycled_after_recycle_after_runs(docker_client):
    backend = await DockerBackend.create(pool_size=1, recycle_after=3)
    try:
        session = await backend.open_session()
        for _ in range(3):
            await session.run(["true"], b"", QUICK)
        await session.close()
        replacement = await _container_of_one_session(backend, ["true"])
        assert replacement != session.container_id
        assert backend.stats.num_recycled == 1
        assert [c.id for c in _sandbox_containers(docker_client, backend.instance_id)] == [replacement]
    finally:
        await backend.close()


async def test_a_container_is_recycled_at_once_after_a_timeout():
    backend = await DockerBackend.create(pool_size=1, recycle_after=100)
    try:
        session = await backend.open_session()
        result = await session.run(["sleep", "30"], b"", Limits(wall_time_s=0.5, cpu_time_s=1.0))
        await session.close()
        assert result.timed_out
        assert result.signal == 9
        after = await _container_of_one_session(backend, ["true"])
        assert after != session.container_id
        assert backend.stats.num_recycled == 1
    finally:
        await backend.close()


async def test_a_session_after_a_clean_one_finds_an_empty_work_dir_and_no_processes():
    backend = await DockerBackend.create(pool_size=1)
    try:
        session = await backend.open_session()
        await session.write_files({"secret.txt": b"from the first session"})
        await session.run(["sh", "-c", "echo x > /tmp/left_in_tmp; cat secret.txt"], b"", QUICK)
        await session.close()
        session = await backend.open_session()
        count_processes = "import os; print(sum(name.isdigit() for name in os.listdir('/proc')))"
        result = await session.run(
            ["sh", "-c", f'ls -A /work /tmp; exec python3 -c "{count_processes}"'], b"", QUICK
        )
        await session.close()
        # Only the runner (PID 1) and the counting process itself.
        assert result.stdout.decode().split() == ["/tmp:", "/work:", "2"]
    finally:
        await backend.close()


async def test_orphans_of_a_dead_server_are_collected_at_start_up_and_live_ones_kept(docker_client):
    exited = await asyncio.create_subprocess_exec("true")
    await exited.wait()
    dead_pid = str(exited.pid)

    def labelled(pid: str) -> str:
        labels = {SANDBOX_LABEL: "1", INSTANCE_LABEL: "other", OWNER_PID_LABEL: pid}
        labels[OWNER_HOST_LABEL] = socket.gethostname()
        return docker_client.containers.create(DEFAULT_IMAGE, ["true"], labels=labels).id

    orphan, alive = labelled(dead_pid), labelled(str(os.getpid()))
    try:
        backend = await DockerBackend.create(pool_size=1)
        await backend.close()
        remaining = {
            c.id
            for c in docker_client.containers.list(all=True, filters={"label": f"{INSTANCE_LABEL}=other"})
        }
        assert backend.stats.num_orphans_removed == 1
        assert remaining == {alive}
        assert orphan not in remaining
    finally:
        for container_id in (orphan, alive):
            try:
                docker_client.containers.get(container_id).remove(force=True)
            except docker.errors.NotFound:
                pass


async def test_sessions_beyond_the_pool_size_wait_for_a_free_container():
    backend = await DockerBackend.create(pool_size=1)
    try:
        holder = await backend.open_session()
        waiter = asyncio.create_task(backend.open_session())
        await asyncio.sleep(0.2)
        assert not waiter.done()
        await holder.close()
        second = await asyncio.wait_for(waiter, timeout=30)
        assert second.container_id == holder.container_id
        await second.close()
    finally:
        await backend.close()


async def test_the_pool_starts_its_warm_containers_and_grows_while_all_are_in_use_up_to_its_size(
    docker_client,
):
    backend = await DockerBackend.create(pool_size=3, num_warm=1)
    try:
        assert len(_sandbox_containers(docker_client, backend.instance_id)) == 1
        sessions = [await backend.open_session() for _ in range(3)]
        assert len(_sandbox_containers(docker_client, backend.instance_id)) == 3
        waiter = asyncio.create_task(backend.open_session())
        await asyncio.sleep(0.2)
        assert not waiter.done()
        await sessions[0].close()
        fourth = await asyncio.wait_for(waiter, timeout=30)
        assert fourth.container_id == sessions[0].container_id
        for session in [*sessions[1:], fourth]:
            await session.close()
        # Containers started on demand stay in the pool.
        containers = _sandbox_containers(docker_client, backend.instance_id)
        assert (backend.stats.num_started, len(containers)) == (3, 3)
    finally:
        await backend.close()


async def test_a_frozen_runner_is_killed_by_the_host_wall_clock_and_its_session_fails_afterwards(
    docker_client,
):
    backend = await DockerBackend.create(pool_size=1, wall_clock_grace_s=0.5)
    try:
        session = await backend.open_session()
        run = asyncio.create_task(session.run(["sleep", "0.3"], b"", Limits(wall_time_s=1.0)))
        await asyncio.sleep(0.1)
        docker_client.containers.get(session.container_id).pause()  # the runner can no longer answer
        result = await run
        assert (result.timed_out, result.suspicious, result.signal) == (True, True, 9)
        assert backend.stats.num_host_kills == 1
        with pytest.raises(SandboxFailure, match="container was killed"):
            await session.run(["true"], b"", QUICK)
        await session.close()
        assert await _container_of_one_session(backend, ["true"]) != session.container_id
    finally:
        await backend.close()


async def test_a_missing_image_is_a_sandbox_failure_naming_the_build_command():
    with pytest.raises(SandboxFailure, match="sandbox.image.build"):
        await DockerBackend.create(image="agentrl-sandbox:no-such-tag", pool_size=1)


def test_a_pool_size_of_zero_is_rejected_with_the_bad_value():
    with pytest.raises(ValueError, match="pool_size must be >= 1, got 0"):
        asyncio.run(DockerBackend.create(pool_size=0))
