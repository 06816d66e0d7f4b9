"""The weight sync benchmark and the two-GPU benchmark options run on CPU at tiny size and print their figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(script: str, *flags: str) -> list[str]:
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / script), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout.splitlines()


@pytest.mark.slow
def test_weight_sync_benchmark_prints_disk_and_process_group_times_and_their_ratio():
    lines = run_benchmark("weight_sync.py", "--repeats", "2", "--bucket-mb", "1")
    assert lines[-4] == "state dict: 0.005 GB (float32) on cpu, shape tiny"
    assert re.fullmatch(r"disk: +median +[0-9.]+ ms +\([0-9.]+, [0-9.]+ ms\)", lines[-3])
    assert re.fullmatch(
        r"distributed: median +[0-9.]+ ms +\([0-9.]+, [0-9.]+ ms\); first sync, opening the group: [0-9.]+ ms",
        lines[-2],
    )
    assert re.fullmatch(r"ratio disk / distributed: [0-9.]+x", lines[-1])


def test_trainer_benchmark_runs_only_the_chosen_variants():
    lines = run_benchmark(
        "trainer_throughput.py", "--shapes", "tiny", "--device", "cpu", "--dtype", "float32", "--num-sequences", "2",
        "--sequence-length", "32", "--prompt-tokens", "8", "--micro-batch", "2", "--warmup", "1", "--steps", "1",
        "--variants", "checkpointing",
    )  # fmt: skip
    header = next(index for index, line in enumerate(lines) if line.startswith("variant"))
    assert lines[header - 1].endswith("1 rank(s)")
    assert [line.split("  ")[0] for line in lines[header + 1 :]] == ["chunked head, packed, checkpointing"]
    assert lines[header + 1].split()[-3] == "-"  # no 'previous' run to compare with
