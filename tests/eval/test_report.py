"""The eval's table and JSON record of hand-built scores."""

from agentrl.eval.report import scores_record, scores_table
from agentrl.eval.scores import EnvScores

SCORES = EnvScores(
    num_problems=3, num_samples=2, pass_at_k={1: 0.5}, pass_at_turn={1: 0.25, 2: 0.5},
    pass_at_turn_stderr={1: 0.125, 2: 0.0625}, num_first_turn_misses=4, fix_rate=1 / 3,
    fix_rate_stderr=0.1, reward_mean=0.75, error_frac=0.0, turns_mean=1.5,
)  # fmt: skip


def test_the_table_shows_each_success_rate_with_its_standard_error():
    header, row = scores_table({"code": SCORES}).splitlines()
    assert header.split() == [
        "env", "problems", "n", "pass@1", "pass@turn1", "pass@turn2", "fix", "reward", "errors",
    ]  # fmt: skip
    assert row.split() == [
        "code", "3", "2", "0.500", "0.250±0.125", "0.500±0.062", "0.333±0.100", "0.750", "0.000",
    ]  # fmt: skip


def test_an_env_without_retries_shows_no_fix_rate():
    single = EnvScores(**{**SCORES.__dict__, "fix_rate": None, "fix_rate_stderr": None})
    assert scores_table({"math": single}).splitlines()[1].split()[6] == "-"


def test_the_record_keys_turns_as_strings_with_their_errors():
    record = scores_record({"code": SCORES}, {"model": "tiny"})
    code = record["envs"]["code"]
    assert code["pass_at_turn"] == {"1": 0.25, "2": 0.5}
    assert code["pass_at_turn_stderr"] == {"1": 0.125, "2": 0.0625}
    assert (code["fix_rate"], code["num_first_turn_misses"], record["model"]) == (1 / 3, 4, "tiny")
