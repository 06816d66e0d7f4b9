"""The offline default policy: a tiny Qwen2-architecture causal LM built from synthetic data.

`DEFAULT_MODEL_PATH` is the shipped checkpoint directory (load it with
`AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`). Its build tooling
lives outside the core, in `envs/tiny_policy`: rebuild it with
`python -m envs.tiny_policy.build --out DIR`.
"""

from __future__ import annotations

from pathlib import Path

# Resolved from this file so it points inside the installed package, wherever that is.
DEFAULT_MODEL_PATH: Path = Path(__file__).resolve().parent.parent / "assets" / "tiny_policy"

__all__ = ["DEFAULT_MODEL_PATH"]
