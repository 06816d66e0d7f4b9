"""An env whose every step raises, to check that a broken env never crashes a training run."""

from __future__ import annotations

from agentrl.env import TextEnv


class AlwaysFailingEnv(TextEnv):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [dict(message) for message in options["prompt"]], {}

    def step(self, action):
        raise ConnectionError("the tool server is down")
