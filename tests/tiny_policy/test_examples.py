"""SFT token streams: segmented like a rollout, loss only on trained assistant replies."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from envs.tiny_policy.corpus import Conversation, Family
from envs.tiny_policy.examples import IGNORE_INDEX, collate, encode_conversation


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)


RETRY = Conversation(
    Family.MATH,
    (
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "1 + 1 = 3. \\boxed{3}"},
        {"role": "user", "content": "Your answer is incorrect. Try again."},
        {"role": "assistant", "content": "1 + 1 = 2. \\boxed{2}"},
    ),
    None,
    (False, False, False, True),
)


def test_loss_mask_covers_exactly_the_trained_reply_and_its_end_token(tokenizer):
    example = encode_conversation(tokenizer, RETRY)
    trained_ids = [i for i, m in zip(example.input_ids, example.loss_mask) if m]
    assert tokenizer.decode(trained_ids) == "1 + 1 = 2. \\boxed{2}<|im_end|>"


def test_token_stream_decodes_to_the_rendered_conversation(tokenizer):
    example = encode_conversation(tokenizer, RETRY)
    rendered = tokenizer.apply_chat_template(list(RETRY.messages), tokenize=False)
    assert tokenizer.decode(example.input_ids) == rendered.removesuffix("\n")


def test_collate_pads_on_the_right_and_ignores_untrained_positions(tokenizer):
    short = encode_conversation(tokenizer, Conversation(Family.MATH, RETRY.messages[:2], None, (False, True)))
    batch = collate([short, encode_conversation(tokenizer, RETRY)], pad_id=tokenizer.pad_token_id)
    length = len(short.input_ids)
    assert batch["attention_mask"][0].tolist() == [1] * length + [0] * (batch["input_ids"].shape[1] - length)
    assert (batch["labels"][0, length:] == IGNORE_INDEX).all()
    assert batch["labels"][0, :length].tolist() == [
        token if mask else IGNORE_INDEX for token, mask in zip(short.input_ids, short.loss_mask)
    ]
