"""The build entry point end to end, with a tiny budget."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from envs.tiny_policy.build import BuildConfig, build, parse_args


def test_build_with_five_steps_writes_a_checkpoint_the_auto_classes_load(tmp_path):
    config = parse_args(["--out", str(tmp_path / "model"), "--steps", "5", "--seed", "1", "--threads", "1"])
    build(config)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    generation = json.loads((tmp_path / "model" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.eos_token_id
    assert (tmp_path / "model" / "chat_template.jinja").read_text().startswith("{#- ChatML.")


def test_build_config_rejects_heads_that_do_not_divide_the_hidden_size(tmp_path):
    with pytest.raises(ValueError, match="hidden_size"):
        BuildConfig(out=tmp_path, hidden_size=130, num_heads=4)
