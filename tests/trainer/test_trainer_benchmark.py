import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_benchmark():
    if str(REPO_ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # as when run as a script: its helpers beside it
    spec = importlib.util.spec_from_file_location(
        "trainer_throughput", REPO_ROOT / "benchmarks" / "trainer_throughput.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "flags", [["--profile"], ["--varied-lengths"]], ids=["same_lengths_profiled", "varied_lengths"]
)
def test_trainer_benchmark_runs_every_variant_on_cpu_and_prints_ratios_to_the_previous_path(flags):
    command = [
        sys.executable, str(REPO_ROOT / "benchmarks" / "trainer_throughput.py"), "--shapes", "tiny",
        "--device", "cpu", "--dtype", "float32", "--num-sequences", "4", "--sequence-length", "32",
        "--prompt-tokens", "8", "--micro-batch", "2", "--steps", "1", *flags,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    header = next(index for index, line in enumerate(lines) if line.startswith("variant"))
    assert lines[header].split()[-4:] == ["compiling", "updates", "alloc", "retries"]
    rows = lines[header + 1 : header + 6]
    assert [row.split("  ")[0] for row in rows] == [
        "previous: full logits, padded",
        "chunked head, packed",
        "chunked head, packed, checkpointing",
        "chunked head, packed, compiled",
        "chunked head, packed, checkpointing, compiled",
    ]
    ratios = [row.split()[-3] for row in rows]
    assert ratios[0] == "1.00x" and all(ratio.endswith("x") for ratio in ratios)
    # One timed update (--steps 1) each; the CPU has no caching allocator to retry.
    assert all(row.split()[-2] in ("0", "1") and row.split()[-1] == "0" for row in rows)
    profiles = [line for line in lines if line.startswith("profile: ")]
    if "--profile" in flags:  # one more update of each variant, under the profiler
        assert len(profiles) == 5
        assert all(line.endswith("no GPU kernels recorded (CPU run)") for line in profiles)
    else:
        assert profiles == []


def test_varied_lengths_batches_mask_padding_and_prompts_and_count_attention_per_sequence():
    benchmark = load_benchmark()
    args = argparse.Namespace(num_sequences=3, sequence_length=10, prompt_tokens=4, varied_lengths=True)
    batch = benchmark.random_batch(args, vocab_size=50, seed=1)
    lengths = batch.attention_mask.sum(dim=-1)
    assert ((lengths > 4) & (lengths <= 10)).all()
    for row, length in enumerate(lengths.tolist()):
        assert batch.attention_mask[row].tolist() == [1] * length + [0] * (10 - length)
        assert batch.loss_mask[row].tolist() == [0.0] * 4 + [1.0] * (length - 4) + [0.0] * (10 - length)
        assert (batch.input_ids[row, length:] == 0).all() and (batch.input_ids[row, :length] >= 3).all()
    assert benchmark.random_batch(args, 50, seed=2).attention_mask.sum(dim=-1).tolist() != lengths.tolist()
    config = argparse.Namespace(
        hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=16, vocab_size=50,
    )  # fmt: skip
    per_layer = 2 * 8 * 8 + 2 * 8 * 4 + 3 * 8 * 16
    expected = (
        6 * 2 * per_layer * float(lengths.sum())
        + 6 * 2 * 8 * float((lengths.double() ** 2).sum())
        + 6 * 8 * 50 * float(batch.loss_mask.sum())
    )
    assert benchmark.model_flops(config, batch) == pytest.approx(expected, rel=1e-12)
    assert torch.equal(batch.advantages != 0, batch.loss_mask != 0)
