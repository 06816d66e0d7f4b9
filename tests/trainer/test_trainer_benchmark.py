import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_trainer_benchmark_runs_every_variant_on_cpu_and_prints_ratios_to_the_previous_path():
    command = [
        sys.executable, str(REPO_ROOT / "benchmarks" / "trainer_throughput.py"), "--shapes", "tiny",
        "--device", "cpu", "--dtype", "float32", "--num-sequences", "4", "--sequence-length", "32",
        "--prompt-tokens", "8", "--micro-batch", "2", "--steps", "1",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [line for line in completed.stdout.splitlines() if line.endswith("x")]
    assert [row.split("  ")[0] for row in rows] == [
        "previous: full logits, padded",
        "chunked head, packed",
        "chunked head, packed, checkpointing",
        "chunked head, packed, compiled",
        "chunked head, packed, checkpointing, compiled",
    ]
    assert rows[0].endswith("1.00x")
