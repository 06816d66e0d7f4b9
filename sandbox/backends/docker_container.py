"""One jail of the Docker backend's pool: how a container is specified, started, driven and removed.

A container is long-lived: no network, read-only root, tmpfs /work and /tmp, memory and pids
limits, every capability dropped, no-new-privileges, the jail seccomp profile, its own non-root
uid. Its PID 1 is the in-jail runner (sandbox/image/runner.py, passed as `python3 -c SOURCE` so
the image never goes stale, with the namespace seccomp filter that it loads in every process it
starts), driven over the container's attached stdin/stdout (sandbox.backends.docker_channel).
The host keeps its own wall clock on every run and kills the container when the runner overruns.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import docker
import docker.errors
import requests

from sandbox.admission import RUNS_PER_CPU
from sandbox.backends.base import (
    SCRATCH_INODES,
    TMP_TMPFS_MB,
    WORK_TMPFS_MB,
    Limits,
    ProcessResult,
    SandboxFailure,
)
from sandbox.backends.docker_channel import RunnerChannel, RunnerFailure, RunOutput, process_result
from sandbox.backends.docker_cpu import ContainerCgroup, container_cgroup
from sandbox.backends.seccomp_filter import docker_profile

logger = logging.getLogger(__name__)

DEFAULT_IMAGE = "agentrl-sandbox:latest"
SANDBOX_LABEL = "agentrl.sandbox"
INSTANCE_LABEL = "agentrl.sandbox.instance"
OWNER_PID_LABEL = "agentrl.sandbox.pid"
OWNER_HOST_LABEL = "agentrl.sandbox.host"
DOCKER_ERRORS = (docker.errors.DockerException, requests.RequestException, OSError)
RUNNER_SOURCE = resources.files("sandbox.image").joinpath("runner.py").read_text()
_uid_blocks = itertools.count()


def default_pool_size() -> int:
    """As many containers as the executor admits runs by default (sandbox.executor)."""
    return RUNS_PER_CPU * max(1, len(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class DockerPoolConfig:
    """How the warm pool's containers are made and how long each one lives."""

    image: str = DEFAULT_IMAGE
    # Containers at most; a session waits while all are in use. The first `num_warm` start with
    # the backend, the others when a session finds none idle; all stay in the pool afterwards.
    pool_size: int = field(default_factory=default_pool_size)
    num_warm: int = 4
    recycle_after: int = 200  # runs; a fresh container afterwards
    memory_mb: int = 512  # program memory a container starts with; each run sets its Limits.memory_mb
    pids_limit: int = 128  # per container (the cgroup); Limits.max_processes applies per run
    cpus: float = 1.0  # so that one runaway jail cannot take every core
    # tmpfs pages and inodes are memory charged to the container, and so to the program that
    # wrote them: its memory limit covers its processes and its files together.
    work_tmpfs_mb: int = WORK_TMPFS_MB
    tmp_tmpfs_mb: int = TMP_TMPFS_MB
    shm_mb: int = 16
    scratch_inodes: int = SCRATCH_INODES  # files + directories per tmpfs mount (/work, /tmp, /dev/shm)
    runner_reserve_mb: int = 32  # the runner's own memory: it answers and cleans up after an OOM kill
    wall_clock_grace_s: float = 2.0  # the host kills the container this long after the runner's deadline
    control_timeout_s: float = 30.0  # for start-up, writes and resets

    def __post_init__(self) -> None:
        positive = ("pool_size", "recycle_after", "pids_limit", "work_tmpfs_mb", "tmp_tmpfs_mb", "shm_mb")
        for name in (*positive, "num_warm", "scratch_inodes", "runner_reserve_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.memory_mb < 16:
            raise ValueError(f"memory_mb must be >= 16, got {self.memory_mb}")
        for name in ("cpus", "wall_clock_grace_s", "control_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def cgroup_memory_mb(self, program_memory_mb: int) -> int:
        """The container's memory limit for a program allowed `program_memory_mb`.

        One run at a time uses the container, so its limit is the run's: every process of the
        program and every file it left in the tmpfs mounts count against `program_memory_mb`;
        only the runner (about 12 MiB of Python, and room to clean up) is added. When the
        program fills it, the kernel kills the program (oom_score_adj 1000), never the runner.
        """
        return program_memory_mb + self.runner_reserve_mb


async def docker_call(what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a blocking SDK call in a thread; any Docker failure becomes a SandboxFailure."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except DOCKER_ERRORS as error:
        raise SandboxFailure(f"docker: {what} failed: {error}") from error


async def remove_container(container: Any) -> None:
    """Force-remove (SIGKILL) a container; a leftover is collected as an orphan later."""
    try:
        await asyncio.to_thread(container.remove, force=True)
    except docker.errors.NotFound:
        pass
    except DOCKER_ERRORS as error:
        logger.warning("could not remove sandbox container %s: %s", container.short_id, error)


def ipc_sysctls(config: DockerPoolConfig) -> dict[str, str]:
    """Bounds on the container's private IPC namespace, which outlives every run in it.

    A SysV shared memory segment goes with the last process attached to it (shm_rmid_forced),
    so it is program memory like any other; together the segments stay within `shm_mb`. Message
    queues and semaphores would keep their kernel memory after the program is killed, so they
    are kept tiny (16 SysV queues of 16 KiB, 16 POSIX queues, which RLIMIT_MSGQUEUE caps at
    800 KiB per uid besides): the runner's reserve covers them until it removes them after
    the run (sandbox/image/runner.py).
    """
    return {
        "kernel.shm_rmid_forced": "1",
        "kernel.shmmax": str(config.shm_mb << 20),
        "kernel.shmall": str((config.shm_mb << 20) // os.sysconf("SC_PAGE_SIZE")),
        "kernel.shmmni": "32",
        "kernel.msgmni": "16",
        "kernel.msgmnb": "16384",
        "kernel.msgmax": "8192",
        "kernel.sem": "32 1024 32 16",  # semaphores per set, in all, per semop call; sets
        "fs.mqueue.queues_max": "16",
    }


def container_spec(
    config: DockerPoolConfig, uid: int, instance_id: str, namespace_filter: bytes
) -> dict[str, Any]:
    """Keyword arguments of `containers.create` for one locked-down pool container.

    `namespace_filter`: the BPF of sandbox.backends.seccomp_filter.namespace_filter, for the runner.
    """
    owner = f"uid={uid},gid={uid},nosuid,nodev,nr_inodes={config.scratch_inodes}"
    memory = f"{config.cgroup_memory_mb(config.memory_mb)}m"
    return {
        "image": config.image,
        "command": ["python3", "-I", "-S", "-c", RUNNER_SOURCE, base64.b64encode(namespace_filter).decode()],
        "user": f"{uid}:{uid}",
        "network_mode": "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges", f"seccomp={docker_profile()}"],
        "mem_limit": memory,
        "memswap_limit": memory,  # no swap on top of the memory limit
        "pids_limit": config.pids_limit,
        "nano_cpus": int(config.cpus * 1e9),
        "ipc_mode": "private",  # the namespace's objects are bounded and removed after each run
        "sysctls": ipc_sysctls(config),
        "oom_score_adj": 500,  # if the host runs out of memory, jails go first
        "tmpfs": {
            "/work": f"rw,exec,{owner},size={config.work_tmpfs_mb}m,mode=0700",
            "/tmp": f"rw,noexec,{owner},size={config.tmp_tmpfs_mb}m,mode=1777",
            # Replaces Docker's own /dev/shm mount, whose inode count is unbounded.
            "/dev/shm": f"rw,noexec,{owner},size={config.shm_mb}m,mode=1777",
        },
        "hostname": "sandbox",
        "working_dir": "/work",
        "environment": {},
        "stdin_open": True,
        "labels": {
            SANDBOX_LABEL: "1",
            INSTANCE_LABEL: instance_id,
            OWNER_PID_LABEL: str(os.getpid()),
            OWNER_HOST_LABEL: socket.gethostname(),
        },
    }


def is_orphan(labels: dict[str, str]) -> bool:
    """Whether a labelled container's owning server process (on this host) has exited."""
    if labels.get(OWNER_HOST_LABEL) != socket.gethostname():
        return False  # a server on another machine sharing this engine: not ours to judge
    try:
        os.kill(int(labels.get(OWNER_PID_LABEL, "0")), 0)
    except (ProcessLookupError, ValueError):
        return True
    except PermissionError:
        return False  # alive, owned by another user
    return False


def uid_block(pool_size: int) -> list[int]:
    """Uids for one backend's containers. RLIMIT_NPROC counts processes per uid host-wide,
    so each live container gets a uid that no other container of any server uses."""
    base = 200_000 + (os.getpid() % 20_000) * 10_000 + (next(_uid_blocks) * pool_size) % 10_000
    return list(range(base, base + pool_size))


@dataclass(eq=False)  # identity semantics: pools keep these in sets
class PooledContainer:
    """One warm container, its runner channel and what it has done so far."""

    container: Any  # docker.models.containers.Container
    channel: RunnerChannel
    uid: int
    config: DockerPoolConfig
    memory_mb: int
    num_runs: int = 0
    needs_recycle: bool = False
    dead: bool = False  # killed by the host; the channel is gone
    reasons: list[str] = field(default_factory=list)
    cgroup: ContainerCgroup | None = None  # where its CPU use is read; None where this host cannot

    @classmethod
    async def start(
        cls, client: Any, config: DockerPoolConfig, uid: int, instance_id: str, namespace_filter: bytes
    ) -> PooledContainer:
        """Create, attach, start, and wait until the runner answers."""
        spec = container_spec(config, uid, instance_id, namespace_filter)
        container = await docker_call("creating a container", client.containers.create, **spec)
        try:
            raw = await docker_call("attaching to a container", _attach, container)
            jail = cls(container, await RunnerChannel.open(raw), uid, config, config.memory_mb)
        except BaseException:
            await remove_container(container)
            raise
        try:
            await docker_call("starting a container", container.start)
            await jail.request("ping")
            jail.cgroup = await docker_call("inspecting a container", _find_cgroup, container)
        except BaseException:
            await jail.remove()
            raise
        return jail

    def mark_for_recycle(self, reason: str) -> None:
        self.needs_recycle = True
        self.reasons.append(reason)

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """One control round trip with the runner; any failure marks the container for recycling."""
        try:
            return await self.channel.request(op, fields, self.config.control_timeout_s)
        except (RunnerFailure, TimeoutError) as error:
            self.mark_for_recycle(f"runner failed during {op}: {error}")
            raise SandboxFailure(f"sandbox runner failed during {op}: {error}{await self._logs()}") from error
        except BaseException:
            self.mark_for_recycle(f"{op} interrupted")  # the channel is mid-message
            raise

    async def run(self, argv: list[str], stdin: bytes, limits: Limits, judge_process: bool) -> ProcessResult:
        """Run one process; the host kills the container if the runner overruns its deadline."""
        if limits.memory_mb != self.memory_mb:
            await self._set_memory(limits.memory_mb)
        self.num_runs += 1
        start = time.monotonic()
        output = RunOutput()
        try:
            answer = await asyncio.wait_for(
                self.channel.request("run", _run_fields(argv, stdin, limits, judge_process), None, output),
                timeout=limits.wall_time_s + self.config.wall_clock_grace_s,
            )
        except TimeoutError:
            return await self._kill_overrun(time.monotonic() - start)
        except RunnerFailure as error:
            self.mark_for_recycle(f"runner failed during run: {error}")
            raise SandboxFailure(f"sandbox runner failed during run: {error}{await self._logs()}") from error
        except BaseException:
            self.mark_for_recycle("run interrupted")
            raise
        result = process_result(answer["result"], output)
        for flag in ("timed_out", "memory_exceeded", "suspicious"):
            if getattr(result, flag):
                self.mark_for_recycle(flag)
        return result

    async def _set_memory(self, memory_mb: int) -> None:
        if memory_mb < 16:
            raise ValueError(f"Limits.memory_mb must be >= 16, got {memory_mb}")
        limit = f"{self.config.cgroup_memory_mb(memory_mb)}m"
        await docker_call(
            "updating the memory limit", self.container.update, mem_limit=limit, memswap_limit=limit
        )
        self.memory_mb = memory_mb

    async def _kill_overrun(self, elapsed_s: float) -> ProcessResult:
        reason = f"the runner did not answer within the wall clock plus {self.config.wall_clock_grace_s}s"
        logger.warning("killing sandbox container %s: %s", self.container.short_id, reason)
        self.dead = True
        self.mark_for_recycle(reason)
        await self.remove()
        return ProcessResult(
            exit_code=None,
            signal=9,
            stdout=b"",
            stderr=b"",
            wall_time_s=elapsed_s,
            cpu_time_s=0.0,
            timed_out=True,
            memory_exceeded=False,
            output_exceeded=False,
            suspicious=True,
        )

    async def remove(self) -> None:
        await self.channel.close()
        await remove_container(self.container)

    async def _logs(self) -> str:
        try:
            logs = await asyncio.to_thread(self.container.logs, stdout=False, stderr=True, tail=20)
        except DOCKER_ERRORS:
            return ""
        return f"; runner stderr: {logs.decode(errors='replace').strip()}" if logs else ""


def _run_fields(argv: list[str], stdin: bytes, limits: Limits, judge_process: bool) -> dict[str, Any]:
    return {
        "argv": argv,
        "judge_process": judge_process,
        "stdin": stdin,
        "limits": {
            "wall_time_s": limits.wall_time_s,
            "cpu_time_s": limits.cpu_time_s,
            "max_output_bytes": limits.max_output_bytes,
            "max_processes": limits.max_processes,
            "max_file_size_mb": limits.max_file_size_mb,
        },
    }


def _find_cgroup(container: Any) -> ContainerCgroup | None:
    container.reload()  # the engine reports the init's pid once the container runs
    return container_cgroup(container.id, container.attrs["State"]["Pid"])


def _attach(container: Any) -> socket.socket:
    """The container's stdin/stdout as a socket of our own (the SDK's socket keeps its response)."""
    sdk_socket = container.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
    raw = socket.socket(fileno=os.dup(sdk_socket.fileno()))
    sdk_socket.close()
    return raw
