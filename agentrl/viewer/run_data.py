"""Run viewer: what a run directory holds, read fresh from disk on every request.

A run dir has config.yaml, metrics.jsonl (one JSON object per step) and rollouts/step_N.jsonl
(training step N) and rollouts/val_step_N.jsonl (evaluation at step N), one trajectory per line
as `Trajectory.to_json()` writes it. Nothing is cached, so a run that is still training shows
its new steps on the next request. A directory without those files is a folder of runs: its
subdirectories that are runs are listed, including ones that appear later.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROLLOUT_FILE = re.compile(r"^(val_)?step_(\d+)\.jsonl$")
SPLITS = ("train", "val")


@dataclass(frozen=True)
class Run:
    """One run directory and the id the viewer's URLs use for it."""

    run_id: str
    path: Path


@dataclass(frozen=True)
class RolloutFile:
    """One dump of trajectories: a training step's or an evaluation's."""

    step: int
    split: str  # train | val
    path: Path


@dataclass(frozen=True)
class TrajectoryRecord:
    """One dumped trajectory with the fields the viewer shows; `record` is the raw JSON."""

    index: int  # line number in its rollout file
    group_id: int
    status: str
    reward: float
    advantage: float | None  # present once the training loop has computed it
    num_turns: int
    num_sampled_tokens: int  # tokens with loss mask 1
    record: dict[str, Any]


def is_run_dir(path: Path) -> bool:
    return any((path / name).exists() for name in ("config.yaml", "metrics.jsonl", "rollouts"))


def discover_runs(roots: list[Path]) -> list[Run]:
    """Runs under the given paths (each a run dir or a folder of them), with unique ids."""
    paths: list[Path] = []
    for root in roots:
        if is_run_dir(root):
            paths.append(root)
        elif root.is_dir():
            paths += sorted(child for child in root.iterdir() if child.is_dir() and is_run_dir(child))
    runs, seen = [], set()
    for path in paths:
        run_id = path.name or "run"
        while run_id in seen:  # two runs with the same folder name in different places
            run_id = f"{path.parent.name}-{run_id}" if path.parent.name else f"{run_id}-2"
        seen.add(run_id)
        runs.append(Run(run_id, path))
    return runs


def read_metrics(run: Run) -> list[dict[str, Any]]:
    """One dict per logged step, in file order; a line still being written is skipped."""
    path = run.path / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the trainer is appending this line right now
            continue
    return records


def read_config(run: Run) -> dict[str, Any]:
    path = run.path / "config.yaml"
    if not path.exists():
        return {}
    return yaml.safe_load(path.read_text()) or {}


def rollout_files(run: Run) -> list[RolloutFile]:
    """Every dumped step, ordered by step then split."""
    folder = run.path / "rollouts"
    files = []
    for path in folder.glob("*.jsonl") if folder.is_dir() else []:
        match = ROLLOUT_FILE.match(path.name)
        if match:
            files.append(RolloutFile(int(match.group(2)), "val" if match.group(1) else "train", path))
    return sorted(files, key=lambda f: (f.step, SPLITS.index(f.split)))


def rollout_file(run: Run, step: int, split: str) -> RolloutFile | None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    name = f"{'val_' if split == 'val' else ''}step_{step}.jsonl"
    path = run.path / "rollouts" / name
    return RolloutFile(step, split, path) if path.exists() else None


def read_trajectories(rollouts: RolloutFile) -> list[TrajectoryRecord]:
    trajectories = []
    for index, line in enumerate(rollouts.path.read_text().splitlines()):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a dump being written
            continue
        trajectories.append(
            TrajectoryRecord(
                index=index,
                group_id=int(record["group_id"]),
                status=str(record["status"]),
                reward=float(record["reward"]),
                advantage=None if record.get("advantage") is None else float(record["advantage"]),
                num_turns=len(record.get("turns", [])),
                num_sampled_tokens=sum(record.get("loss_mask", [])),
                record=record,
            )
        )
    return trajectories


def run_version(run: Run) -> str:
    """Changes whenever the run writes a step or a dump: what a live page polls for."""
    parts = []
    for path in [run.path / "metrics.jsonl", *(f.path for f in rollout_files(run))]:
        if path.exists():
            stat = path.stat()
            parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return "|".join(parts)
