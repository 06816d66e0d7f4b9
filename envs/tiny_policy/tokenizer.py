"""Model stage (offline default policy): the byte-level BPE tokenizer and its ChatML template.

The pipeline (NFC normalizer, Qwen2 pre-tokenization regex, byte-level BPE) is exactly the one
transformers' `Qwen2Tokenizer` builds, because `AutoTokenizer` loads every qwen2 checkpoint
with that class and its hard-coded pipeline: any other pipeline would tokenize differently at
load time than at training time. That regex isolates every digit (one token per digit, which
makes arithmetic learnable), and the byte-level alphabet means any text encodes; NFC text
(ASCII, Python source, composed Unicode) decodes back exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from envs.tiny_policy.chat_template import CHAT_TEMPLATE

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # end of every turn: the EOS and stop token
PAD = "<|endoftext|>"
# Control tokens never produced by the model's text; skipped by decode(skip_special_tokens=True).
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
# Markup the model writes itself; kept as single tokens but never skipped when decoding.
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
MAX_LENGTH = 1024  # positions the model is built for: a three-hop search conversation takes about 750
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + len(MARKUP_TOKENS)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 1024, chat_template: str = CHAT_TEMPLATE
) -> PreTrainedTokenizerFast:
    """Train the BPE tokenizer on `texts` and attach the chat template and special tokens."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size must be at least {MIN_VOCAB_SIZE} (bytes + special tokens), got {vocab_size}"
        )
    backend = new_backend(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(MARKUP_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.add_tokens(markup_tokens())
    return wrap_tokenizer(backend, chat_template)


def markup_tokens() -> list[AddedToken]:
    return [AddedToken(token, special=False, normalized=False) for token in MARKUP_TOKENS]


def byte_tokenizer(chat_template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """The untrained tokenizer (bytes only, no merges): renders the chat template to train on."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *alphabet])}
    backend = new_backend(models.BPE(vocab=vocab, merges=[]))
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    backend.add_tokens(markup_tokens())
    return wrap_tokenizer(backend, chat_template)


def new_backend(model: models.Model) -> Tokenizer:
    """A `tokenizers` pipeline identical to the one `Qwen2Tokenizer` rebuilds when loading."""
    backend = Tokenizer(model)
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def wrap_tokenizer(backend: Tokenizer, chat_template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """The transformers tokenizer around a trained `tokenizers` backend, with the chat template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD,
        model_max_length=MAX_LENGTH,
        padding_side="left",  # generation pads on the left so every prompt ends at the last position
        clean_up_tokenization_spaces=False,  # decode must return the exact text
        chat_template=chat_template,
    )
