"""Docker jail backend: a warm pool of locked-down containers (see docker_container.py).

The pool starts `num_warm` containers and grows, while every container is in use, up to
`pool_size`. A session holds one container. Closing it empties the container (kills every process,
clears /work and /tmp) and returns it to the pool, or recycles it (removes it and starts a fresh one in
the background) after `recycle_after` runs or at once after anything suspicious: a timeout, a
memory kill, a process that survived the end of its run, a write outside its tmpfs mounts. Containers are labelled
with the owning server's host and pid, so those of a crashed server are collected at start-up.
The CPU use of the pool's containers is read from their cgroups, for the admission (docker_cpu.py).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import secrets
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from sandbox.admission import CpuUsage
from sandbox.backends.base import Limits, ProcessResult, SandboxFailure
from sandbox.backends.docker_container import (
    DEFAULT_IMAGE,
    DOCKER_ERRORS,
    INSTANCE_LABEL,
    SANDBOX_LABEL,
    DockerPoolConfig,
    PooledContainer,
    docker_call,
    is_orphan,
    remove_container,
    uid_block,
)
from sandbox.backends.docker_cpu import CpuMeter
from sandbox.backends.seccomp_filter import namespace_filter
from sandbox.image.build import IMAGE_VERSION, VERSION_LABEL

__all__ = ["DEFAULT_IMAGE", "DockerBackend", "DockerPoolConfig", "DockerPoolStats", "DockerSession"]

logger = logging.getLogger(__name__)

_START_HINT = "start one with sandbox/scripts/start_docker.sh"


@dataclass
class DockerPoolStats:
    """Counters for metrics endpoints."""

    num_started: int = 0
    num_recycled: int = 0
    num_orphans_removed: int = 0
    num_runs: int = 0
    num_host_kills: int = 0  # runs the host stopped by killing the container


class DockerSession:
    """A private /work in one pooled container, for one request."""

    def __init__(self, backend: DockerBackend, jail: PooledContainer) -> None:
        self._backend = backend
        self._jail = jail
        self._closed = False

    @property
    def container_id(self) -> str:
        return self._jail.container.id

    async def write_files(self, files: dict[str, bytes]) -> None:
        for name in files:
            _check_relative_path(name)
        self._check_usable()
        await self._jail.request("write", files=files)

    async def run(
        self, argv: list[str], stdin: bytes, limits: Limits, judge_process: bool = False
    ) -> ProcessResult:
        if not argv:
            raise ValueError("argv must name a program to run, got []")
        self._check_usable()
        result = await self._jail.run(argv, stdin, limits, judge_process)
        self._backend.stats.num_runs += 1
        self._backend.stats.num_host_kills += self._jail.dead
        return result

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._backend.release(self._jail)

    def _check_usable(self) -> None:
        if self._closed:
            raise SandboxFailure("the session is closed")
        if self._jail.dead:
            raise SandboxFailure(f"the session's container was killed: {'; '.join(self._jail.reasons)}")


def _check_relative_path(name: str) -> None:
    parts = name.split("/")
    if not name or name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"file name {name!r} must be a relative path inside /work without '.' or '..' parts")


class DockerBackend:
    """The Docker jail provider. Build it with `await DockerBackend.create(...)`."""

    name = "docker"

    def __init__(
        self, client: docker.DockerClient, config: DockerPoolConfig, namespace_filter: bytes
    ) -> None:
        self.config = config
        self.namespace_filter = namespace_filter  # BPF the runner loads in every process it starts
        self.instance_id = secrets.token_hex(8)
        self.stats = DockerPoolStats()
        self._client = client
        self._idle: collections.deque[PooledContainer] = collections.deque()
        self._changed = asyncio.Condition()
        self._num_live = 0  # idle + in use + starting
        self._free_uids = uid_block(config.pool_size)
        self._all: set[PooledContainer] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False
        self._cpu_meter = CpuMeter(max_runnable_per_container=math.ceil(config.cpus))
        self.measures_cpu = False  # whether `cpu_usage` sees the containers: set once they are warm

    @classmethod
    async def create(cls, **config: Any) -> DockerBackend:
        """Connect to the engine, collect orphans of dead servers and warm `num_warm` containers.

        Keyword arguments are DockerPoolConfig's fields (image, pool_size, recycle_after, ...).
        """
        pool_config = DockerPoolConfig(**config)
        namespaces = (await asyncio.to_thread(namespace_filter)).read_bytes()
        try:
            client = await asyncio.to_thread(docker.from_env)
            await asyncio.to_thread(client.ping)
        except DOCKER_ERRORS as error:
            raise SandboxFailure(f"no Docker engine answers ({error}); {_START_HINT}") from error
        backend = cls(client, pool_config, namespaces)
        try:
            await backend._check_image()
            await backend.collect_orphans()
            await backend._warm_up()
        except BaseException:
            await backend.close()
            raise
        return backend

    async def _check_image(self) -> None:
        build = f"`python -m sandbox.image.build --image {self.config.image}` or {_START_HINT}"
        try:
            image = await asyncio.to_thread(self._client.images.get, self.config.image)
        except docker.errors.ImageNotFound as error:
            raise SandboxFailure(f"image {self.config.image!r} not found; build it with {build}") from error
        except DOCKER_ERRORS as error:
            raise SandboxFailure(f"docker: inspecting image {self.config.image!r} failed: {error}") from error
        version = image.labels.get(VERSION_LABEL)
        if version != IMAGE_VERSION:
            raise SandboxFailure(
                f"image {self.config.image!r} is of recipe version {version!r}, this code needs "
                f"{IMAGE_VERSION!r}; rebuild it with {build}"
            )

    async def collect_orphans(self) -> int:
        """Remove labelled containers whose owning server process on this host is gone."""
        containers = await docker_call(
            "listing sandbox containers",
            self._client.containers.list,
            all=True,
            filters={"label": f"{SANDBOX_LABEL}=1"},
            ignore_removed=True,  # another server may remove its containers meanwhile
        )
        orphans = [container for container in containers if is_orphan(container.labels)]
        await asyncio.gather(*(remove_container(container) for container in orphans))
        self.stats.num_orphans_removed += len(orphans)
        if orphans:
            logger.info("removed %d orphaned sandbox containers", len(orphans))
        return len(orphans)

    async def _warm_up(self) -> None:
        num_warm = min(self.config.num_warm, self.config.pool_size)
        async with self._changed:
            self._num_live += num_warm
        jails = await asyncio.gather(
            *(self._start_reserved() for _ in range(num_warm)), return_exceptions=True
        )
        started = [jail for jail in jails if isinstance(jail, PooledContainer)]
        async with self._changed:
            self._idle.extend(started)
        failures = [jail for jail in jails if isinstance(jail, BaseException)]
        if failures:
            raise failures[0]
        self.measures_cpu = all(jail.cgroup is not None for jail in started)
        if not self.measures_cpu:
            logger.warning(
                "the sandbox containers' cgroups cannot be read here: runs are admitted one per core"
            )

    def cpu_usage(self) -> CpuUsage:
        """The CPU use of this backend's containers, from their cgroups (for sandbox.admission)."""
        # A snapshot: this runs in a thread while the event loop adds and removes containers.
        jails = tuple(self._all)
        return self._cpu_meter.usage({jail.container.id: jail.cgroup for jail in jails if jail.cgroup})

    async def open_session(self) -> DockerSession:
        """Take an idle container, waiting while all are busy; start one if the pool is short."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._closed or self._idle or self._num_live < self.config.pool_size
            )
            if self._closed:
                raise SandboxFailure("the Docker backend is closed")
            if self._idle:
                return DockerSession(self, self._idle.popleft())
            self._num_live += 1
        return DockerSession(self, await self._start_reserved())

    async def _start_reserved(self) -> PooledContainer:
        """Start a container for a slot already counted in `_num_live`; give the slot back on failure."""
        uid = self._free_uids.pop()
        try:
            jail = await PooledContainer.start(
                self._client, self.config, uid, self.instance_id, self.namespace_filter
            )
        except BaseException:
            self._free_uids.append(uid)
            async with self._changed:
                self._num_live -= 1
                self._changed.notify_all()
            raise
        self._all.add(jail)
        self.stats.num_started += 1
        return jail

    async def release(self, jail: PooledContainer) -> None:
        """Return a container to the pool emptied, or recycle it."""
        if not jail.needs_recycle and jail.num_runs >= self.config.recycle_after:
            jail.mark_for_recycle(f"{jail.num_runs} runs")
        if not jail.needs_recycle and not self._closed:
            try:
                if (await jail.request("reset"))["clean"]:
                    async with self._changed:
                        self._idle.append(jail)
                        self._changed.notify_all()
                    return
                jail.mark_for_recycle("reset left files or processes behind")
            except SandboxFailure:
                pass  # request() marked it for recycling
        await self._recycle(jail)

    async def _recycle(self, jail: PooledContainer) -> None:
        logger.debug("recycling %s: %s", jail.container.short_id, "; ".join(jail.reasons))
        self.stats.num_recycled += 1
        await self._discard(jail)
        async with self._changed:
            self._num_live -= 1
            self._changed.notify_all()
        if not self._closed:
            task = asyncio.create_task(self._replenish())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _replenish(self) -> None:
        async with self._changed:
            if self._closed or self._num_live >= self.config.pool_size:
                return
            self._num_live += 1
        try:
            jail = await self._start_reserved()
        except SandboxFailure as error:  # the next open_session tries again and reports it
            logger.warning("could not replace a recycled sandbox container: %s", error)
            return
        if self._closed:  # close() began while this one was starting
            await self._discard(jail)
            return
        async with self._changed:
            self._idle.append(jail)
            self._changed.notify_all()

    async def _discard(self, jail: PooledContainer) -> None:
        self._all.discard(jail)
        await jail.remove()
        self._free_uids.append(jail.uid)

    async def close(self) -> None:
        """Remove every container of this backend; sessions still open fail from now on."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()
        # Replacements being started are awaited, not cancelled: a cancelled SDK call still
        # completes in its thread and would leave a container behind.
        await asyncio.gather(*self._background, return_exceptions=True)
        await asyncio.gather(*(self._discard(jail) for jail in list(self._all)))
        self._idle.clear()
        await self._remove_leftovers()
        await asyncio.to_thread(self._client.close)

    async def _remove_leftovers(self) -> None:
        """Remove containers of this instance that no pool slot knows (an interrupted start)."""
        try:
            leftovers = await docker_call(
                "listing sandbox containers",
                self._client.containers.list,
                all=True,
                filters={"label": f"{INSTANCE_LABEL}={self.instance_id}"},
                ignore_removed=True,
            )
        except SandboxFailure as error:
            logger.warning("could not list leftover sandbox containers: %s", error)
            return
        await asyncio.gather(*(remove_container(container) for container in leftovers))
