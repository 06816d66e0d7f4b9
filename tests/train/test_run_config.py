"""A run dir's config.yaml: what a resumed run with changed settings says and keeps."""

from __future__ import annotations

import pytest

from agentrl.config_loader import config_changes, dump_config, load_config
from agentrl.train import main, record, record_config


def test_config_changes_names_each_differing_setting_by_its_dotted_key():
    old = {"rollout": {"n": 4, "val_kwargs": {"n": 4}}, "trainer": {"seed": 0}}
    new = {"rollout": {"n": 8, "val_kwargs": {"n": 4}}, "trainer": {"seed": 0, "device": "cpu"}}
    assert config_changes(old, new) == ["rollout.n: 4 -> 8", "trainer.device: None -> 'cpu'"]


def test_a_resumed_run_with_changed_settings_warns_and_keeps_the_earlier_config(tmp_path, capsys):
    first, changed = load_config(["rollout.n=4"]), load_config(["rollout.n=8"])
    record_config(tmp_path, first)
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    record_config(tmp_path, first)  # the same command again: nothing to say
    assert capsys.readouterr().err == "" and sorted(p.name for p in tmp_path.glob("config*")) == [
        "config.yaml"
    ]
    record_config(tmp_path, changed)
    assert capsys.readouterr().err == (
        f"warning: resuming {tmp_path} after step 2 with changed settings (rollout.n: 4 -> 8); "
        "the earlier config.yaml is kept as config.before_step_3.yaml\n"
    )
    assert (tmp_path / "config.before_step_3.yaml").read_text() == dump_config(first)
    assert (tmp_path / "config.yaml").read_text() == dump_config(changed)


def test_a_run_without_a_checkpoint_starts_afresh_and_just_rewrites_its_config(tmp_path, capsys):
    record_config(tmp_path, load_config(["rollout.n=4"]))
    record_config(tmp_path, load_config(["rollout.n=8"]))
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in tmp_path.glob("config*")) == ["config.yaml"]


def test_a_second_change_before_the_same_step_keeps_both_earlier_configs(tmp_path, capsys):
    configs = [load_config([f"rollout.n={n}"]) for n in (4, 8, 16)]
    record_config(tmp_path, configs[0])
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    record_config(tmp_path, configs[1])
    record_config(tmp_path, configs[2])
    assert "the earlier config.yaml is kept as config.before_step_3.2.yaml" in capsys.readouterr().err
    assert (tmp_path / "config.before_step_3.yaml").read_text() == dump_config(configs[0])
    assert (tmp_path / "config.before_step_3.2.yaml").read_text() == dump_config(configs[1])
    assert (tmp_path / "config.yaml").read_text() == dump_config(configs[2])


@pytest.mark.parametrize(
    "content", ["", "rollout: {n: 4", "- a list\n"], ids=["empty", "cut short", "a list"]
)
def test_a_resumed_run_dir_whose_config_records_no_settings_is_a_clear_error(tmp_path, capsys, content):
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    (tmp_path / "config.yaml").write_text(content)
    assert record(tmp_path, load_config(["rollout.n=8"])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'config.yaml'} is ") and err.count("\n") == 1
    assert "the settings of the checkpointed steps (up to 2) are unknown; restore it, or move it aside" in err
    assert (tmp_path / "config.yaml").read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "config.yaml"]


TINY = ["env=math", "trainer.logger=[console]", "data.train_size=8", "data.val_size=4"]


@pytest.mark.parametrize(
    "failing", ["model.path=/no/such/model", "reward.funcs=[no_such_module:score]"], ids=["model", "reward"]
)
def test_a_command_that_fails_its_checks_leaves_the_run_dirs_config_as_it_was(tmp_path, capsys, failing):
    earlier = load_config([*TINY, "rollout.n=4"])
    record_config(tmp_path, earlier)
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    assert main([*TINY, "rollout.n=8", f"trainer.run_dir={tmp_path}", failing]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert (tmp_path / "config.yaml").read_text() == dump_config(earlier)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "config.yaml"]
