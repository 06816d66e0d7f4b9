"""Training stage persistence: atomic, resumable checkpoints of the policy and the loop's state.

Layout under `run_dir/checkpoints/`:

    step_000042/          a complete checkpoint (renamed into place only once fully written)
        state/            model + optimizer, torch.distributed.checkpoint format (sharded writes)
        trainer_state.json    the training loop's own state (step counters, data cursor, ...)
        worker_state.json     learning-rate scheduler position
        rng_rank{r}.json      RNG states of rank r (python, numpy, torch, cuda)
    step_000043.tmp/      a save in progress, or the leftover of a process killed mid-save
    latest                name of the newest complete checkpoint (replaced atomically)

A checkpoint directory without the .tmp suffix is complete: it is fsynced before the rename,
and `latest` is replaced after it. A kill -9 at any point leaves either the previous state or
the new one, never a half-written checkpoint that loading would pick.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from agentrl.run_files import fsync_path, write_atomically
from agentrl.trainer.distributed import barrier
from agentrl.trainer.policy_worker import PolicyWorker

_STEP_DIR = re.compile(r"^step_(\d+)$")
LATEST = "latest"
_IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")  # AdamW options, not state


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` (and root itself) to disk."""
    for directory, _, files in os.walk(root):
        for name in files:
            fsync_path(Path(directory) / name)
        fsync_path(Path(directory))


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value))


def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch, cuda), as a checkpoint stores them."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state["numpy"] = [kind, keys.tolist(), position, has_gauss, cached]
    if torch.cuda.is_available():
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(
            torch.frombuffer(bytearray(base64.b64decode(state["cuda"])), dtype=torch.uint8)
        )


def _distributed_state(worker: PolicyWorker) -> dict[str, Any]:
    """Sharded model (+ optimizer) state dicts; the optimizer's state is created if it is still empty."""
    if worker.optimizer is None:
        model_state, _ = get_state_dict(worker.model, [])
        return {"model": model_state}
    model_state, optimizer_state = get_state_dict(worker.model, worker.optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """Steps of the complete checkpoints under run_dir, ascending (.tmp leftovers excluded)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    matches = (_STEP_DIR.match(entry.name) for entry in root.iterdir() if entry.is_dir())
    return sorted(int(match.group(1)) for match in matches if match)


def _step_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def _publish(staging: Path, final: Path, keep: int) -> None:
    """Rename the finished staging dir into place, point `latest` at it, drop old checkpoints."""
    root = final.parent
    if final.exists():  # the same step saved again: the new save wins
        shutil.rmtree(final)
    os.rename(staging, final)
    write_atomically(root / LATEST, final.name + "\n")
    for step in checkpoint_steps(root.parent)[:-keep]:
        shutil.rmtree(_step_dir(root.parent, step))
    for leftover in root.glob("step_*.tmp"):  # saves killed mid-write
        shutil.rmtree(leftover, ignore_errors=True)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    worker: PolicyWorker,
    trainer_state: dict[str, Any],
    keep: int = 3,
    rng: dict[str, Any] | None = None,
) -> Path:
    """Atomically save model, optimizer, scheduler, RNG and `trainer_state`; keep the newest `keep`.

    `rng` is an earlier `rng_state()` to store instead of the current one (a save after the RNG
    moved on, e.g. when a run is interrupted during the next step's rollout).
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    try:
        trainer_json = json.dumps(trainer_state)
    except TypeError as error:
        raise ValueError(f"trainer_state must be JSON-serializable: {error}") from error
    final = _step_dir(run_dir, step)
    staging = final.with_name(final.name + ".tmp")
    if worker.context.is_main:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    barrier()
    dcp.save(_distributed_state(worker), checkpoint_id=staging / "state")
    _write_json(staging / f"rng_rank{worker.context.rank}.json", rng or rng_state())
    if worker.context.is_main:
        (staging / "trainer_state.json").write_text(trainer_json)
        scheduler = worker.scheduler.state_dict() if worker.scheduler is not None else None
        _write_json(staging / "worker_state.json", {"scheduler": scheduler})
    barrier()
    if worker.context.is_main:
        _fsync_tree(staging)
        _publish(staging, final, keep)
    barrier()
    return final


def _latest_dir(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / LATEST
    if pointer.is_file():
        named = run_dir / "checkpoints" / pointer.read_text().strip()
        if _STEP_DIR.match(named.name) and named.is_dir():
            return named
    # No usable pointer (e.g. killed between the rename and the pointer update): newest complete dir.
    steps = checkpoint_steps(run_dir)
    return _step_dir(run_dir, steps[-1]) if steps else None


def load_latest_checkpoint(run_dir: str | Path, worker: PolicyWorker) -> tuple[int, dict[str, Any]] | None:
    """Restore the newest complete checkpoint into `worker`; (step, trainer_state), or None if there is none."""
    directory = _latest_dir(Path(run_dir))
    if directory is None:
        return None
    state = _distributed_state(worker)
    dcp.load(state, checkpoint_id=directory / "state")
    if worker.optimizer is None:
        set_state_dict(worker.model, [], model_state_dict=state["model"], optim_state_dict={})
    else:
        implementation = [
            {key: group[key] for key in _IMPLEMENTATION if key in group}
            for group in worker.optimizer.param_groups
        ]
        set_state_dict(
            worker.model,
            worker.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
        # How the optimizer runs is this code's choice, not training state: a checkpoint from a
        # version whose AdamW was not fused would otherwise turn off the fused kernel the
        # non-finite-step skip relies on.
        for group, flags in zip(worker.optimizer.param_groups, implementation, strict=True):
            group.update(flags)
    worker_state = json.loads((directory / "worker_state.json").read_text())
    if worker.scheduler is not None and worker_state["scheduler"] is not None:
        worker.scheduler.load_state_dict(worker_state["scheduler"])
    rng_file = directory / f"rng_rank{worker.context.rank}.json"
    if rng_file.is_file():  # absent when resuming on more ranks than were saved
        _set_rng_state(json.loads(rng_file.read_text()))
    step = int(_STEP_DIR.match(directory.name).group(1))  # type: ignore[union-attr]
    return step, json.loads((directory / "trainer_state.json").read_text())
