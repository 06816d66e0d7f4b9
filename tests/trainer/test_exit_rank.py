import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

RANK_SCRIPT = """
import atexit, io, os, sys
from pathlib import Path
import torch
import torch.distributed as dist
from agentrl.trainer.distributed import exit_rank

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
rank = dist.get_rank()
out = Path(sys.argv[1])
atexit.register(lambda: (out / f"atexit_{rank}").write_text(str(int(total.item()))))
# torchrun starts ranks unbuffered: buffer stdout, so that only a flush writes the line
sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
print(f"rank {rank} done")
exit_rank(int(sys.argv[2]))
"""


def run_ranks(tmp_path: Path, status: int) -> subprocess.CompletedProcess:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return subprocess.run(
        [*command, str(script), str(tmp_path), str(status)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_each_rank_runs_its_exit_handlers_and_flushes_its_output_before_exiting(tmp_path):
    completed = run_ranks(tmp_path, 0)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert sorted(completed.stdout.split("\n")) == ["", "rank 0 done", "rank 1 done"]
    for rank in (0, 1):
        assert (tmp_path / f"atexit_{rank}").read_text() == "2"


def test_a_rank_exits_with_the_status_it_is_given(tmp_path):
    completed = run_ranks(tmp_path, 3)
    assert completed.returncode != 0
    assert "exitcode  : 3" in completed.stderr


def test_without_a_process_group_it_is_a_plain_exit():
    completed = subprocess.run(
        [sys.executable, "-c", "from agentrl.trainer.distributed import exit_rank; exit_rank(4)"],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 4
