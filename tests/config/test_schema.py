"""The schema is the one home of every knob: its defaults are the shipped ones, and each is read."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from agentrl.config import Config
from agentrl.config_loader import ConfigError, configs_root, describe_config, load_config
from agentrl.data import DataConfig

ROOT = Path(__file__).resolve().parents[2]


def test_loading_a_config_and_rejecting_a_misspelt_key_import_no_torch():
    code = (
        "import sys\n"
        "from agentrl.train import main\n"
        "assert main(['env=math', 'actor.clip_ratio_hgh=0.3']) == 2\n"
        "from agentrl.config_loader import load_config\n"
        "load_config(['env=custom', 'rollout.n=4'])\n"
        "heavy = sorted(name for name in ('torch', 'transformers') if name in sys.modules)\n"
        "print('heavy:', heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "heavy: []" in result.stdout
    assert "did you mean 'actor.clip_ratio_high'?" in result.stderr


def test_the_schema_defaults_are_valid_on_their_own():
    config = Config(data=DataConfig(generator="envs.math.synthetic:generate"))
    assert config.actor.ppo_mini_batch_size == 16
    assert config.data.train_batch_size == 16


def test_defaults_yaml_only_selects_presets():
    defaults = yaml.safe_load((configs_root() / "defaults.yaml").read_text())
    assert list(defaults) == ["defaults"]


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    leaves = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            leaves += _leaf_fields(annotation, f"{prefix}{name}.")
        else:
            leaves.append((f"{prefix}{name}", name))
    return leaves


def test_every_knob_is_read_by_code_outside_the_schema():
    sources = "\n".join(
        path.read_text()
        for folder in ("agentrl", "envs")
        for path in (ROOT / folder).rglob("*.py")
        if not path.name.endswith("config.py") and path.name != "config_loader.py"
    )
    unread = [key for key, name in _leaf_fields(Config) if not re.search(rf"\.{name}\b", sources)]
    assert unread == []


def test_a_group_of_one_is_rejected_because_it_has_no_baseline():
    with pytest.raises(
        ConfigError, match=r"rollout.n=1 with algorithm.adv_estimator=grpo: .* set rollout.n >= 2"
    ):
        load_config(["rollout.n=1"])


def test_greedy_training_is_rejected_naming_the_key():
    with pytest.raises(ConfigError, match=r"rollout.temperature=0.0: training needs sampling"):
        load_config(["rollout.temperature=0"])


def test_a_truncated_sampling_distribution_is_warned_about():
    assert load_config([]).warnings() == []
    (warning,) = load_config(["rollout.top_p=0.9"]).warnings()
    assert "rollout.top_p=0.9" in warning and "truncate the sampled distribution" in warning
    assert load_config(["rollout.top_k=20"]).warnings() != []


def test_train_files_typed_over_a_generating_preset_replace_its_generator_with_a_note(capsys):
    config = load_config(["env=math", "data.train_files=[a.jsonl]", "data.val_files=[b.jsonl]"])
    assert (config.data.train_files, config.data.val_files) == (["a.jsonl"], ["b.jsonl"])
    assert (config.data.generator, config.data.generator_kwargs) == (None, {})
    assert capsys.readouterr().err == (
        "note: data.train_files replaces the preset's data.generator=envs.math.synthetic:generate\n"
    )


def test_files_and_a_generator_both_typed_are_rejected():
    with pytest.raises(ConfigError, match="data.train_files and data.generator are both set"):
        load_config(["data.train_files=[a.jsonl]", "data.generator=envs.math.synthetic:generate"])


def test_every_setting_says_what_it_means():
    undescribed = [line for line in describe_config(load_config([])) if "  # " not in line]
    assert undescribed == []


def test_a_mixture_entry_of_weight_zero_is_left_out_and_all_zero_is_an_error():
    config = load_config(["env=mixed", "env.mixture.code.weight=0"])
    assert list(config.env.mixture) == ["math", "tool"]
    zero_all = [f"env.mixture.{name}.weight=0" for name in ("math", "code", "tool")]
    with pytest.raises(ConfigError, match=r"every env of env.mixture \(math, code, tool\) has weight 0"):
        load_config(["env=mixed", *zero_all])
