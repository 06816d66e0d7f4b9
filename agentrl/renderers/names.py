"""Set-up: the names `model.renderer` accepts (kept free of heavy imports for the config schema)."""

from __future__ import annotations

import difflib

AUTO = "auto"  # detect the family from the tokenizer's chat template
RENDERER_NAMES = (
    "generic", "qwen2.5", "qwen3", "qwen3_no_thinking", "llama3", "mistral", "deepseek",
    "deepseek_thinking", "glm4.5", "gpt-oss",
)  # fmt: skip


def check_renderer_name(name: str, setting: str = "model.renderer") -> str:
    """`name` if it names a renderer (or "auto"); ValueError naming the closest and every valid one."""
    valid = (AUTO, *RENDERER_NAMES)
    if name not in valid:
        closest = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean {closest[0]!r}?" if closest else ""
        raise ValueError(f"{setting}={name!r} is not a renderer.{hint} Valid: {', '.join(valid)}.")
    return name
