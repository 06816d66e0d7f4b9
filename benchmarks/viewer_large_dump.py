"""Run viewer on a large step dump: first view against cached views, and start-up time.

Writes a run dir with one generated step dump (about 43 MB by default: 512 trajectories of
4 turns of 576 sampled tokens, ids of the bundled tiny policy), starts `python -m agentrl.viewer`
on it as a user does, and times page requests over HTTP. The step page's first request parses
the dump, which every request paid before the cache; later ones reuse the parse until the file
changes. The trajectory page's first request imports transformers and loads the tokenizer.
Start-up is timed against importing transformers, which the viewer does not do at start.

    python benchmarks/viewer_large_dump.py
    python benchmarks/viewer_large_dump.py --trajectories 1024 --repeats 10
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

VOCAB_SIZE = 900  # below the tiny policy's vocabulary, so every id decodes


def trajectory(rng: random.Random, group_id: int, num_turns: int, turn_tokens: int) -> dict[str, Any]:
    """A record shaped like Trajectory.to_json(): sampled turns with observations between them."""
    response_ids, loss_mask, logprobs, turns = [], [], [], []
    for number in range(num_turns):
        completion_ids = [rng.randrange(VOCAB_SIZE) for _ in range(turn_tokens)]
        observation_ids = [] if number == num_turns - 1 else [rng.randrange(VOCAB_SIZE) for _ in range(24)]
        response_ids += completion_ids + observation_ids
        loss_mask += [1] * len(completion_ids) + [0] * len(observation_ids)
        logprobs += [-rng.expovariate(3.0) for _ in completion_ids] + [0.0] * len(observation_ids)
        turns.append(
            {
                "action_text": "x" * turn_tokens,
                "completion_ids": completion_ids,
                "observation": [] if not observation_ids else [{"role": "user", "content": "Try again."}],
                "observation_ids": observation_ids,
                "reward": 0.0,
                "finish_reason": "stop",
                "policy_version": 3,
            }
        )
    reward = float(rng.random() < 0.5)
    return {
        "group_id": group_id, "prompt_ids": [rng.randrange(VOCAB_SIZE) for _ in range(200)],
        "response_ids": response_ids, "loss_mask": loss_mask, "rollout_logprobs": logprobs,
        "turns": turns, "reward": reward, "status": "completed", "error": None, "policy_version": 3,
        "num_template_mismatches": 0, "num_infra_retries": 0, "info": {"correct": reward == 1.0},
        "advantage": rng.uniform(-1.0, 1.0),
    }  # fmt: skip


def write_run(path: Path, num_trajectories: int, group_size: int, num_turns: int, turn_tokens: int) -> int:
    """The run dir; returns the dump's size in bytes."""
    rng = random.Random(0)
    (path / "rollouts").mkdir(parents=True)
    (path / "config.yaml").write_text("model:\n  path: tiny\nenv:\n  id: math\n")
    (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    dump = path / "rollouts" / "step_1.jsonl"
    with dump.open("w") as handle:
        for index in range(num_trajectories):
            handle.write(json.dumps(trajectory(rng, index // group_size, num_turns, turn_tokens)) + "\n")
    return dump.stat().st_size


def start_viewer(run_dir: Path) -> tuple[subprocess.Popen, str, float]:
    """The viewer as a subprocess, its URL, and seconds until it answered."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.perf_counter()
    command = [sys.executable, "-m", "agentrl.viewer", str(run_dir), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the viewer exited with {process.returncode}")
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=1).read()
            return process, url, time.perf_counter() - started
        except OSError:
            time.sleep(0.05)


def seconds_to_import(statement: str) -> tuple[float, bool]:
    """Seconds an import `statement` takes in a fresh interpreter, and whether transformers came with it."""
    code = (
        "import sys, time; started = time.perf_counter(); " + statement + "; "
        "print(time.perf_counter() - started, 'transformers' in sys.modules)"
    )
    seconds, imported = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    return float(seconds), imported == "True"


def seconds_to_get(url: str) -> float:
    started = time.perf_counter()
    urllib.request.urlopen(url, timeout=120).read()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=512)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=576, help="sampled tokens per turn")
    parser.add_argument("--repeats", type=int, default=5, help="cached views timed per page (median shown)")
    args = parser.parse_args()
    viewer_seconds, with_transformers = seconds_to_import("import agentrl.viewer.__main__")
    transformers_seconds, _ = seconds_to_import("from transformers import AutoTokenizer")
    print(
        f"import agentrl.viewer.__main__: {viewer_seconds:.2f} s (transformers imported: {with_transformers}); "
        f"from transformers import AutoTokenizer: {transformers_seconds:.2f} s; "
        f"ratio {transformers_seconds / viewer_seconds:.1f}x"
    )
    with tempfile.TemporaryDirectory() as root:
        run_dir = Path(root) / "big_run"
        size = write_run(run_dir, args.trajectories, args.group_size, args.turns, args.turn_tokens)
        print(
            f"dump: {size / 1e6:.1f} MB, {args.trajectories} trajectories, {args.turns} x {args.turn_tokens} sampled tokens each"
        )
        process, url, start_seconds = start_viewer(run_dir)
        try:
            print(f"start-up (process start to first answer): {start_seconds:.2f} s")
            pages = {
                "step page (first view parses the dump)": f"{url}/runs/big_run/train/1",
                "trajectory page (first view loads the tokenizer)": f"{url}/runs/big_run/train/1/5",
            }
            for name, page in pages.items():
                first = seconds_to_get(page)
                cached = statistics.median(seconds_to_get(page) for _ in range(args.repeats))
                print(
                    f"{name}: first view {first:.3f} s, cached {cached:.3f} s, ratio first/cached {first / cached:.1f}x"
                )
        finally:
            process.terminate()
            process.wait(timeout=10)


if __name__ == "__main__":
    main()
