"""Small hand-written run directories for the viewer tests, tokenized by the tiny policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from agentrl.tiny_policy import DEFAULT_MODEL_PATH

PROMPT = "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
FEEDBACK = "Your answer is incorrect. Try again."
OBSERVATION = f"\n<|im_start|>user\n{FEEDBACK}<|im_end|>\n<|im_start|>assistant\n"
CONFIDENT, UNLIKELY = -0.05, -4.0  # logprobs: the wrong digit "5" is the unlikely token


def _encode(text: str) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    return tokenizer.encode(text, add_special_tokens=False)


def trajectory(
    group_id: int, replies: list[str], reward: float, status: str, advantage: float | None
) -> dict[str, Any]:
    """A record as Trajectory.to_json() writes it: replies separated by the retry feedback."""
    response_ids, loss_mask, logprobs, turns = [], [], [], []
    for number, reply in enumerate(replies):
        completion_ids = _encode(reply + "<|im_end|>")
        response_ids += completion_ids
        loss_mask += [1] * len(completion_ids)
        logprobs += [UNLIKELY if piece == "5" else CONFIDENT for piece in _pieces(completion_ids)]
        last = number == len(replies) - 1
        observation = [] if last else [{"role": "user", "content": FEEDBACK}]
        observation_ids = [] if last else _encode(OBSERVATION)
        response_ids += observation_ids
        loss_mask += [0] * len(observation_ids)
        logprobs += [0.0] * len(observation_ids)
        turns.append(
            {
                "action_text": reply,
                "completion_ids": completion_ids,
                "observation": observation,
                "observation_ids": observation_ids,
                "reward": reward if last else 0.0,
                "finish_reason": "stop",
                "policy_version": 0,
            }
        )
    return {
        "group_id": group_id,
        "prompt_ids": _encode(PROMPT),
        "response_ids": response_ids,
        "loss_mask": loss_mask,
        "rollout_logprobs": logprobs,
        "turns": turns,
        "reward": reward,
        "status": status,
        "error": "env step raised KeyError: 'x'" if status == "env_error" else None,
        "policy_version": 0,
        "num_template_mismatches": 0,
        "num_infra_retries": 0,
        "info": {"correct": reward == 1.0},
        "advantage": advantage,
    }


def _pieces(ids: list[int]) -> list[str]:
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    return [tokenizer.decode([i]) for i in ids]


# Step 1: group 7 has a right and a wrong-then-right answer; group 9 a wrong one and an env error.
STEP_1 = [
    trajectory(7, ["\\boxed{4}"], 1.0, "completed", 0.7071),
    trajectory(7, ["\\boxed{5}", "\\boxed{4}"], 0.0, "truncated_turns", -0.7071),
    trajectory(9, ["\\boxed{5}"], 0.0, "completed", 0.0),
    trajectory(9, ["\\boxed{4}"], 0.0, "env_error", None),
]
# The KL term is off (config.yaml), so the trainer's actor/kl_loss of 0.0 was never measured.
METRICS = [
    {"step": 0, "val/reward/mean": 0.25, "val/accuracy": 0.25},
    {"step": 1, "reward/mean": 0.25, "accuracy": 0.25, "response_length/mean": 6.0, "timing_s/step": 1.5,
     "rollout/status/completed": 0.5, "rollout/status/truncated_turns": 0.25, "rollout/status/env_error": 0.25,
     "actor/pg_loss": -0.003712, "actor/kl_loss": 0.0, "actor/grad_norm": 0.5},
    {"step": 2, "reward/mean": 0.5, "accuracy": 0.5, "response_length/mean": 5.0, "timing_s/step": 1.25,
     "val/reward/mean": 0.5, "val/accuracy": 0.5, "actor/pg_loss": 0.0012, "actor/kl_loss": 0.0,
     "actor/grad_norm": 0.75},
]  # fmt: skip
CONFIG = "model:\n  path: tiny\nenv:\n  id: math\nactor:\n  use_kl_loss: false\n"


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def write_run(path: Path) -> Path:
    """A math run on the tiny policy: two training steps logged, step 1 and an eval dumped."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(CONFIG)
    write_jsonl(path / "metrics.jsonl", METRICS)
    write_jsonl(path / "rollouts" / "step_1.jsonl", STEP_1)
    write_jsonl(path / "rollouts" / "val_step_0.jsonl", STEP_1[:2])
    return path
