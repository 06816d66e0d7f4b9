"""Set-up, the model to load: a model path setting resolved to what transformers loads.

"tiny" and "tiny_think" are the bundled policies; a local path must hold a model saved with `save_pretrained`; anything
else is a hub id. Each entry point (training, the debugger, the served engine, the template
checker) resolves its path here, so a path that cannot load fails at once with the same error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from agentrl.tiny_policy import BUNDLED_MODELS

SAVED_FILES = ("config.json", "tokenizer_config.json")  # what save_pretrained writes (model, tokenizer)


def resolve_model_path(path: str, setting: str = "model.path") -> str:
    """`path` as transformers loads it: a bundled policy by name; a local path must hold a saved model.

    A hub id (`org/name`) passes through: transformers resolves it from the hub or its cache.
    `setting` names where the path came from in errors (`model.path`, `--model`).
    """
    if path in BUNDLED_MODELS:
        return str(BUNDLED_MODELS[path])
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
            "a hub id such as Qwen/Qwen2.5-0.5B-Instruct, or tiny or tiny_think (the bundled policies)"
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


_loaded_a_model = False  # this process has shown transformers' "Loading weights" bar once


def load_causal_lm(model_path: str, **kwargs: Any) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained`, every model load of agentrl goes through here.

    A run loads the same weights several times (engine, actor, reference): the loading bar is
    shown for the first load of the process only (and off a terminal, where training turns
    progress bars off, not at all).
    """
    global _loaded_a_model
    quiet = _loaded_a_model and transformers.utils.logging.is_progress_bar_enabled()
    with _progress_bars_off() if quiet else nullcontext():
        model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    _loaded_a_model = True
    return model


@contextmanager
def _progress_bars_off() -> Iterator[None]:
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.utils.logging.enable_progress_bar()
