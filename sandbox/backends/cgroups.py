"""Per-session cgroups for the bubblewrap backend: total memory, process count, CPU time, kill-all.

One cgroup per session, reused by every run of that session (making and removing one per run
costs more than the run's accounting): before each run it is checked empty and its limits set;
a `CgroupRun` measures one run as the difference of the cumulative counters.

Optional: `SessionCgroup.create` returns None where the host does not let us create cgroups, and
the backend then relies on rlimits and the PID namespace alone. Supports cgroup v2 (unified,
with the memory and pids controllers enabled) and cgroup v1 (memory, pids, cpuacct hierarchies).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_NAME = "sandbox-bwrap"
V1_CONTROLLERS = ("memory", "pids", "cpuacct")
SETTLE_ATTEMPTS = 50
SETTLE_WAIT_S = 0.01  # a killed process needs a moment to leave its cgroup


def _v2_available() -> bool:
    controllers = CGROUP_ROOT / "cgroup.controllers"
    return controllers.exists() and {"memory", "pids"} <= set(controllers.read_text().split())


def _v1_available() -> bool:
    return all((CGROUP_ROOT / controller / "cgroup.procs").exists() for controller in V1_CONTROLLERS)


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _remove_partial(name: str) -> None:
    """Undo a half-made cgroup: empty dirs only, so rmdir is enough."""
    for parent in [CGROUP_ROOT, *(CGROUP_ROOT / controller for controller in V1_CONTROLLERS)]:
        directory = parent / GROUP_NAME / name
        if directory.is_dir():
            directory.rmdir()


@dataclass
class SessionCgroup:
    """The cgroup(s) of one session; `procs_files` are what each run's first process joins."""

    version: int
    directories: list[Path]
    _limits: tuple[int, int] | None = field(default=None, repr=False)  # (memory bytes, processes) set now

    @classmethod
    def create(cls, uid: int) -> SessionCgroup | None:
        """Make the session's cgroups, joinable by `uid`; None when the host does not allow it."""
        name = uuid.uuid4().hex
        try:
            if _v2_available():
                return cls._create_v2(name, uid)
            if _v1_available():
                return cls._create_v1(name, uid)
        except OSError:
            _remove_partial(name)
        return None

    @classmethod
    def _create_v2(cls, name: str, uid: int) -> SessionCgroup:
        parent = CGROUP_ROOT / GROUP_NAME
        if not parent.exists():
            parent.mkdir()
            _write(parent / "cgroup.subtree_control", "+memory +pids")
        directory = parent / name
        directory.mkdir()
        _write(directory / "memory.swap.max", "0")
        os.chown(directory / "cgroup.procs", uid, uid)
        return cls(2, [directory])

    @classmethod
    def _create_v1(cls, name: str, uid: int) -> SessionCgroup:
        directories = []
        for controller in V1_CONTROLLERS:
            directory = CGROUP_ROOT / controller / GROUP_NAME / name
            directory.mkdir(parents=True)
            directories.append(directory)
            os.chown(directory / "cgroup.procs", uid, uid)
        return cls(1, directories)

    @property
    def procs_files(self) -> list[str]:
        return [str(directory / "cgroup.procs") for directory in self.directories]

    def start_run(self, memory_bytes: int, max_processes: int) -> CgroupRun:
        """Make sure nothing of an earlier run is left, set this run's limits and start measuring.

        Raises OSError when the cgroup cannot serve the run exactly (use a fresh one): an earlier
        run's zombie still counts against the pids limit until the host's init reaps it.
        """
        self.settle()
        pids_dir = self.directories[0] if self.version == 2 else self.directories[1]
        if (lingering := int((pids_dir / "pids.current").read_text())) > 0:
            raise OSError(f"{lingering} exited processes of an earlier run still count against pids.max")
        if self._limits != (memory_bytes, max_processes):
            self._set_limits(memory_bytes, max_processes)
            self._limits = (memory_bytes, max_processes)
        return CgroupRun(self, self.cpu_time_s(), self.oom_kills())

    def _set_limits(self, memory_bytes: int, max_processes: int) -> None:
        if self.version == 2:
            memory, pids = self.directories[0], self.directories[0]
            _write(memory / "memory.max", str(memory_bytes))
        else:
            memory, pids, _ = self.directories
            # memsw (memory + swap) may never be below the memory limit: order the two writes
            memsw = memory / "memory.memsw.limit_in_bytes"
            current = int((memory / "memory.limit_in_bytes").read_text())
            names = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
            for name in names if memory_bytes < current else reversed(names):
                if name == "memory.limit_in_bytes" or memsw.exists():  # no escaping into swap
                    _write(memory / name, str(memory_bytes))
        _write(pids / "pids.max", str(max_processes))

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this cgroup so far."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        events = (self.directories[0] / name).read_text()
        counts = dict(line.split() for line in events.splitlines() if len(line.split()) == 2)
        return int(counts.get("oom_kill", "0"))

    def cpu_time_s(self) -> float:
        """CPU time used by this cgroup's processes so far."""
        if self.version == 2:
            stat = dict(line.split() for line in (self.directories[0] / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        return int((self.directories[2] / "cpuacct.usage").read_text()) / 1e9

    def pids(self) -> list[int]:
        return [int(pid) for pid in Path(self.procs_files[0]).read_text().split()]

    def kill(self) -> None:
        """SIGKILL every process in the cgroup."""
        if self.version == 2 and (self.directories[0] / "cgroup.kill").exists():
            _write(self.directories[0] / "cgroup.kill", "1")
            return
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def settle(self) -> None:
        """Return once the cgroup is empty, killing whatever is left; raise OSError if it stays busy."""
        for _ in range(SETTLE_ATTEMPTS):
            if not self.pids():
                return
            self.kill()
            time.sleep(SETTLE_WAIT_S)
        raise OSError(f"cgroup {self.directories[0]} still has processes {self.pids()}")

    def remove(self) -> None:
        """Kill what is left and delete the cgroup(s)."""
        self.settle()
        for _ in range(SETTLE_ATTEMPTS):
            try:
                for directory in self.directories:
                    if directory.exists():
                        directory.rmdir()
                return
            except OSError:  # a process that just exited may still be counted for a moment
                time.sleep(SETTLE_WAIT_S)
        raise OSError(f"cannot remove cgroup {self.directories[0]}")


@dataclass(frozen=True)
class CgroupRun:
    """One run in a session's cgroup: its CPU time and OOM kills are the counters' growth since it began."""

    cgroup: SessionCgroup
    cpu_start_s: float
    oom_kills_start: int

    def kill(self) -> None:
        self.cgroup.kill()

    def cpu_time_s(self) -> float:
        return self.cgroup.cpu_time_s() - self.cpu_start_s

    def memory_exceeded(self) -> bool:
        """Whether the kernel OOM-killed a process of this run."""
        return self.cgroup.oom_kills() > self.oom_kills_start
