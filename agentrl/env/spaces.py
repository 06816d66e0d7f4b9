"""Environment stage: the Gymnasium spaces of a text environment.

`Text` is the action space (the assistant's reply, any unicode string up to a length) and
`ChatMessages` the observation space (a list of `{"role", "content"}` messages). Gymnasium's
own `spaces.Text` only admits a fixed character set, which rejects ordinary model output
(newlines, LaTeX, punctuation), hence these two.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space

# Characters `sample()` draws from: enough to exercise parsers (braces, backslashes, newlines).
SAMPLE_CHARSET = string.ascii_letters + string.digits + " \n.,:;!?+-*/=()[]{}\\^_$"
SAMPLE_MAX_LENGTH = 64  # sampled strings stay short even when max_length is large
DEFAULT_MAX_LENGTH = 1 << 20  # characters; far above any completion a token budget allows
DEFAULT_ROLES = ("system", "user", "assistant", "tool")


def _sample_text(rng: np.random.Generator, min_length: int, max_length: int) -> str:
    upper = min(max_length, max(min_length, SAMPLE_MAX_LENGTH))
    length = int(rng.integers(min_length, upper + 1))
    indices = rng.integers(0, len(SAMPLE_CHARSET), size=length)
    return "".join(SAMPLE_CHARSET[i] for i in indices)


class Text(Space[str]):
    """Any Python `str` whose length lies in `[min_length, max_length]` characters."""

    def __init__(
        self,
        max_length: int = DEFAULT_MAX_LENGTH,
        *,
        min_length: int = 0,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        if not 0 <= min_length <= max_length:
            raise ValueError(
                f"Text needs 0 <= min_length <= max_length, got min_length={min_length}, "
                f"max_length={max_length}"
            )
        self.min_length = min_length
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str:
        """A random short string over `SAMPLE_CHARSET`, reproducible through `seed()`."""
        if mask is not None or probability is not None:
            raise ValueError("Text.sample does not support mask or probability; pass neither")
        return _sample_text(self.np_random, self.min_length, self.max_length)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Text)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __repr__(self) -> str:
        return f"Text(min_length={self.min_length}, max_length={self.max_length})"


class ChatMessages(Space[list]):
    """A list of chat messages: dicts with a `role` from `roles` and a `str` `content`.

    Extra string keys (`name`, `tool_call_id`, `tool_calls`, ...) are allowed so tool messages
    in the OpenAI layout are members too.
    """

    def __init__(
        self,
        max_messages: int = 1024,
        *,
        roles: Sequence[str] = DEFAULT_ROLES,
        max_content_length: int = DEFAULT_MAX_LENGTH,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        if max_messages < 1:
            raise ValueError(f"ChatMessages needs max_messages >= 1, got {max_messages}")
        if not roles:
            raise ValueError("ChatMessages needs at least one role, got an empty roles list")
        self.max_messages = max_messages
        self.roles = tuple(roles)
        self.max_content_length = max_content_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains_message(self, message: Any) -> bool:
        """Whether one message is a `{"role", "content"}` dict this space admits."""
        return (
            isinstance(message, dict)
            and all(isinstance(key, str) for key in message)
            and message.get("role") in self.roles
            and isinstance(message.get("content"), str)
            and len(message["content"]) <= self.max_content_length
        )

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, list)
            and len(x) <= self.max_messages
            and all(self.contains_message(message) for message in x)
        )

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> list[dict[str, str]]:
        """One to three messages with random roles and short random contents."""
        if mask is not None or probability is not None:
            raise ValueError("ChatMessages.sample does not support mask or probability; pass neither")
        rng = self.np_random
        num_messages = int(rng.integers(1, min(3, self.max_messages) + 1))
        return [
            {
                "role": self.roles[int(rng.integers(len(self.roles)))],
                "content": _sample_text(rng, 0, self.max_content_length),
            }
            for _ in range(num_messages)
        ]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ChatMessages)
            and self.max_messages == other.max_messages
            and self.roles == other.roles
            and self.max_content_length == other.max_content_length
        )

    def __repr__(self) -> str:
        return (
            f"ChatMessages(max_messages={self.max_messages}, roles={self.roles}, "
            f"max_content_length={self.max_content_length})"
        )
