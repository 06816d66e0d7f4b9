"""Reading run dirs, drawing plots and building token cells, without a browser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from transformers import AutoTokenizer

from agentrl.tiny_policy import DEFAULT_MODEL_PATH
from agentrl.viewer import run_data
from agentrl.viewer.plots import PLOTS, line_plot, run_plots, series_for
from agentrl.viewer.run_data import ParsedFiles
from agentrl.viewer.token_view import token_cells
from tests.viewer.run_dirs import METRICS, STEP_1, write_jsonl, write_run


def test_a_folder_of_runs_lists_each_run_and_two_runs_of_one_name_get_distinct_ids(tmp_path):
    write_run(tmp_path / "a" / "math")
    write_run(tmp_path / "b" / "math")
    (tmp_path / "a" / "notes").mkdir()
    runs = run_data.discover_runs([tmp_path / "a", tmp_path / "b" / "math"])
    assert [(r.run_id, r.path) for r in runs] == [
        ("math", tmp_path / "a" / "math"),
        ("b-math", tmp_path / "b" / "math"),
    ]


def test_a_metrics_line_still_being_written_is_skipped(run_dir):
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 3, "reward/me')
    assert [m["step"] for m in run_data.read_metrics(run_data.Run("r", run_dir))] == [0, 1, 2]


def test_rollout_files_are_ordered_by_step_with_train_before_val(run_dir):
    (run_dir / "rollouts" / "val_step_1.jsonl").write_text("")
    files = run_data.rollout_files(run_data.Run("r", run_dir))
    assert [(f.step, f.split) for f in files] == [(0, "val"), (1, "train"), (1, "val")]


def test_trajectories_carry_status_reward_advantage_and_sampled_token_counts(run_dir):
    rollouts = run_data.rollout_file(run_data.Run("r", run_dir), 1, "train")
    rows = [
        (t.index, t.group_id, t.status, t.reward, t.advantage, t.num_turns)
        for t in run_data.read_trajectories(rollouts)
    ]
    assert rows == [
        (0, 7, "completed", 1.0, 0.7071, 1),
        (1, 7, "truncated_turns", 0.0, -0.7071, 2),
        (2, 9, "completed", 0.0, 0.0, 1),
        (3, 9, "env_error", 0.0, None, 1),
    ]


def test_a_dump_is_parsed_once_until_the_file_changes(run_dir):
    rollouts = run_data.rollout_file(run_data.Run("r", run_dir), 1, "train")
    parses = run_data.DUMPS.num_parses
    first = run_data.read_trajectories(rollouts)
    assert run_data.read_trajectories(rollouts) is first
    assert run_data.DUMPS.num_parses == parses + 1
    write_jsonl(rollouts.path, STEP_1[:3])
    # A new version even where the clock is too coarse to move between two writes.
    os.utime(rollouts.path, ns=(0, rollouts.path.stat().st_mtime_ns + 1))
    assert [t.index for t in run_data.read_trajectories(rollouts)] == [0, 1, 2]
    assert run_data.DUMPS.num_parses == parses + 2


def test_the_cache_keeps_one_version_per_file_and_drops_the_least_recently_read_file(tmp_path):
    files = ParsedFiles(lambda path: path.read_text(), max_files=2)
    a, b, c = (tmp_path / name for name in "abc")
    for path in (a, b, c):
        path.write_text("1")
    files.read(a)
    a.write_text("22")
    assert files.read(a) == "22"
    files.read(b)
    files.read(a)
    files.read(c)  # b is the least recently read
    assert files.num_parses == 4
    assert files.read(a) == "22" and files.num_parses == 4
    assert files.read(b) == "1" and files.num_parses == 5


def test_metrics_are_parsed_once_until_a_step_is_appended(run_dir):
    run = run_data.Run("r", run_dir)
    first = run_data.read_metrics(run)
    assert run_data.read_metrics(run) is first
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 3, "reward/mean": 0.75}) + "\n")
    assert [m["step"] for m in run_data.read_metrics(run)] == [0, 1, 2, 3]


def test_a_trajectorys_full_record_is_read_from_its_own_line(run_dir):
    rollouts = run_data.rollout_file(run_data.Run("r", run_dir), 1, "train")
    trajectories = run_data.read_trajectories(rollouts)
    assert [run_data.read_record(rollouts, t) for t in trajectories] == STEP_1


def test_starting_the_viewer_does_not_import_transformers():
    code = "import sys, agentrl.viewer.__main__; print(sorted({'transformers', 'torch'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "[]\n"


def test_a_loss_term_switched_off_in_the_config_and_a_metric_never_logged_get_no_plot():
    losses = next(spec for spec in PLOTS if spec.title == "losses")
    assert series_for(losses, METRICS, {"actor": {"use_kl_loss": False}}) == {
        "actor/pg_loss": [(1.0, -0.003712), (2.0, 0.0012)]
    }
    assert list(series_for(losses, METRICS, {"actor": {"use_kl_loss": True}})) == [
        "actor/pg_loss",
        "actor/kl_loss",
    ]
    titles = [title for title, _ in run_plots(METRICS, {"actor": {"use_kl_loss": False}})]
    assert "entropy" not in titles and "gradient norm" in titles


def test_plot_series_follow_the_logged_steps_and_skip_statuses_that_never_happened():
    reward = next(spec for spec in PLOTS if spec.title == "reward")
    assert series_for(reward, METRICS) == {
        "reward/mean": [(1.0, 0.25), (2.0, 0.5)],
        "val/reward/mean": [(0.0, 0.25), (2.0, 0.5)],
    }
    statuses = next(spec for spec in PLOTS if spec.prefix == "rollout/status/")
    metrics = [{"step": 1, "rollout/status/completed": 1.0, "rollout/status/env_error": 0.0}]
    assert series_for(statuses, metrics) == {"completed": [(1.0, 1.0)]}


def test_a_plot_has_one_line_and_one_tooltip_per_point():
    svg = line_plot("reward", {"reward/mean": [(1.0, 0.0), (2.0, 1.0)]})
    assert svg.count("<polyline") == 1
    assert "<title>reward/mean at step 2: 1</title>" in svg
    assert line_plot("empty", {}) == ""


def test_the_left_margin_grows_with_the_longest_axis_label():
    short = line_plot("loss", {"loss": [(1.0, 0.0), (2.0, 1.0)]})
    negative = line_plot("loss", {"loss": [(1.0, -0.003712), (2.0, 0.0012)]})
    assert '<rect x="56" ' in short
    assert '<rect x="71" ' in negative  # 8 + 7 * len("-0.003712")
    assert '<text x="67" y="192" text-anchor="end" class="tick">-0.003712</text>' in negative


def test_token_cells_mark_prompt_sampled_and_observation_tokens():
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)

    def one_token_per_character(text: str) -> list[int]:  # whatever merges the tokenizer learned
        return [tokenizer.convert_tokens_to_ids(token) for char in text for token in tokenizer.tokenize(char)]

    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    record = {
        "prompt_ids": one_token_per_character("Hi\n"),
        "response_ids": [*one_token_per_character("4"), im_end, *one_token_per_character("ok")],
        "loss_mask": [1, 1, 0, 0],
        "rollout_logprobs": [-3.0, -0.01, 0.0, 0.0],
    }
    cells = token_cells(record, tokenizer)
    assert [(c.text, c.kind, c.logprob_bucket) for c in cells] == [
        ("H", "prompt", 0), ("i", "prompt", 0), ("↵\n", "prompt", 0),
        ("4", "sampled", 3), ("<|im_end|>", "sampled", 0), ("o", "observation", 0), ("k", "observation", 0),
    ]  # fmt: skip
    assert [c.text for c in token_cells(record, None)][:2] == [
        f"[{record['prompt_ids'][0]}]",
        f"[{record['prompt_ids'][1]}]",
    ]


def test_a_bad_filter_value_is_a_400_that_says_what_to_type(viewer):
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(f"{viewer}/runs/math_run/train/1?min_reward=high")
    assert error.value.code == 400
    assert error.value.read().decode() == "min_reward must be a number (e.g. 0.5), got 'high'"
