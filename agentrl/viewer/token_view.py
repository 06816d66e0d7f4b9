"""Run viewer: a trajectory's tokens with their loss mask, rollout logprob and advantage.

Token text comes from the run's own tokenizer (config.yaml's model.path, else the exported
hf_model/); without one the view shows token ids, so a run dir alone is always enough.
transformers is imported when the first tokenizer loads: it takes seconds, and the viewer's
other pages never need it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.tiny_policy import BUNDLED_MODELS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Upper edges of the logprob buckets for sampled tokens; the last bucket is "low probability".
LOGPROB_EDGES = (-0.1, -1.0, -2.5)
LOW_LOGPROB = -2.5


@dataclass(frozen=True)
class TokenCell:
    """One token as the page shows it."""

    token_id: int
    text: str  # decoded text with whitespace made visible
    kind: str  # prompt | sampled | observation | boundary (a new sample of the episode starts)
    logprob: float | None  # rollout logprob of a sampled token
    logprob_bucket: int  # 0 (confident) .. 3 (below LOW_LOGPROB); 0 for unsampled tokens


@functools.lru_cache(maxsize=8)
def _load_tokenizer(path: str) -> PreTrainedTokenizerBase | None:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):  # not on this machine (e.g. a hub id offline): show ids
        return None


def run_tokenizer(run_path: Path, config: dict[str, Any]) -> PreTrainedTokenizerBase | None:
    """The tokenizer the run trained with, if it can be loaded from this machine."""
    model_path = str((config.get("model") or {}).get("path") or "")
    candidates = [str(BUNDLED_MODELS.get(model_path, model_path)), str(run_path / "hf_model")]
    for candidate in candidates:
        if candidate and (tokenizer := _load_tokenizer(candidate)) is not None:
            return tokenizer
    return None


def _visible(text: str) -> str:
    return text.replace("\n", "↵\n").replace("\t", "⇥")


def _bucket(logprob: float) -> int:
    return sum(logprob < edge for edge in LOGPROB_EDGES)


SAMPLE_BOUNDARY = "new sample: history rewritten"  # the text of a boundary cell


def token_cells(record: dict[str, Any], tokenizer: PreTrainedTokenizerBase | None) -> list[TokenCell]:
    """Per sample of the episode, in order: prompt tokens, then response tokens marked sampled
    (mask 1) or observation (mask 0); a boundary cell before each sample after the first."""

    def text_of(token_id: int) -> str:
        if tokenizer is None:
            return f"[{token_id}]"
        return _visible(tokenizer.decode([token_id], skip_special_tokens=False))

    cells = []
    for number, sample in enumerate([*record.get("earlier_segments", []), record]):
        if number:
            cells.append(TokenCell(-1, SAMPLE_BOUNDARY, "boundary", None, 0))
        cells += [TokenCell(t, text_of(t), "prompt", None, 0) for t in sample["prompt_ids"]]
        for token_id, mask, logprob in zip(
            sample["response_ids"], sample["loss_mask"], sample["rollout_logprobs"], strict=True
        ):
            if mask:
                cells.append(TokenCell(token_id, text_of(token_id), "sampled", logprob, _bucket(logprob)))
            else:
                cells.append(TokenCell(token_id, text_of(token_id), "observation", None, 0))
    return cells
