"""A run dir's config.yaml: what a resumed run with changed settings says and keeps."""

from __future__ import annotations

from agentrl.config_loader import config_changes, dump_config, load_config
from agentrl.train import record_config


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
