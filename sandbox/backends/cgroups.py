"""Per-run cgroups for the bubblewrap backend: total memory, process count, CPU time, kill-all.

Optional: `RunCgroup.create` returns None where the host does not let us create cgroups, and
the backend then relies on rlimits and the PID namespace alone. Supports cgroup v2 (unified,
with the memory and pids controllers enabled) and cgroup v1 (memory, pids, cpuacct hierarchies).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_NAME = "sandbox-bwrap"
V1_CONTROLLERS = ("memory", "pids", "cpuacct")


def _v2_available() -> bool:
    controllers = CGROUP_ROOT / "cgroup.controllers"
    return controllers.exists() and {"memory", "pids"} <= set(controllers.read_text().split())


def _v1_available() -> bool:
    return all((CGROUP_ROOT / controller / "cgroup.procs").exists() for controller in V1_CONTROLLERS)


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _remove_partial(name: str) -> None:
    """Undo a half-made cgroup (a limit the host refused): empty dirs only, so rmdir is enough."""
    for parent in [CGROUP_ROOT, *(CGROUP_ROOT / controller for controller in V1_CONTROLLERS)]:
        directory = parent / GROUP_NAME / name
        if directory.is_dir():
            directory.rmdir()


@dataclass
class RunCgroup:
    """The cgroup(s) one jailed run lives in; `procs_files` are what the run's first process joins."""

    version: int
    directories: list[Path]

    @classmethod
    def create(cls, memory_bytes: int, max_processes: int, uid: int) -> RunCgroup | None:
        """Make the run's cgroups with limits, joinable by `uid`; None when the host does not allow it."""
        name = uuid.uuid4().hex
        try:
            if _v2_available():
                return cls._create_v2(name, memory_bytes, max_processes, uid)
            if _v1_available():
                return cls._create_v1(name, memory_bytes, max_processes, uid)
        except OSError:
            _remove_partial(name)
        return None

    @classmethod
    def _create_v2(cls, name: str, memory_bytes: int, max_processes: int, uid: int) -> RunCgroup:
        parent = CGROUP_ROOT / GROUP_NAME
        if not parent.exists():
            parent.mkdir()
            _write(parent / "cgroup.subtree_control", "+memory +pids")
        directory = parent / name
        directory.mkdir()
        cgroup = cls(2, [directory])
        _write(directory / "memory.max", str(memory_bytes))
        _write(directory / "memory.swap.max", "0")
        _write(directory / "pids.max", str(max_processes))
        os.chown(directory / "cgroup.procs", uid, uid)
        return cgroup

    @classmethod
    def _create_v1(cls, name: str, memory_bytes: int, max_processes: int, uid: int) -> RunCgroup:
        directories = []
        for controller in V1_CONTROLLERS:
            directory = CGROUP_ROOT / controller / GROUP_NAME / name
            directory.mkdir(parents=True)
            directories.append(directory)
            os.chown(directory / "cgroup.procs", uid, uid)
        cgroup = cls(1, directories)
        memory, pids, _ = directories
        _write(memory / "memory.limit_in_bytes", str(memory_bytes))
        if (memory / "memory.memsw.limit_in_bytes").exists():  # no escaping the limit into swap
            _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
        _write(pids / "pids.max", str(max_processes))
        return cgroup

    @property
    def procs_files(self) -> list[str]:
        return [str(directory / "cgroup.procs") for directory in self.directories]

    def memory_exceeded(self) -> bool:
        """Whether the kernel OOM-killed a process of this run."""
        if self.version == 2:
            events = (self.directories[0] / "memory.events").read_text()
        else:
            events = (self.directories[0] / "memory.oom_control").read_text()
        counts = dict(line.split() for line in events.splitlines() if len(line.split()) == 2)
        return int(counts.get("oom_kill", "0")) > 0

    def cpu_time_s(self) -> float:
        if self.version == 2:
            stat = dict(line.split() for line in (self.directories[0] / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        return int((self.directories[2] / "cpuacct.usage").read_text()) / 1e9

    def pids(self) -> list[int]:
        return [int(pid) for pid in Path(self.procs_files[0]).read_text().split()]

    def kill(self) -> None:
        """SIGKILL every process left in the run's cgroup."""
        if self.version == 2 and (self.directories[0] / "cgroup.kill").exists():
            _write(self.directories[0] / "cgroup.kill", "1")
            return
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self, attempts: int = 50) -> None:
        """Kill what is left and delete the cgroup(s); dying processes need a moment to leave."""
        for _ in range(attempts):
            self.kill()
            try:
                for directory in self.directories:
                    if directory.exists():
                        directory.rmdir()
                return
            except OSError:
                time.sleep(0.01)
        raise OSError(f"cgroup {self.directories[0]} still has processes {self.pids()}")
