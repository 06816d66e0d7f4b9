"""A local Ray instance for the launcher tests that start actors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    """One local Ray instance for the module: starting one costs seconds on two cores.

    The head is started by Ray's command line, not by `ray.init()` in this process: Ray forks its
    servers with a preexec hook, and late in a long test session this large process cannot fork.
    """
    ray_cli = str(Path(sys.executable).with_name("ray"))
    started = subprocess.run(
        [ray_cli, "start", "--head", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
        check=False, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        ray.init(address="auto")
        yield
    finally:
        ray.shutdown()
        subprocess.run([ray_cli, "stop", "--force"], check=False, capture_output=True, timeout=120)
