"""Debugger: `--replay FILE --index I` prints a recorded trajectory turn by turn and checks its tokens
against a full render of its conversation (`agentrl.debug.replay`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rich.console import Console

from agentrl.config import Config
from agentrl.debug import display
from agentrl.debug.replay import RenderCheck, check_render, sample_views
from agentrl.model_path import load_tokenizer, resolve_model_path
from agentrl.renderers import build_renderer
from agentrl.rollout.chat_template import ChatTemplate
from agentrl.rollout.trajectory import Trajectory
from agentrl.trainer.components import build_env_factory, load_task_data


def read_record(path: Path, index: int) -> Trajectory:
    if not path.is_file():
        raise ValueError(
            f"--replay {path}: no such file; give a run's rollouts/step_N.jsonl or val_step_N.jsonl"
        )
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not 0 <= index < len(lines):
        raise ValueError(f"--index {index} is out of range: {path} holds {len(lines)} trajectories")
    return Trajectory.from_json(json.loads(lines[index]))


def opening_messages(config: Config, dump: Path, group_id: int) -> tuple[list[dict], list[dict] | None]:
    """The env's opening messages for the trajectory's row (train or val rows, by the dump's name)."""
    data = load_task_data(config)
    rows = data.val_rows if dump.name.startswith("val_") else data.train_rows
    if not 0 <= group_id < len(rows):
        raise ValueError(f"group_id {group_id} is not a row of this config's data ({len(rows)} rows)")
    env = build_env_factory(config)()
    try:
        messages, _ = asyncio.run(env.areset(seed=config.trainer.seed + group_id, options=rows[group_id]))
        return messages, env.tools
    finally:
        env.close()


def replay(dump: Path, index: int, config: Config, console: Console) -> int:
    """Show the recorded turns, then every token a re-render does not reproduce; 1 if any differ."""
    trajectory = read_record(dump, index)
    template = build_renderer(load_tokenizer(resolve_model_path(config.model.path)), config.model.renderer)
    opening, tools = opening_messages(config, dump, trajectory.group_id)
    console.print(f"replay {dump} line {index}: group {trajectory.group_id}, {len(trajectory.turns)} turns")
    console.print(display.messages_view(opening))
    views = sample_views(opening, trajectory)
    number, failed = 0, False
    for sample_number, (context, sample) in enumerate(views):
        if sample_number:
            console.print(
                f"── new sample: history rewritten ── sample {sample_number + 1} of {len(views)} starts from "
                f"a full render ({len(sample.prompt_ids)} tokens); its turns count from 1 in the check below",
                style="bold magenta",
            )
        cursor, offset = 0, len(sample.prompt_ids)
        for turn in sample.turns:
            number += 1
            end = min(cursor + len(turn.completion_ids) + len(turn.observation_ids), len(sample.response_ids))
            console.print(
                f"── turn {number} ── reward {turn.reward:g}, finish {turn.finish_reason}", style="bold"
            )
            console.print(
                display.messages_view([{"role": "assistant", "content": turn.action_text}, *turn.observation])
            )
            console.print(
                display.token_table(
                    template,
                    sample.response_ids[cursor:end],
                    sample.loss_mask[cursor:end],
                    sample.rollout_logprobs[cursor:end],
                    offset + cursor,
                )
            )
            cursor = end
        check = check_render(template, context, tools, sample)
        report_check(template, check, console)
        failed |= check.mismatch is not None
    console.print(
        f"episode reward {trajectory.reward:g}, status {trajectory.status.value}, info {trajectory.info}"
    )
    if trajectory.num_template_mismatches:
        console.print(
            f"the rollout loop counted {trajectory.num_template_mismatches} template mismatch(es)",
            style="bold red",
        )
    return 1 if failed else 0


def report_check(template: ChatTemplate, check: RenderCheck, console: Console) -> None:
    """The first token a full render does not reproduce, by turn and position, and what was noted."""
    for resplit in check.resplits:
        console.print(
            f"re-render: turn {resplit.turn} sampled {resplit.num_trained_tokens} token(s) at position "
            f"{resplit.position} where the render has {resplit.num_rendered_tokens} with the same text "
            "(the policy's own split)"
        )
    if check.num_unrecorded_tokens:
        console.print(
            f"re-render: the last {check.num_unrecorded_tokens} sampled tokens belong to no turn "
            "(the episode ended while the env stepped them); not compared"
        )
    mismatch = check.mismatch
    if mismatch is None:
        console.print(
            f"re-render: all {check.num_trained_tokens} tokens match a full render of the conversation"
        )
        return
    where = "the prompt" if mismatch.part == "prompt" else f"turn {mismatch.turn} ({mismatch.part} tokens)"
    console.print(
        f"re-render: MISMATCH in {where} at position {mismatch.position}: trained "
        f"{_token(template, mismatch.trained_id)}, re-render {_token(template, mismatch.rendered_id)}",
        style="bold red",
    )
    console.print(
        f"  (compared with a full render of {mismatch.render}; {check.num_trained_tokens} tokens were "
        f"trained, a full render of the whole conversation has {check.num_rendered_tokens})"
    )


def _token(template: ChatTemplate, token_id: int | None) -> str:
    if token_id is None:
        return "(none)"
    return f"{token_id} {template.tokenizer.decode([token_id], skip_special_tokens=False)!r}"
