import json

import pyarrow as pa
import pytest
from pyarrow import parquet

from agentrl.data import generated_rows, load_rows, task_of_row

GOOD_ROW = {
    "data_source": "hand_written",
    "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
    "reward_model": {"style": "rule", "ground_truth": "4"},
    "extra_info": {"index": 0},
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def with_changes(**columns):
    row = {**GOOD_ROW, **columns}
    return {key: value for key, value in row.items() if value != "DROP"}


def test_jsonl_rows_load_in_file_order_skipping_blank_lines(tmp_path):
    second = with_changes(extra_info=None, data_source="other")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(GOOD_ROW) + "\n\n" + json.dumps(second) + "\n")
    assert load_rows(path) == [GOOD_ROW, second]


def test_parquet_rows_load_with_nested_prompt_and_reward_model(tmp_path):
    path = tmp_path / "rows.parquet"
    parquet.write_table(pa.Table.from_pylist([GOOD_ROW, with_changes(extra_info={"index": 1})]), path)
    assert load_rows(str(path)) == [GOOD_ROW, with_changes(extra_info={"index": 1})]


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        (
            with_changes(prompt="What is 2 + 2?"),
            "rows.jsonl row 1: column 'prompt': Input should be a valid list, got str",
        ),
        (
            with_changes(prompt=[]),
            "rows.jsonl row 1: column 'prompt': List should have at least 1 item.*got an empty list",
        ),
        (
            with_changes(prompt="DROP"),
            "rows.jsonl row 1: column 'prompt' is missing",
        ),
        (
            with_changes(prompt=[{"content": "hi"}]),
            "rows.jsonl row 1: column 'prompt.0.role' is missing",
        ),
        (
            with_changes(prompt=[{"role": "user", "content": 4}]),
            "row 1: column 'prompt.0.content': Input should be a valid string, got int",
        ),
        (
            with_changes(reward_model="4"),
            "rows.jsonl row 1: column 'reward_model': Input should be a valid dictionary.*, got str",
        ),
        (
            with_changes(reward_model={"style": "rule"}),
            "rows.jsonl row 1: column 'reward_model.ground_truth' is missing",
        ),
        (with_changes(data_source="DROP"), "rows.jsonl row 1: column 'data_source' is missing"),
        (
            with_changes(extra_info=[1]),
            "rows.jsonl row 1: column 'extra_info': Input should be a valid dictionary, got list",
        ),
        (
            [GOOD_ROW],
            "rows.jsonl row 1: must be an object with columns prompt, reward_model, data_source; got list",
        ),
    ],
)
def test_a_bad_row_is_reported_with_the_file_row_index_and_column(tmp_path, bad_row, message):
    path = write_jsonl(tmp_path / "rows.jsonl", [GOOD_ROW, bad_row])
    with pytest.raises(ValueError, match=message):
        load_rows(path)


def test_a_line_that_is_not_json_is_reported_with_its_row_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(GOOD_ROW) + "\n\n{not json\n")
    with pytest.raises(ValueError, match="rows.jsonl row 1 \\(line 3\\): invalid JSON"):
        load_rows(path)


def test_a_bad_parquet_row_is_reported_like_a_jsonl_row(tmp_path):
    path = tmp_path / "rows.parquet"
    parquet.write_table(
        pa.Table.from_pylist([GOOD_ROW, with_changes(reward_model={"ground_truth": None})]), path
    )
    with pytest.raises(ValueError, match="rows.parquet row 1: column 'reward_model.ground_truth' is missing"):
        load_rows(path)


def test_unsupported_formats_and_missing_files_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="unsupported dataset format '.csv'"):
        load_rows(tmp_path / "rows.csv")
    with pytest.raises(ValueError, match="absent.jsonl: no such dataset file"):
        load_rows(tmp_path / "absent.jsonl")


def test_generated_rows_come_from_the_named_generator_with_its_kwargs():
    rows = generated_rows("envs.math.synthetic:generate", num_rows=3, seed=0, split="val", difficulty=2)
    assert len(rows) == 3
    assert [row["extra_info"]["split"] for row in rows] == ["val", "val", "val"]
    assert rows == generated_rows(
        "envs.math.synthetic:generate", num_rows=3, seed=0, split="val", difficulty=2
    )


def test_a_generator_that_cannot_take_the_arguments_is_rejected_before_it_runs():
    with pytest.raises(ValueError, match="cannot be called with .*'num_rows'"):
        generated_rows("envs.math.synthetic:make_expression", num_rows=3, seed=0)
    with pytest.raises(ValueError, match="missing a required argument: 'difficulty'"):
        generated_rows("envs.math.synthetic:generate", num_rows=3, seed=0)


def bad_prompt_generator(num_rows, seed, split):
    return [with_changes(prompt="hello")] * num_rows


def short_generator(num_rows, seed, split):
    return [GOOD_ROW]


def test_generated_rows_are_validated_like_file_rows():
    with pytest.raises(
        ValueError, match="generator 'tests.data.test_rows:bad_prompt_generator' row 0: column 'prompt'"
    ):
        generated_rows("tests.data.test_rows:bad_prompt_generator", num_rows=2, seed=0)
    with pytest.raises(ValueError, match="returned 1 rows, expected num_rows=2"):
        generated_rows("tests.data.test_rows:short_generator", num_rows=2, seed=0)
    with pytest.raises(ValueError, match="module 'envs.math.synthetic' has no attribute 'nope'"):
        generated_rows("envs.math.synthetic:nope", num_rows=2, seed=0)


def test_an_env_reads_a_rows_opening_messages_as_a_copy_and_its_ground_truth():
    messages, ground_truth = task_of_row(GOOD_ROW, "MathEnv.reset options")
    assert messages == [{"role": "user", "content": "What is 2 + 2?"}] and ground_truth == "4"
    messages[0]["content"] = "changed"
    assert GOOD_ROW["prompt"][0]["content"] == "What is 2 + 2?"


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (
            with_changes(prompt=[]),
            "MathEnv.reset options must be a dataset row whose 'prompt' is a non-empty list",
        ),
        (with_changes(prompt="DROP"), "whose 'prompt' is .* got NoneType"),
        (
            with_changes(reward_model={"style": "rule"}),
            "with 'reward_model': {'ground_truth': ...}, got reward_model=",
        ),
        (["not", "a", "row"], "whose 'prompt' is .* got NoneType"),
    ],
)
def test_a_row_an_env_cannot_read_names_the_env_and_the_column(row, problem):
    with pytest.raises(ValueError, match=problem):
        task_of_row(row, "MathEnv.reset options")
