"""The shipped tokenizer: special tokens, one token per digit, lossless round trips."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, TokenizersBackend

from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from envs.tiny_policy.tokenizer import MARKUP_TOKENS, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)


def test_end_of_turn_is_eos_and_endoftext_is_padding(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token_id != tokenizer.pad_token_id


def test_special_and_markup_tokens_are_single_tokens(tokenizer):
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", *MARKUP_TOKENS):
        assert tokenizer.convert_ids_to_tokens(tokenizer.encode(token, add_special_tokens=False)) == [token]


def test_vocabulary_is_small(tokenizer):
    assert 500 <= len(tokenizer) <= 2000


def test_every_digit_is_its_own_token(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode("x = 12045 + 7", add_special_tokens=False))
    digits = [token for token in tokens if any(character.isdigit() for character in token)]
    assert digits == ["1", "2", "0", "4", "5", "7"]


@pytest.mark.parametrize(
    "text",
    [
        "def f(x):\n\treturn {'ü': x ** 2}  # ≈ 🎉\r\n",
        "  leading and trailing spaces  ",
        "日本語のテキスト and \x00\x07 control bytes",
        "a , b . c ' d",
    ],
)
def test_any_text_round_trips_through_encode_and_decode(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_markup_tokens_survive_decoding_without_special_tokens(tokenizer):
    ids = tokenizer.encode("<tool_call>\n{}\n</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call>"


def test_training_rejects_a_vocabulary_smaller_than_the_byte_alphabet():
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        train_tokenizer(["abc"], vocab_size=100)


def test_decomposed_unicode_encodes_and_decodes_to_its_composed_form(tokenizer):
    ids = tokenizer.encode("cafe\u0301", add_special_tokens=False)
    assert tokenizer.decode(ids) == "caf\u00e9"


def test_auto_tokenizer_and_the_generic_backend_tokenize_identically():
    # AutoTokenizer picks Qwen2Tokenizer for a qwen2 checkpoint and rebuilds its pipeline; the
    # shipped tokenizer.json must describe that same pipeline or training and loading disagree.
    generic = TokenizersBackend.from_pretrained(DEFAULT_MODEL_PATH)
    auto = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    text = "<|im_start|>user\nWhat is (12 + 7) * 3?<|im_end|>\n  def f(x):\n\treturn x ** 2  # ü"
    assert auto.encode(text) == generic.encode(text)
