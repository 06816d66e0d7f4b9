"""Parsing stage: which fenced code block of a model's reply is its program.

The code_sandbox env runs it, the `code_pass_rate` reward judges it and the `code_block_format`
reward checks it, so all three read the same program out of the same reply.

The rule: the last closed block tagged for the task's language (```python, ```py, ...; the
tag's case does not matter), else the last closed untagged block, else none. A tag says what a
block is, so a tagged program wins over an untagged block wherever it stands: models often
follow their program with an untagged block of sample output or a shell command, and those are
not the answer. An untagged block is taken only when nothing is tagged, for models that do not
tag. Blocks of another language (```text, ```bash) are never the program. A fence that is never
closed (a reply cut off by the token budget) holds no program, and neither does a blank block,
so neither hides one written before it.
"""

from __future__ import annotations

import re

from sandbox.types import Language

# Tags a block of each language may carry; the first is the one we ask the model to write.
FENCE_LABELS: dict[Language, tuple[str, ...]] = {
    Language.PYTHON: ("python", "py", "python3"),
    Language.CPP: ("cpp", "c++", "cc"),
}
_FENCED_BLOCK = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def extract_program(reply: str, language: Language = Language.PYTHON) -> str | None:
    """The program of `reply` in `language` by the rule above; None when it has none."""
    blocks = [(tag.lower(), body) for tag, body in _FENCED_BLOCK.findall(reply) if body.strip()]
    tagged = [body for tag, body in blocks if tag in FENCE_LABELS[language]]
    untagged = [body for tag, body in blocks if tag == ""]
    chosen = tagged or untagged
    return chosen[-1] if chosen else None
