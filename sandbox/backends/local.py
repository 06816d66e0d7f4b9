"""The unsafe-local backend: runs programs directly on the host with rlimits and no jail at all.

Only for machines where nothing else works and the code is trusted; it is never chosen by
"auto". The program can read and write everything the server's user can, and reach the network.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

from sandbox.backends.base import Limits, ProcessResult, SandboxFailure
from sandbox.backends.bwrap import EXTRA_PROCESSES
from sandbox.backends.process import collect_process
from sandbox.backends.rlimits import rlimit_argv

# The judge becomes the init of a user and PID namespace of its own (--fork: `python3` may be a
# launcher script that forks before it execs the interpreter), which its children cannot signal.
JUDGE_NAMESPACES_ARGV = ("unshare", "--user", "--map-current-user", "--pid", "--fork", "--kill-child", "--")
WARNING = (
    "\n" + "!" * 78 + "\n"
    "!!  sandbox backend 'unsafe-local': untrusted code runs UNJAILED on this host, as this\n"
    "!!  user, with network access. Use it only for code you would run yourself.\n" + "!" * 78 + "\n"
)


class LocalSession:
    """A temp dir the program runs in; it is /work only by convention (no mount)."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir

    async def write_files(self, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"file name {name!r} must be a plain name inside the work dir")
            (self.work_dir / name).write_bytes(data)

    async def run(
        self, argv: list[str], stdin: bytes, limits: Limits, judge_process: bool = False
    ) -> ProcessResult:
        # Programs address their files as /work/...; here that directory is the session dir.
        argv = [arg.replace("/work/", f"{self.work_dir}/") for arg in argv]
        if judge_process:
            argv = [*JUDGE_NAMESPACES_ARGV, *argv]
        try:
            process = await asyncio.create_subprocess_exec(
                *rlimit_argv(limits, limits.max_processes + EXTRA_PROCESSES),
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.work_dir,
                start_new_session=True,
                env={
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "HOME": str(self.work_dir),
                    "LANG": "C.UTF-8",
                },
            )
        except OSError as error:
            raise SandboxFailure(f"cannot start {argv[0]}: {error}") from error
        return await collect_process(process, stdin, limits, cgroup=None)

    async def close(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.work_dir, ignore_errors=True)


class LocalBackend:
    """No isolation: the explicitly unsafe choice. Prints a loud warning when created."""

    name = "unsafe-local"

    @classmethod
    async def create(cls) -> LocalBackend:
        print(WARNING, file=sys.stderr, flush=True)
        return cls()

    async def open_session(self) -> LocalSession:
        return LocalSession(Path(tempfile.mkdtemp(prefix="sandbox-unsafe-local-")))

    async def close(self) -> None:
        """Nothing is pooled."""
