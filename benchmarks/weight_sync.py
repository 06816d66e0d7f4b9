"""Weight sync to a served engine: a checkpoint through disk against a broadcast over a process group.

The trainer is this process; the engine is a `python -m agentrl.engine.serve` process of its own
(on GPU: on its own card, `--engine-gpu`), both holding a random-weight model of `--shape`
(built from a config, no download). Measured in the same run, each `--repeats` times after one
untimed sync, the median reported, end to end as the trainer's loop sees it (the server
answers, then reports the new weight_version):

- disk (`engine.weight_sync=disk`): the state dict exported as a Hugging Face checkpoint, the
  server loading it (`/update_weights_from_disk`);
- distributed (`engine.weight_sync=distributed`): the state dict broadcast from the trainer's
  device over NCCL (GPU) or gloo (CPU) in `--bucket-mb` buckets (`/update_weights_from_distributed`).
  Opening the group (`/init_weights_update_group`) happens once per run: it is timed apart.

CPU:  python benchmarks/weight_sync.py
GPU (two cards of one host):  python benchmarks/weight_sync.py --shape 1.5b --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from engine_throughput import build_model, save_checkpoint

from agentrl.engine.remote.sglang_client import SGLangEngine
from agentrl.engine.remote.weight_sender import DistributedSyncSettings
from agentrl.engine.serve.__main__ import LISTENING

SHAPES = {"tiny": "tiny", "0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def start_server(checkpoint: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """The engine server on its own device; its URL once it listens."""
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    if args.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(args.engine_gpu)  # one process per GPU
    command = [
        sys.executable, "-m", "agentrl.engine.serve", "--model", str(checkpoint), "--port", "0",
        "--device", args.device, "--dtype", args.dtype, "--max-batch-size", "4", "--prefix-cache-bytes", "0",
        "--no-cuda-graphs",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith(LISTENING):
            return process, line.split()[len(LISTENING.split())]
    process.wait()
    raise SystemExit(f"the engine server exited before listening:\n{''.join(output[-40:])}")


async def time_syncs(
    engine: SGLangEngine, state_dict: dict[str, torch.Tensor], repeats: int, first_version: int
) -> tuple[float, list[float]]:
    """Seconds of the first sync (untimed in the median), then of each of `repeats` more."""
    seconds = []
    for index in range(repeats + 1):
        started = time.perf_counter()
        await engine.update_weights(state_dict, version=first_version + index)
        seconds.append(time.perf_counter() - started)
    return seconds[0], seconds[1:]


async def measure(
    url: str, checkpoint: Path, state_dict: dict[str, torch.Tensor], args: argparse.Namespace
) -> None:
    num_bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in state_dict.values()}.values())
    print(f"state dict: {num_bytes / 1e9:.3f} GB ({args.dtype}) on {args.device}, shape {args.shape}")
    with tempfile.TemporaryDirectory(prefix="weight-sync-") as weights_dir:
        disk = SGLangEngine(url, model_path=str(checkpoint), dtype=args.dtype, weights_dir=weights_dir)
        settings = DistributedSyncSettings(bucket_bytes=args.bucket_mb << 20, timeout_s=args.timeout)
        group = SGLangEngine(url, model_path=str(checkpoint), dtype=args.dtype, distributed_sync=settings)
        try:
            _, disk_seconds = await time_syncs(disk, state_dict, args.repeats, first_version=1)
            opening, group_seconds = await time_syncs(group, state_dict, args.repeats, first_version=1000)
        finally:
            await disk.close()
            await group.close()
    disk_median, group_median = statistics.median(disk_seconds), statistics.median(group_seconds)
    print(f"disk:        median {disk_median * 1e3:9.1f} ms  ({milliseconds(disk_seconds)})")
    print(
        f"distributed: median {group_median * 1e3:9.1f} ms  ({milliseconds(group_seconds)}); "
        f"first sync, opening the group: {opening * 1e3:.1f} ms"
    )
    print(f"ratio disk / distributed: {disk_median / group_median:.1f}x")


def milliseconds(samples: list[float]) -> str:
    return ", ".join(f"{s * 1e3:.1f}" for s in samples) + " ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="tiny")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--repeats", type=int, default=3, help="timed syncs per path, after one untimed")
    parser.add_argument("--bucket-mb", type=int, default=512, help="engine.weight_sync_bucket_bytes in MiB")
    parser.add_argument("--timeout", type=float, default=120.0, help="engine.weight_sync_timeout_s")
    parser.add_argument("--trainer-gpu", type=int, default=0, help="cuda: the trainer's card (this process)")
    parser.add_argument("--engine-gpu", type=int, default=1, help="cuda: the engine server's card")
    args = parser.parse_args()
    if args.device == "cuda" and args.trainer_gpu == args.engine_gpu:
        parser.error("--trainer-gpu and --engine-gpu must differ: one process per GPU")
    device = f"cuda:{args.trainer_gpu}" if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(device)
    model = build_model(SHAPES[args.shape], device, DTYPES[args.dtype])
    with tempfile.TemporaryDirectory(prefix="weight-sync-model-") as directory:
        save_checkpoint(model, Path(directory), args.dtype)
        process, url = start_server(Path(directory), args)
        try:
            asyncio.run(measure(url, Path(directory), model.state_dict(), args))
        finally:
            process.terminate()
            process.wait(timeout=60)


if __name__ == "__main__":
    main()
