"""The offline default policies: tiny Qwen2-architecture causal LMs built from synthetic data.

`DEFAULT_MODEL_PATH` is the shipped checkpoint directory of `model.path=tiny` (load it with
`AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`); `THINK_MODEL_PATH` is
its thinking variant, `model.path=tiny_think`, which reasons in `<think>` before a math answer and
whose chat template drops earlier turns' reasoning (a template that rewrites history). Their build
tooling lives outside the core, in `envs/tiny_policy`: rebuild them with
`python -m envs.tiny_policy.build --out DIR` (add `--think --math-fraction 1.0` for the variant).
"""

from __future__ import annotations

from pathlib import Path

# Resolved from this file so they point inside the installed package, wherever that is.
_ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_MODEL_PATH: Path = _ASSETS / "tiny_policy"
THINK_MODEL_PATH: Path = _ASSETS / "tiny_think"
# The names `model.path` accepts for the bundled checkpoints.
BUNDLED_MODELS: dict[str, Path] = {"tiny": DEFAULT_MODEL_PATH, "tiny_think": THINK_MODEL_PATH}

__all__ = ["BUNDLED_MODELS", "DEFAULT_MODEL_PATH", "THINK_MODEL_PATH"]
