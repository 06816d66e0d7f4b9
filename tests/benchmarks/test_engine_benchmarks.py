import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--model", "tiny", "--device", "cpu", "--num-requests", "8", "--prompt-tokens", "8", "24",
         "--new-tokens", "4", "12"]  # fmt: skip


def run_benchmark(script: str, *flags: str) -> list[str]:
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / script), *SMALL, *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout.splitlines()


@pytest.mark.parametrize("profile", [None, "--profile", "--profile-host"], ids=["plain", "profiled", "host"])
def test_single_turn_benchmark_prints_its_ratios_and_roofline_and_profiles_when_asked(profile):
    lines = run_benchmark("engine_throughput.py", "--static-reference", *([profile] if profile else []))
    assert re.fullmatch(r"ratio engine / baseline: [0-9.]+x", lines[-3])
    assert re.fullmatch(r"ratio engine / static reference: [0-9.]+x", lines[-2])
    assert re.fullmatch(r"memory roofline: .* engine at [0-9.]+% of it", lines[-1])
    engine_row = next(line for line in lines if line.startswith("engine (continuous batching)"))
    assert engine_row.split()[3:5] == ["8", "requests"]
    sync = r"weight sync: [0-9.]+ GB state dict on cpu, one update: [0-9.]+ ms end to end, [0-9.]+ ms copying in place"
    assert sum(re.fullmatch(sync, line) is not None for line in lines) == 1
    profiles = [line for line in lines if line.startswith("profile: ")]
    assert len(profiles) == (1 if profile else 0)
    assert all(line.endswith("no GPU kernels recorded (CPU run)") for line in profiles)


def test_multi_turn_benchmark_profiles_both_engine_runs_without_changing_what_it_measures():
    plain = run_benchmark("engine_multiturn.py")
    profiled = run_benchmark("engine_multiturn.py", "--profile")

    def calls_and_tokens(lines: list[str]) -> list[list[str]]:
        """Each measured row's name, calls and tokens (the profiled run must not add turns to them)."""
        rows = [line for line in lines if re.search(r" \d+ calls ", line)]
        return [re.match(r"(.*?)\s+(\d+) calls\s+(\d+) tokens", row).groups() for row in rows]

    assert calls_and_tokens(plain) == calls_and_tokens(profiled)
    assert [row[1] for row in calls_and_tokens(plain)] == [
        "24"
    ] * 3  # 8 episodes x 3 turns, each measured once
    assert any(line.startswith("ratio prefix cache on / static generate(): ") for line in profiled)
    assert len([line for line in profiled if line.startswith("profile: ")]) == 2
    assert len([line for line in plain if line.startswith("profile: ")]) == 0


def test_repeated_rounds_report_the_median_round_of_the_engine_and_print_every_round():
    lines = run_benchmark("engine_throughput.py", "--repeats", "3")
    rounds = [line for line in lines if line.startswith("engine (continuous batching): 3 timed rounds at ")]
    assert len(rounds) == 1
    speeds = sorted(float(s.replace(",", "")) for s in re.findall(r"[\d,]+(?=[,;] | tokens/s)", rounds[0]))
    assert len(speeds) == 3
    engine_row = next(line for line in lines if line.startswith("engine (continuous batching) "))
    reported = float(engine_row.split()[-4])  # "... <seconds> s <tokens/s> tokens/s <passes> passes"
    assert abs(reported - speeds[1]) <= 0.5 + 1e-3 * speeds[1]  # the printed speeds are rounded
    # Weight sync is timed as often as the rounds: the median update, within the range printed.
    sync = next(line for line in lines if line.startswith("weight sync: "))
    number = r"([0-9.]+)"
    match = re.fullmatch(
        rf"weight sync: {number} GB state dict on cpu, 3 updates, median: {number} ms \({number}-{number}\) "
        rf"end to end, {number} ms \({number}-{number}\) copying in place",
        sync,
    )
    assert match is not None, sync
    _, median, low, high, copy_median, copy_low, copy_high = map(float, match.groups())
    assert low <= median <= high and copy_low <= copy_median <= copy_high
    multi = run_benchmark("engine_multiturn.py", "--repeats", "2")
    for state in ("on", "off"):
        assert (
            sum(line.startswith(f"engine, prefix cache {state}: 2 timed rounds at ") for line in multi) == 1
        )
    cached = next(
        line for line in multi if line.startswith("engine, prefix cache on: ") and "read from" in line
    )
    assert cached == next(
        line for line in run_benchmark("engine_multiturn.py") if line.startswith("engine, prefix cache on: ")
    )  # each round starts from an empty cache: what it reads from it does not change with repeats


def test_a_repeat_count_below_one_is_refused_by_name():
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "engine_throughput.py"), "--repeats", "0"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 2 and "--repeats: must be 1 or more, got 0" in completed.stderr


def test_the_qwen3_shape_is_a_qwen3_model_whose_roofline_reads_its_explicit_head_size():
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import engine_throughput

    model = engine_throughput.build_model("qwen3-0.6b", "meta", torch.bfloat16)  # shapes only, no memory
    assert type(model).__name__ == "Qwen3ForCausalLM"
    roofline = engine_throughput.roofline_of(model, "cpu")
    # 28 layers x keys and values x 8 heads x 128 (not hidden size 1,024 / 16 heads = 64) x 2 bytes.
    assert roofline.kv_bytes_per_token == 28 * 2 * 8 * 128 * 2
    assert roofline.weight_bytes == 596_049_920 * 2  # the tied embedding counted once
