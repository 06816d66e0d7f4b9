"""Tokenizers for each family's published chat template, built offline.

No model hub is reachable and the families' own tokenizer files are tens of MB, so each family
gets the tiny policy's byte-level tokenizer (`envs.tiny_policy.tokenizer.new_backend`: any text
encodes, byte for byte) extended with that family's special tokens, marked special as the
family's tokenizer marks them, and its published template (tests/renderers/templates/). Token
ids differ from the real tokenizer's, but what the tests check does not depend on them: which
strings are single special tokens, and what the template renders.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from envs.tiny_policy.tokenizer import new_backend

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Family:
    template: str  # file under templates/
    special: tuple[str, ...]  # special tokens (skipped by decode(skip_special_tokens=True))
    plain: tuple[str, ...] = ()  # added tokens that are not special
    bos: str | None = None
    eos: str = ""


CHATML = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
HERMES_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
DEEPSEEK = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")
DEEPSEEK_TOOLS = (
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>", "<think>", "</think>",
)  # fmt: skip

FAMILIES = {
    "qwen2.5": Family("Qwen-Qwen2.5-7B-Instruct.jinja", CHATML, HERMES_TAGS, eos="<|im_end|>"),
    "qwen3": Family("Qwen-Qwen3-0.6B.jinja", CHATML, HERMES_TAGS, eos="<|im_end|>"),
    "llama3": Family(
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        (
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
    ),
    "mistral": Family(
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        (
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        bos="<s>",
        eos="</s>",
    ),
    "deepseek-r1": Family(
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        DEEPSEEK,
        DEEPSEEK_TOOLS,
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
    ),
    "deepseek-v3.1": Family(
        "deepseek-ai-DeepSeek-V3.1.jinja",
        DEEPSEEK,
        DEEPSEEK_TOOLS,
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
    ),
    "glm4.5": Family(
        "llama.cpp-glm_4_5.jinja",
        ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|endoftext|>"),
        (
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "<tool_response>",
            "</tool_response>",
        ),
        eos="<|endoftext|>",
    ),
    "gpt-oss": Family(
        "openai-gpt-oss-120b.jinja",
        (
            "<|startoftext|>",
            "<|endoftext|>",
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|return|>",
            "<|call|>",
        ),
        eos="<|return|>",
    ),
}


def family_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with family `name`'s special tokens and published chat template."""
    family = FAMILIES[name]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate([*family.special, *alphabet])}
    backend = new_backend(models.BPE(vocab=vocab, merges=[]))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in family.special])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.plain])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=family.bos,
        eos_token=family.eos,
        clean_up_tokenization_spaces=False,
        chat_template=(TEMPLATES / family.template).read_text(),
    )
