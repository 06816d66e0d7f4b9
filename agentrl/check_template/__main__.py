"""`python -m agentrl.check_template MODEL_PATH [--tools] [--renderer NAME]`: how a model will train.

Loads only the tokenizer and the generation config (no weights), prints a short report (the
model family, whether its template appends or rewrites history, the training mode) and exits 1
on any violation (a template that cannot train), 2 when the model path has no usable tokenizer
or template. Tool calls are checked whenever the template renders tools, and with `--tools`
even when it does not.
"""

from __future__ import annotations

import argparse
import sys

from transformers import GenerationConfig

from agentrl.check_template.checks import CheckedEpisode, TemplateReport, check_template, renders_tools
from agentrl.check_template.conversations import conversations
from agentrl.model_path import load_tokenizer, resolve_model_path
from agentrl.renderers import AUTO, RENDERER_NAMES, build_renderer, detect_family
from agentrl.renderers.base import Renderer


def stop_token_ids(model_path: str, tokenizer) -> set[int]:
    """The ids the engine stops on: the tokenizer's EOS and the generation config's EOS ids."""
    ids = {tokenizer.eos_token_id}
    try:
        config_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS alone stops generation
        config_eos = None
    ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
    return {i for i in ids if i is not None}


def mask_view(template: Renderer, episode: CheckedEpisode) -> str:
    """The episode's text with loss-mask-1 spans in [[ ]]."""
    pieces, start = [], 0
    for index in range(1, len(episode.token_ids) + 1):
        if index == len(episode.token_ids) or episode.loss_mask[index] != episode.loss_mask[start]:
            text = template.tokenizer.decode(episode.token_ids[start:index], skip_special_tokens=False)
            pieces.append(f"[[{text}]]" if episode.loss_mask[start] else text)
            start = index
    return "".join(pieces)


def format_report(template: Renderer, report: TemplateReport) -> str:
    facts = report.facts
    stops = ", ".join(
        f"{i} {template.tokenizer.decode([i], skip_special_tokens=False)!r}" for i in facts.stop_token_ids
    )
    lines = [
        (
            f"family: {report.family} (model.renderer=auto detects {detect_family(template.tokenizer)}; "
            "model.renderer=NAME overrides)"
        ),
        f"generation prompt: {facts.generation_prompt!r}",
        f"end of assistant turn: {facts.end_of_turn!r} (sampled turns end with token {facts.stop_token_id})",
        f"engine stop tokens: {stops}",
        "conversations:",
    ]
    for episode in report.episodes:
        lines.append(
            f"  {episode.conversation}: {episode.num_turns} turns, {len(episode.token_ids)} tokens, "
            f"{sum(episode.loss_mask)} with loss mask 1"
        )
    if report.episodes:  # none were replayed when the template does not render deterministically
        # The shortest multi-turn episode shows every boundary without flooding the terminal.
        shown = min(report.episodes, key=lambda e: (e.num_turns < 2, len(e.token_ids)))
        lines += [f"loss mask of {shown.conversation} (mask 1 in [[ ]]):", mask_view(template, shown)]
    for violation in report.violations:
        where = "".join(
            [
                f" turn {violation.turn}" if violation.turn is not None else "",
                f" token {violation.token_index}" if violation.token_index is not None else "",
            ]
        )
        lines.append(f"VIOLATION [{violation.check}] {violation.conversation}{where}: {violation.message}")
    if report.rewrites:
        lines.append("history: rewrites (a re-render does not extend what was sampled):")
        for rewrite in report.rewrites:
            lines.append(
                f"  {rewrite.conversation} after turn {rewrite.turn}, token {rewrite.token_index}: "
                f"drops or changes {rewrite.dropped!r}"
            )
        lines.append(
            "training: rollout.trajectory_mode=auto trains these episodes as segments (a new sample "
            "where the history is rewritten; every sample equals a full render of its context)"
        )
    else:
        lines.append("history: appends (every re-render extends what was sampled)")
        lines.append("training: rollout.trajectory_mode=auto trains each episode as one sample (single)")
    lines.append("ok: the template keeps every token training relies on" if report.ok else "FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.check_template", description=__doc__)
    parser.add_argument(
        "model_path", help="a Hugging Face model dir or id with a chat template; 'tiny' for the default"
    )
    parser.add_argument(
        "--tools",
        action="store_true",
        help="check tool calls and tool results even if the template does not render tools "
        "(they are checked whenever it does)",
    )
    parser.add_argument(
        "--renderer",
        default=AUTO,
        help=f"the model family's renderer, as model.renderer: {AUTO} (detected) or one of "
        f"{', '.join(RENDERER_NAMES)}",
    )
    args = parser.parse_args(argv)
    try:
        model_path = resolve_model_path(args.model_path, setting="model_path")
        tokenizer = load_tokenizer(model_path, setting="model_path")
        template = build_renderer(tokenizer, args.renderer)
    except ValueError as exc:
        print(
            f"error: cannot load a tokenizer with a chat template from {args.model_path!r}: {exc}",
            file=sys.stderr,
        )
        return 2
    with_tools = args.tools or renders_tools(template)
    report = check_template(template, stop_token_ids(model_path, tokenizer), conversations(with_tools))
    print(format_report(template, report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
