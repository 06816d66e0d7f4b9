"""`model.path`: what a run loads, and the error a path it cannot load gets before any work starts."""

from __future__ import annotations

import pytest

from agentrl.model_path import load_tokenizer, resolve_model_path
from agentrl.tiny_policy import DEFAULT_MODEL_PATH


def test_tiny_is_the_bundled_policy_and_a_saved_model_directory_or_hub_id_passes_through(tmp_path):
    assert resolve_model_path("tiny") == str(DEFAULT_MODEL_PATH)
    for saved in ("config.json", "tokenizer_config.json"):  # a model, or a tokenizer alone
        directory = tmp_path / saved.removesuffix(".json")
        directory.mkdir()
        (directory / saved).write_text("{}")
        assert resolve_model_path(str(directory)) == str(directory)
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/no/such/model", "model.path=/no/such/model: no such model directory"),
        ("./missing", "model.path=./missing: no such model directory"),
        ("runs/math/no_such_dir", "no such model directory"),
    ],
)
def test_a_local_path_that_does_not_exist_is_named_with_what_to_give_instead(path, problem):
    with pytest.raises(ValueError, match=f"{problem}.*a hub id such as .* or tiny"):
        resolve_model_path(path)


def test_a_directory_without_a_saved_model_says_it_has_no_config(tmp_path):
    with pytest.raises(ValueError, match="holds neither config.json nor tokenizer_config.json; point it at"):
        resolve_model_path(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="no such model directory"):
        resolve_model_path(str(tmp_path / "weights.bin"))


def test_a_hub_id_the_hub_cannot_serve_is_a_value_error_naming_the_model(monkeypatch):
    # Offline (as HF_HUB_OFFLINE=1 is, read once at import) only the local cache answers, at once.
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(
        ValueError, match="model.path=agentrl-tests/no-such-model: its tokenizer could not be loaded"
    ):
        load_tokenizer("agentrl-tests/no-such-model")


def test_the_bundled_tokenizer_loads():
    assert load_tokenizer(resolve_model_path("tiny")).eos_token == "<|im_end|>"
