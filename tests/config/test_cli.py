from __future__ import annotations

import subprocess
import sys

import pytest

from agentrl.config_loader import ConfigError, describe_config, load_config


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
        "Presets: engine=sglang|transformers; env=agent|code_sandbox|custom|math|mixed|multiturn|terminal|tool_calling; "
        "model=tiny|tiny_think."
        in " ".join(result.stdout.split())  # argparse wraps the epilog to the terminal's width
    )


def test_describe_prints_each_setting_under_a_key_with_its_resolved_value_and_meaning():
    result = run_cli("env=math", "actor.clip_ratio_high=0.28", "--describe", "actor.clip")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "actor.clip_ratio_low = 0.2  # Ratio is clipped below at 1 - clip_ratio_low.",
        "actor.clip_ratio_high = 0.28  # Ratio is clipped above at 1 + clip_ratio_high (DAPO clip-higher: > low).",
        "actor.clip_ratio_c = 3.0  # Dual-clip bound: loss of a negative-advantage token is at most -A * c.",
    ]


def test_describe_alone_covers_every_setting_and_an_unknown_key_is_an_error():
    everything = run_cli("--describe", "env=math")  # a preset after --describe is still a preset
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout.splitlines() == describe_config(load_config(["env=math"]))
    keys = [line.split(" = ")[0] for line in everything.stdout.splitlines()]
    assert {"env.id", "rollout.val_kwargs.n", "actor.optim.lr", "ray.num_workers", "trainer.seed"} <= set(
        keys
    )
    missing = run_cli("--describe", "actor.clip_ratio_hgh")
    assert missing.returncode == 2
    assert "no setting's key starts with 'actor.clip_ratio_hgh'" in missing.stderr


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
