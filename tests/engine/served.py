"""`python -m agentrl.engine.serve` on the bundled tiny policy as a subprocess, for tests that talk to it over HTTP.

The server runs on the CPU with one thread (so its arithmetic matches an in-process engine's) on a port
the system picks, and prints its URL once it accepts requests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from agentrl.engine.serve.__main__ import LISTENING
from agentrl.tiny_policy import DEFAULT_MODEL_PATH

STOP_TIMEOUT_S = 30


def launch_served_engine(*extra_args: str) -> subprocess.Popen[str]:
    """Start a server with `extra_args` (e.g. `--strict-sglang`) without waiting for it to listen.

    Its stdout and stderr are merged into `process.stdout`, which `served_url` reads.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    command = [
        sys.executable,
        "-m",
        "agentrl.engine.serve",
        *extra_args,
        "--model",
        str(DEFAULT_MODEL_PATH),
        "--port",
        "0",
        "--device",
        "cpu",
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def served_url(process: subprocess.Popen[str]) -> str:
    """The URL the server prints once it accepts requests; fails the test with its output if it exits first."""
    lines = []
    for line in process.stdout:
        if line.startswith(LISTENING):
            return line.split()[len(LISTENING.split())]
        lines.append(line)
    status = process.wait()
    process.stdout.close()
    pytest.fail(f"the server exited with status {status} before listening:\n{''.join(lines)}")


def start_served_engine(*extra_args: str) -> tuple[subprocess.Popen[str], str]:
    """Start a server with `extra_args` and wait until it listens; the process and its URL."""
    process = launch_served_engine(*extra_args)
    return process, served_url(process)


def stop_served_engine(process: subprocess.Popen[str]) -> int:
    """Stop the server with SIGTERM, or SIGKILL if it outlives that; its exit status (0: a clean shutdown)."""
    process.send_signal(signal.SIGCONT)  # a test may have left it stopped
    process.terminate()
    try:
        status = process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # a receive the test abandoned holds it past SIGTERM (noted in docs)
        process.kill()
        status = process.wait()
    process.stdout.close()
    return status
