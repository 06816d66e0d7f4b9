"""CPU use of the Docker backend's containers, for the admission (sandbox.admission).

A container's processes are children of the engine, not of the server, so the server cannot find
them among its descendants; it reads each container's cgroup instead: `cpuacct.usage` in the
cpuacct hierarchy on cgroup v1, `cpu.stat` in the unified hierarchy on v2, and `cgroup.procs`
(whose processes' states, in the host's /proc, say which are runnable) in both. The cgroup is
found from the container's init process (/proc/<pid>/cgroup) and this host's cgroup mounts
(/proc/self/mountinfo). Where that fails (an engine on another host or in another PID namespace,
cgroups not mounted here), `container_cgroup` returns None and the containers are not measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sandbox.admission import CpuUsage

PROC = Path("/proc")


@dataclass(frozen=True)
class ContainerCgroup:
    """The cgroup directory that accounts a container's CPU time, and its cgroup version."""

    directory: Path
    version: int

    def cpu_s(self) -> float:
        """CPU seconds used by the container's processes so far."""
        if self.version == 1:
            return int((self.directory / "cpuacct.usage").read_text()) / 1e9
        for line in (self.directory / "cpu.stat").read_text().splitlines():
            name, value = line.split()
            if name == "usage_usec":
                return int(value) / 1e6
        raise OSError(f"{self.directory / 'cpu.stat'} has no usage_usec")

    def num_runnable(self) -> int:
        """How many of the container's processes are running or ready to run (state R) now."""
        count = 0
        for pid in (self.directory / "cgroup.procs").read_text().split():
            try:
                stat = (PROC / pid / "stat").read_bytes()
            except OSError:  # it exited meanwhile
                continue
            state = stat[stat.rindex(b")") + 2 :][:1]  # after the command, which may hold spaces
            count += state == b"R"
        return count


def _cpu_mounts() -> list[tuple[int, Path, Path]]:
    """This host's cgroup mounts that account CPU time: (version, root within the hierarchy, mount
    point) of v1's cpuacct hierarchy and of the unified (v2) one."""
    mounts = []
    for line in (PROC / "self" / "mountinfo").read_text().splitlines():
        fields, _, after = line.partition(" - ")
        fstype, _source, options = after.split()[:3]
        root, mount_point = fields.split()[3:5]
        if fstype == "cgroup2" or (fstype == "cgroup" and "cpuacct" in options.split(",")):
            mounts.append((2 if fstype == "cgroup2" else 1, Path(root), Path(mount_point)))
    return mounts


def _cpu_memberships(init_pid: int) -> list[tuple[int, Path]]:
    """The cgroups of a process that account CPU time: (version, path within the hierarchy)."""
    memberships = []
    for line in (PROC / str(init_pid) / "cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            memberships.append((1, Path(path)))
        elif (hierarchy, controllers) == ("0", ""):
            memberships.append((2, Path(path)))
    return memberships


def container_cgroup(
    container_id: str, init_pid: int, versions: tuple[int, ...] = (1, 2)
) -> ContainerCgroup | None:
    """The cgroup accounting the CPU time of the container whose init is `init_pid` (as the engine
    reports it): its cpuacct cgroup on v1, else its unified (v2) one, the first of `versions` that
    this host has and can read. None where none is found, or the process's cgroup does not name the
    container (its pid is of another PID namespace than ours)."""
    try:
        memberships, mounts = _cpu_memberships(init_pid), _cpu_mounts()
    except OSError:
        return None
    for version in versions:
        for path in (path for kind, path in memberships if kind == version and container_id in str(path)):
            for root, mount_point in ((root, point) for kind, root, point in mounts if kind == version):
                if path.is_relative_to(root):
                    cgroup = ContainerCgroup(mount_point / path.relative_to(root), version)
                    if _readable(cgroup):
                        return cgroup
    return None


def _readable(cgroup: ContainerCgroup) -> bool:
    try:
        cgroup.cpu_s()
        cgroup.num_runnable()
    except (OSError, ValueError):
        return False
    return True


class CpuMeter:
    """Adds up the CPU time of a changing set of containers without going backwards: a container
    that is gone (recycled, removed) stays counted with its last reading."""

    def __init__(self, max_runnable_per_container: int) -> None:
        self.max_runnable_per_container = max_runnable_per_container  # a container's CPU quota, in cores
        self._last_cpu_s: dict[str, float] = {}
        self._gone_cpu_s = 0.0

    def usage(self, cgroups: Mapping[str, ContainerCgroup]) -> CpuUsage:
        """Read the containers now live (by container id); one caller at a time."""
        num_runnable = 0
        for container_id, cgroup in cgroups.items():
            try:
                self._last_cpu_s[container_id] = cgroup.cpu_s()
                # A container's processes beyond its quota wait for it, not for a core.
                num_runnable += min(cgroup.num_runnable(), self.max_runnable_per_container)
            except OSError:  # it is being removed: its last reading stands
                continue
        for container_id in self._last_cpu_s.keys() - cgroups.keys():
            self._gone_cpu_s += self._last_cpu_s.pop(container_id)
        return CpuUsage(self._gone_cpu_s + sum(self._last_cpu_s.values()), num_runnable)
