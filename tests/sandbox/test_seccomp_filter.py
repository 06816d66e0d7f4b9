"""The seccomp filter's two forms (a Docker profile, BPF exported for bwrap) come from one list."""

from __future__ import annotations

import errno
import json
from pathlib import Path

from sandbox.backends.seccomp_filter import DENIED_SYSCALLS, bwrap_filter, docker_profile


def test_the_docker_profile_denies_every_listed_call_with_eperm() -> None:
    profile = json.loads(docker_profile())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert profile["syscalls"] == [
        {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    ]


def test_the_bwrap_filter_is_exported_once_and_reused(tmp_path: Path) -> None:
    first = bwrap_filter(tmp_path)
    modified = first.stat().st_mtime_ns
    # A BPF program is a whole number of 8-byte instructions.
    assert (first.stat().st_size % 8, first.stat().st_size > 0) == (0, True)
    assert (bwrap_filter(tmp_path), bwrap_filter(tmp_path).stat().st_mtime_ns) == (first, modified)
