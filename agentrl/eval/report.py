"""Evaluation stage output: the scores as a console table and as a JSON file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from agentrl.eval.scores import EnvScores
from agentrl.run_files import write_atomically


def scores_record(scores: dict[str, EnvScores], settings: dict[str, Any]) -> dict[str, Any]:
    """What the JSON file holds: the settings that produced the scores, and each env's scores."""
    envs = {}
    for name, env_scores in scores.items():
        record = dataclasses.asdict(env_scores)
        record["pass_at_k"] = {str(k): value for k, value in env_scores.pass_at_k.items()}
        for key in ("pass_at_turn", "pass_at_turn_stderr"):
            record[key] = {str(k): value for k, value in getattr(env_scores, key).items()}
        envs[name] = record
    return {**settings, "envs": envs}


def write_scores(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(record, indent=2) + "\n")


def scores_table(scores: dict[str, EnvScores]) -> str:
    """One line per env: problems, samples, pass@k, pass@turn and the fix rate (each ± its standard
    error over problems), mean reward, errors."""
    ks = sorted({k for env_scores in scores.values() for k in env_scores.pass_at_k})
    turns = sorted({k for env_scores in scores.values() for k in env_scores.pass_at_turn})
    header = ["env", "problems", "n", *(f"pass@{k}" for k in ks), *(f"pass@turn{k}" for k in turns)]
    header += ["fix", "reward", "errors"]
    lines = [header]
    for name, env_scores in scores.items():
        lines.append([
            name, str(env_scores.num_problems), str(env_scores.num_samples),
            *(_number(env_scores.pass_at_k.get(k)) for k in ks),
            *(_number(env_scores.pass_at_turn.get(k), env_scores.pass_at_turn_stderr.get(k)) for k in turns),
            _number(env_scores.fix_rate, env_scores.fix_rate_stderr),
            _number(env_scores.reward_mean), _number(env_scores.error_frac),
        ])  # fmt: skip
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _number(value: float | None, stderr: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if stderr is None else f"{value:.3f}±{stderr:.3f}"
