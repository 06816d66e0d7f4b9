"""Data stage (offline default policy): SFT conversations to token ids with a loss mask.

Tokens are cut exactly as a rollout cuts them: the prompt is the rendered template up to the
generation prompt, each assistant reply is its own segment ending in `<|im_end|>`, and what
follows it (template text, user and tool turns) is the template's delta. Training on the
same segmentation the rollout produces keeps SFT and RL token streams identical; where the template
rewrites earlier turns (the thinking variant), the example starts at the full render of the context
of its trained turn, as the rollout's next sample does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from envs.tiny_policy.corpus import Conversation
from envs.tiny_policy.tokenizer import IM_END

IGNORE_INDEX = -100  # label value the cross-entropy of transformers skips


@dataclass(frozen=True)
class TokenizedExample:
    """One conversation as model input."""

    input_ids: list[int]  # [num_tokens]
    loss_mask: list[int]  # [num_tokens] 1 on tokens of trained assistant replies (incl. <|im_end|>)


def render(
    tokenizer: PreTrainedTokenizerBase, conversation: Conversation, num_messages: int, prompt: bool
) -> str:
    """The chat template applied to the first `num_messages` messages."""
    return tokenizer.apply_chat_template(
        list(conversation.messages[:num_messages]),
        tools=list(conversation.tools) if conversation.tools else None,
        tokenize=False,
        add_generation_prompt=prompt,
    )


def encode_conversation(tokenizer: PreTrainedTokenizerBase, conversation: Conversation) -> TokenizedExample:
    """Token ids and loss mask for one conversation, segment by segment."""
    input_ids: list[int] = []
    loss_mask: list[int] = []

    def append(text: str, trained: bool) -> None:
        segment_ids = tokenizer.encode(text, add_special_tokens=False)
        input_ids.extend(segment_ids)
        loss_mask.extend([int(trained)] * len(segment_ids))

    rendered = ""
    for index, (message, trained) in enumerate(zip(conversation.messages, conversation.trained, strict=True)):
        if message["role"] != "assistant":
            continue
        prompt = render(tokenizer, conversation, index, prompt=True)
        full = render(tokenizer, conversation, index + 1, prompt=False)
        assert full.startswith(prompt), "chat template broke the prefix property within a turn"
        if not prompt.startswith(rendered):
            # The template rewrote earlier turns (a thinking template drops their reasoning): as in a
            # rollout, the sample starts over from the full render of this turn's context, which
            # loses nothing only while no earlier turn was trained.
            if any(loss_mask):
                raise ValueError("the chat template rewrites a trained turn; train only the last turns")
            input_ids.clear()
            loss_mask.clear()
            rendered = ""
        reply_end = full.rindex(IM_END) + len(IM_END)
        append(prompt[len(rendered) :], trained=False)
        append(full[len(prompt) : reply_end], trained=trained)
        rendered = full[:reply_end]
    return TokenizedExample(input_ids, loss_mask)


def collate(examples: list[TokenizedExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch with labels set to IGNORE_INDEX outside trained tokens."""
    length = max(len(example.input_ids) for example in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)  # [batch, length]
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)  # [batch, length]
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)  # [batch, length]
    for row, example in enumerate(examples):
        ids = torch.tensor(example.input_ids)
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
        labels[row, : len(ids)] = torch.where(torch.tensor(example.loss_mask) == 1, ids, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
