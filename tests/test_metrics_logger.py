"""metrics.jsonl across runs: whole lines only, and a resumed run that finds a torn one goes on."""

from __future__ import annotations

import json

from agentrl.config_loader import load_config
from agentrl.metrics import MetricsLogger

CONFIG = load_config(["env=math", "trainer.logger=[]"])
WHOLE = '{"step": 1, "reward/mean": 0.5}\n{"step": 2, "reward/mean": 0.25}\n'


def steps(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_resumed_run_drops_a_torn_last_line_says_where_it_was_and_logs_on(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text(WHOLE + '{"step": 3, "rew')  # the write of step 3 was cut short
    logger = MetricsLogger(tmp_path, CONFIG, resumed=True)
    logger.discard_after(2)
    assert capsys.readouterr().err == (
        f"warning: {path}: dropped an incomplete record at byte {len(WHOLE)} "
        "(a write cut short, e.g. by a full disk)\n"
    )
    assert path.read_text() == WHOLE
    logger.log(3, {"reward/mean": 1.0})
    assert steps(path) == [1, 2, 3]


def test_a_torn_line_that_a_later_run_appended_to_is_dropped_and_the_rest_kept(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    torn = '{"step": 3, "rew{"step": 3, "reward/mean": 0.75}\n'
    path.write_text(WHOLE + torn + '{"step": 4, "reward/mean": 1.0}\n')
    MetricsLogger(tmp_path, CONFIG, resumed=True).discard_after(4)
    assert f"dropped an incomplete record at byte {len(WHOLE)} " in capsys.readouterr().err
    assert steps(path) == [1, 2, 4]


def test_a_whole_file_is_left_as_it_is_when_no_record_is_discarded(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text(WHOLE)
    before = path.stat().st_ino
    MetricsLogger(tmp_path, CONFIG, resumed=True).discard_after(2)
    assert path.read_text() == WHOLE and path.stat().st_ino == before  # not rewritten
    assert capsys.readouterr().err == ""
    MetricsLogger(tmp_path, CONFIG, resumed=True).discard_after(1)
    assert steps(path) == [1]


def test_each_console_line_of_a_training_step_says_how_far_the_run_is_and_the_time_left(tmp_path, capsys):
    logger = MetricsLogger(tmp_path, load_config(["trainer.total_training_steps=4"]), resumed=False)
    logger.log(0, {"val/accuracy": 0.5})
    logger.log(1, {"reward/mean": 0.25, "timing_s/step": 30.0})
    logger.log(2, {"reward/mean": 0.5, "timing_s/step": 90.0})
    logger.log(4, {"reward/mean": 0.5, "timing_s/step": 60.0})
    assert capsys.readouterr().out.splitlines() == [
        "step 0: val/accuracy=0.5",
        "step 1/4 (eta 1m30s): reward/mean=0.25 timing_s/step=30",  # 3 steps left at 30 s
        "step 2/4 (eta 2m00s): reward/mean=0.5 timing_s/step=90",  # 2 left at the mean, 60 s
        "step 4/4 (eta 0s): reward/mean=0.5 timing_s/step=60",
    ]


def test_a_sample_no_reward_function_scored_is_left_out_of_the_logged_reward_statistics():
    from agentrl.metrics import rollout_metrics
    from agentrl.rollout.trajectory import Trajectory

    def sample(group_id: int, reward: float, missing: bool = False) -> Trajectory:
        return Trajectory(group_id=group_id, prompt_ids=[0], reward=reward, reward_missing=missing)

    metrics = rollout_metrics([sample(0, 1.0), sample(0, 0.0, missing=True), sample(1, 0.5), sample(1, 1.0)])
    assert metrics["reward/mean"] == 2.5 / 3  # the unscored 0.0 is not a score
    assert metrics["frac_reward_zero_std"] == 0.5  # group 0 has one scored member: no spread
