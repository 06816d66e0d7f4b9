"""Run viewer: what a run directory holds, read from disk and parsed once per version of a file.

A run dir has config.yaml, metrics.jsonl (one JSON object per step) and rollouts/step_N.jsonl
(training step N) and rollouts/val_step_N.jsonl (evaluation at step N), one trajectory per line
as `Trajectory.to_json()` writes it. Every request looks at the files again, so a run that is
still training shows its new steps on the next request; a file is parsed again only when its
modification time or size changed. A dump is kept as one small summary per trajectory plus
where its line starts, and a trajectory page parses that one line. A directory without those
files is a folder of runs: its subdirectories that are runs are listed, including ones that
appear later.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml

ROLLOUT_FILE = re.compile(r"^(val_)?step_(\d+)\.jsonl$")
SPLITS = ("train", "val")
Parsed = TypeVar("Parsed")


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


@dataclass(frozen=True, slots=True)
class TrajectoryRecord:
    """One dumped trajectory with the fields the step page shows; `read_record` gives all of it."""

    index: int  # line number in its rollout file
    group_id: int
    status: str
    reward: float
    advantage: float | None  # present once the training loop has computed it
    num_turns: int
    num_sampled_tokens: int  # tokens with loss mask 1
    offset: int  # where its line starts in the file, in bytes
    length: int  # bytes of its line


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


class ParsedFiles(Generic[Parsed]):
    """What `parse` made of each file, kept while the file's modification time and size stay the same.

    One entry per file (a new version replaces the old one); the least recently read files go
    first once more than `max_files` are kept.
    """

    def __init__(self, parse: Callable[[Path], Parsed], max_files: int) -> None:
        self.parse = parse
        self.max_files = max_files
        self.num_parses = 0
        self._entries: OrderedDict[Path, tuple[tuple[int, int], Parsed]] = OrderedDict()

    def read(self, path: Path) -> Parsed:
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size)
        entry = self._entries.get(path)
        if entry is None or entry[0] != version:
            entry = (version, self.parse(path))
            self.num_parses += 1
            self._entries[path] = entry
        self._entries.move_to_end(path)
        while len(self._entries) > self.max_files:
            self._entries.popitem(last=False)
        return entry[1]


def _lines(path: Path) -> list[tuple[int, bytes]]:
    """(offset, line) for every line of the file."""
    lines, offset = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        lines.append((offset, line))
        offset += len(line)
    return lines


def _parse_metrics(path: Path) -> tuple[dict[str, Any], ...]:
    records = []
    for _, line in _lines(path):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the trainer is appending this line right now
            continue
    return tuple(records)


def read_metrics(run: Run) -> tuple[dict[str, Any], ...]:
    """One dict per logged step, in file order; a line still being written is skipped.

    The dicts are shared between requests: read them, never change them.
    """
    path = run.path / "metrics.jsonl"
    return METRICS.read(path) if path.exists() else ()


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


def _parse_dump(path: Path) -> tuple[TrajectoryRecord, ...]:
    """Summaries of every complete line of a dump."""
    trajectories = []
    for index, (offset, line) in enumerate(_lines(path)):
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
                offset=offset,
                length=len(line),
            )
        )
    return tuple(trajectories)


def read_trajectories(rollouts: RolloutFile) -> tuple[TrajectoryRecord, ...]:
    """The dump's trajectories, parsed on the first request after the file last changed."""
    return DUMPS.read(rollouts.path)


def read_record(rollouts: RolloutFile, trajectory: TrajectoryRecord) -> dict[str, Any]:
    """The full JSON of one trajectory (`Trajectory.to_json()`), read from its line alone."""
    with rollouts.path.open("rb") as handle:
        handle.seek(trajectory.offset)
        line = handle.read(trajectory.length)
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        raise ValueError(
            f"{rollouts.path} changed while it was read (trajectory {trajectory.index}): reload the page"
        ) from None


# A dump's summaries take about 200 bytes a trajectory; a metrics file is kept whole.
DUMPS = ParsedFiles(_parse_dump, max_files=256)
METRICS = ParsedFiles(_parse_metrics, max_files=32)


def run_version(run: Run) -> str:
    """Changes whenever the run writes a step or a dump: what a live page polls for."""
    parts = []
    for path in [run.path / "metrics.jsonl", *(f.path for f in rollout_files(run))]:
        if path.exists():
            stat = path.stat()
            parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return "|".join(parts)
