from __future__ import annotations

import subprocess
import sys

import pytest

from agentrl.config_loader import ConfigError, load_config


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentrl.train", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_misspelled_key_exits_non_zero_naming_the_closest_valid_key():
    result = run_cli("env=math", "actor.clip_ratio_hgh=0.3")
    assert result.returncode == 2
    assert "unknown config key 'actor.clip_ratio_hgh'; did you mean 'actor.clip_ratio_high'?" in result.stderr


def test_help_lists_every_config_groups_presets():
    result = run_cli("--help")
    assert result.returncode == 0
    assert (
        "Presets: engine=sglang|transformers; env=code_sandbox|custom|math|tool_calling; model=tiny."
        in " ".join(result.stdout.split())  # argparse wraps the epilog to the terminal's width
    )


def test_a_wrong_type_names_the_key_and_the_value():
    with pytest.raises(ConfigError, match=r"rollout\.n: Input should be a valid integer.*'many'"):
        load_config(["rollout.n=many"])


def test_an_unknown_preset_lists_the_available_ones():
    with pytest.raises(ConfigError, match="no preset 'maths' in config group 'env'; available: .*math"):
        load_config(["env=maths"])


def test_overrides_use_verl_names_and_win_over_presets():
    config = load_config(
        [
            "env=math",
            "algorithm.adv_estimator=rloo",
            "actor.loss_agg_mode=seq-mean-token-sum-norm",
            "rollout.n=3",
        ]
    )
    assert config.algorithm.adv_estimator == "rloo"
    assert config.actor.loss_agg_mode == "seq-mean-token-sum-norm"
    assert config.rollout.n == 3
    assert config.env.id == "math"


def test_print_config_shows_the_resolved_values():
    result = run_cli("env=math", "rollout.n=5", "--print-config")
    assert result.returncode == 0, result.stderr
    assert "\nrollout:\n  n: 5\n" in result.stdout


def test_batch_sizes_that_do_not_divide_are_rejected_before_any_work():
    with pytest.raises(
        ConfigError, match="train_batch_size=10 must be a multiple of actor.ppo_mini_batch_size=4"
    ):
        load_config(["data.train_batch_size=10", "actor.ppo_mini_batch_size=4"])
