"""Set-up, the model to load: a model path setting resolved to what transformers loads.

"tiny" is the bundled policy; a local path must hold a model saved with `save_pretrained`; anything
else is a hub id. Each entry point (training, the debugger, the served engine, the template
checker) resolves its path here, so a path that cannot load fails at once with the same error.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from agentrl.tiny_policy import DEFAULT_MODEL_PATH

SAVED_FILES = ("config.json", "tokenizer_config.json")  # what save_pretrained writes (model, tokenizer)


def resolve_model_path(path: str, setting: str = "model.path") -> str:
    """`path` as transformers loads it: "tiny" is the bundled policy; a local path must hold a saved model.

    A hub id (`org/name`) passes through: transformers resolves it from the hub or its cache.
    `setting` names where the path came from in errors (`model.path`, `--model`).
    """
    if path == "tiny":
        return str(DEFAULT_MODEL_PATH)
    local = Path(path).expanduser()
    if local.is_dir():
        if not any((local / name).is_file() for name in SAVED_FILES):
            raise ValueError(
                f"{setting}={path}: the directory holds neither config.json nor tokenizer_config.json; "
                "point it at a model saved with save_pretrained (a run's hf_model/, for one)"
            )
        return str(local)
    if local.exists() or path.startswith(("/", ".", "~")) or path.count("/") > 1:
        raise ValueError(
            f"{setting}={path}: no such model directory; give a directory saved with save_pretrained, "
            "a hub id such as Qwen/Qwen2.5-0.5B-Instruct, or tiny (the bundled policy)"
        )
    return path


def load_tokenizer(model_path: str, setting: str = "model.path") -> PreTrainedTokenizerBase:
    """The tokenizer at `model_path` (`resolve_model_path`'s); a model that cannot be reached is a ValueError."""
    try:
        return AutoTokenizer.from_pretrained(model_path)
    except OSError as error:  # transformers' error for a hub id it cannot fetch or find cached
        reason = str(error).splitlines()[0]
        raise ValueError(
            f"{setting}={model_path}: its tokenizer could not be loaded ({reason}); a hub id needs the "
            "hub, or the model already in the local cache, and a local model a directory saved with "
            "save_pretrained"
        ) from None
