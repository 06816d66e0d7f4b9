"""`python -m agentrl.train env=terminal`, the preset as a user runs it, learns on CPU.

The bundled tiny policy has seen terminal episodes in the env's format, some with a plausible
mistake (`envs.tiny_policy.terminal_tasks`), so its rollouts disagree and GRPO has a signal. The
preset's held-out success (50 tasks x 4 samples) must rise by more than one standard error, and
every episode must run its commands in a session and be scored by the hidden tests.
"""

from __future__ import annotations

import pytest

from tests.train.test_entry_points import metrics, train

pytestmark = pytest.mark.slow  # trains the whole preset in a subprocess


def test_the_terminal_preset_learns_beyond_one_standard_error(tmp_path):
    result = train(tmp_path, "env=terminal", "trainer.logger=[console]", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = metrics(tmp_path)
    before, after = steps[0], steps[-1]
    assert after["step"] == 15
    assert all(step["rollout/error_frac"] == 0 for step in steps[1:])
    gain = after["val/accuracy"] - before["val/accuracy"]
    assert gain > max(before["val/accuracy_stderr"], after["val/accuracy_stderr"]), (before, after)
    assert "held-out accuracy:" in result.stdout
