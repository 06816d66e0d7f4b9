"""`python -m agentrl.debug` driven through its non-interactive mode, as a bug report transcript would be."""

from __future__ import annotations

import ast
import json
import re

import pytest
from transformers import AutoTokenizer

from agentrl.debug.__main__ import main
from agentrl.tiny_policy import DEFAULT_MODEL_PATH

# Row 3 of the math preset's training data (trainer.seed 0) asks "What is 2 * 4?".
MATH = ["env=math", "env.kwargs.max_attempts=2", "--row", "3"]
TOKENIZER = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
BOXED, YOUR, ANSWER = (TOKENIZER.convert_tokens_to_ids(t) for t in ("\\boxed", "Your", "Ġanswer"))
ROW = re.compile(r"^(\d+)\s+(\d+)\s+([01])\s+(\S+)(?: LOW)?\s+('.*')\s*$")


def token_rows(output: str) -> list[tuple[int, int, int, str]]:
    """(position, id, mask, token) of every token-table row printed."""
    return [(int(m[1]), int(m[2]), int(m[3]), m[5]) for line in output.splitlines() if (m := ROW.match(line))]


def run(capsys, tmp_path, args: list[str], script: str) -> tuple[int, str]:
    path = tmp_path / "commands.txt"
    path.write_text(script)
    code = main([*args, "--script", str(path)])
    return code, capsys.readouterr().out


def test_a_typed_wrong_then_right_answer_shows_sampled_tokens_masked_1_the_feedback_masked_0_and_the_rewards(
    capsys, tmp_path
):
    saved = tmp_path / "episode.jsonl"
    script = f"say \\boxed{{5}}\nsay \\boxed{{8}}\nsave {saved}\n"
    code, out = run(capsys, tmp_path, [*MATH, "--policy", "human"], script)
    assert code == 0
    rows = token_rows(out)
    assert [(p, i, m) for p, i, m, _ in rows if m == 1] == [
        (25, BOXED, 1), (26, 93, 1), (27, 23, 1), (28, 95, 1), (29, 2, 1),
        (47, BOXED, 1), (48, 93, 1), (49, 26, 1), (50, 95, 1), (51, 2, 1),
    ]  # fmt: skip
    feedback = "".join(ast.literal_eval(token) for _, _, mask, token in rows if mask == 0)
    assert (
        feedback
        == "\n<|im_start|>user\nYour answer is incorrect. Try again.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "reward: 0 (episode 0), finish: stop" in out
    assert "reward: 1 (episode 1), finish: stop" in out
    assert "status: completed, terminated=True, truncated=False" in out
    assert "budgets: turns 2/8, episode tokens 52/256, this turn 5/48 new tokens" in out
    record = json.loads(saved.read_text())
    assert (record["reward"], record["status"], sum(record["loss_mask"]), len(record["loss_mask"])) == (
        1.0, "completed", 10, 27,
    )  # fmt: skip


def test_a_saved_episode_replays_and_every_token_matches_a_re_render(capsys, tmp_path):
    saved = tmp_path / "episode.jsonl"
    run(capsys, tmp_path, [*MATH, "--policy", "human"], f"say \\boxed{{5}}\nsay \\boxed{{8}}\nsave {saved}\n")
    code = main(["--replay", str(saved), "--index", "0", "env=math", "env.kwargs.max_attempts=2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "re-render: all 52 tokens match a full render of the conversation" in out
    assert "── turn 2 ── reward 1, finish stop" in out


def test_replay_names_the_turn_and_position_of_a_token_that_differs_from_the_re_render(capsys, tmp_path):
    saved = tmp_path / "episode.jsonl"
    run(capsys, tmp_path, [*MATH, "--policy", "human"], f"say \\boxed{{5}}\nsay \\boxed{{8}}\nsave {saved}\n")
    record = json.loads(saved.read_text())
    record["response_ids"][9] = ANSWER  # position 34, the feedback's 'Your', overwritten with ' answer'
    saved.write_text(json.dumps(record) + "\n")
    code = main(["--replay", str(saved), "--index", "0", "env=math", "env.kwargs.max_attempts=2"])
    out = capsys.readouterr().out
    assert code == 1
    assert (
        f"re-render: MISMATCH in turn 1 (observation tokens) at position 34: trained {ANSWER} ' answer', "
        f"re-render {YOUR} 'Your'" in out
    )
    assert "compared with a full render of the context of turn 2" in out


def test_replay_catches_a_loop_that_trained_a_special_token_and_dropped_the_newline_closing_the_turn(
    capsys, tmp_path
):
    """What the loop once trained when the policy sampled `<|im_start|>` before `<|im_end|>`: the
    special token kept, and the observation delta taken from the longest common token prefix, which
    lost the `\n` after `<|im_end|>`. The turn's own delta logic agrees with itself; a full render
    of the messages does not."""
    saved = tmp_path / "episode.jsonl"
    run(capsys, tmp_path, [*MATH, "--policy", "human"], f"say \\boxed{{5}}\nsay \\boxed{{8}}\nsave {saved}\n")
    record = json.loads(saved.read_text())
    first = record["turns"][0]
    assert first["completion_ids"] == [BOXED, 93, 23, 95, 2] and first["observation_ids"][0] == 201  # '\n'
    first["completion_ids"] = [BOXED, 93, 23, 95, 1, 2]  # ... '}', '<|im_start|>', '<|im_end|>'
    first["observation_ids"] = first["observation_ids"][1:]
    record["response_ids"][4:6] = [
        1,
        2,
    ]  # position 29 on: '<|im_start|>', '<|im_end|>' where '<|im_end|>', '\n' were
    record["loss_mask"][5] = 1
    record["rollout_logprobs"][5] = -9.5
    record["num_template_mismatches"] = 1
    saved.write_text(json.dumps(record) + "\n")

    code = main(["--replay", str(saved), "--index", "0", "env=math", "env.kwargs.max_attempts=2"])
    out = capsys.readouterr().out
    assert code == 1
    assert "the rollout loop counted 1 template mismatch(es)" in out
    assert (
        "re-render: MISMATCH in turn 1 (sampled tokens) at position 29: trained 1 '<|im_start|>', "
        "re-render 2 '<|im_end|>'" in out
    )
    assert "compared with a full render of the conversation through turn 1; 52 tokens were trained" in out


def test_the_model_policy_steps_resamples_side_by_side_rewinds_and_continues_with_an_edited_action(
    capsys, tmp_path
):
    script = "step\nrewind 1\ntemperature 0.5\nsample 3\npick 1\nrewind 1\nsay \\boxed{8}\n"
    code, out = run(capsys, tmp_path, MATH, script)
    assert code == 0
    assert out.count("── turn 1 ──") == 3  # step, pick, say
    assert "temperature: 0.5" in out
    assert len(re.findall(r"^│ [0-2] ", out, flags=re.MULTILINE)) == 3  # three samples side by side
    assert out.rstrip().endswith("budgets: turns 1/8, episode tokens 30/256, this turn 5/48 new tokens")
    assert "reward: 1 (episode 1), finish: stop" in out.split("debug> say")[-1]


def test_saving_an_unfinished_episode_records_it_as_cut_at_its_turns_and_the_episode_goes_on(
    capsys, tmp_path
):
    saved = tmp_path / "episode.jsonl"
    script = f"say \\boxed{{5}}\nsave {saved}\nsay \\boxed{{8}}\nsave {saved}\n"
    code, out = run(capsys, tmp_path, [*MATH, "--policy", "human"], script)
    assert code == 0
    assert f"saved to {saved} (status truncated_turns, 1 turns)" in out
    assert f"saved to {saved} (status completed, 2 turns)" in out
    unfinished, finished = (json.loads(line) for line in saved.read_text().splitlines())
    # As training records an episode that max_turns=1 cut: it ends on the sampled tokens.
    assert (unfinished["status"], unfinished["loss_mask"], unfinished["turns"][0]["observation_ids"]) == (
        "truncated_turns", [1, 1, 1, 1, 1], [],
    )  # fmt: skip
    assert unfinished["info"]["truncation"] == (
        "saved by the debugger after 1 turn(s), before the env ended the episode"
    )
    assert (finished["status"], len(finished["loss_mask"])) == ("completed", 27)
    code = main(["--replay", str(saved), "--index", "0", "env=math", "env.kwargs.max_attempts=2"])
    assert code == 0
    assert "re-render: all 30 tokens match a full render of the conversation" in capsys.readouterr().out


def test_a_bare_say_and_pick_without_samples_are_one_line_errors_and_the_session_goes_on(capsys, tmp_path):
    code, out = run(capsys, tmp_path, [*MATH, "--policy", "human"], 'say\npick 0\nsay "\\boxed{8}\\n"\n')
    assert code == 1
    assert "error: `say` needs the turn's text, e.g. `say \\boxed{8}` (`help` explains quoting)\n" in out
    assert "error: no samples to pick from: run `sample K` first\n" in out
    assert "assistant: \\boxed{8}\n\n" in out  # quoted: the \n typed became a newline
    assert "reward: 1 (episode 1), finish: stop" in out


def test_help_explains_quoting_and_an_unquoted_backslash_n_stays_two_characters(capsys, tmp_path):
    code, out = run(capsys, tmp_path, [*MATH, "--policy", "human"], "help\nsay \\boxed{5}\\nok\n")
    assert code == 0
    assert (
        "so `say a\\nb` sends a backslash and\nan n. Quoted, `say \"a\\nb\"` (or 'a\\nb') turns each \\n into a newline"
        in out
    )
    assert "assistant: \\boxed{5}\\nok\n" in out


def test_sample_shows_each_candidates_reward_status_and_the_envs_info(capsys, tmp_path):
    code, out = run(capsys, tmp_path, MATH, "sample 4\n")
    assert code == 0
    rows = re.findall(r"^│ ([0-3]) │.*│ (\d+(?:\.\d+)?) +│ (completed|running) +│$", out, flags=re.MULTILINE)
    infos = [json.loads(info) for info in re.findall(r"^[0-3]: info (\{.*\})$", out, flags=re.MULTILINE)]
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
    assert len(infos) == 4
    for (_, reward, status), info in zip(rows, infos, strict=True):  # the env's verdict explains each row
        assert (float(reward), status) == ((1.0, "completed") if info["correct"] else (0.0, "running"))
        assert info["num_attempts"] == 1  # each tried on its own fresh env


def test_a_script_command_that_cannot_run_is_reported_and_the_exit_status_is_1(capsys, tmp_path):
    code, out = run(capsys, tmp_path, [*MATH, "--policy", "human"], "step\nrewind 7\nfly\n")
    assert code == 1
    assert "error: with --policy human a script types each turn: `say TEXT`" in out
    assert "error: rewind needs a turn in 1..1, got 7" in out
    assert "error: unknown command 'fly'" in out


def test_a_row_outside_the_data_exits_2_with_the_number_of_rows(capsys):
    assert main(["env=math", "--row", "99999"]) == 2
    assert "error: --row 99999 is out of range: the training data has 4096 rows" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["env=math", "actor.clip_ratio_hgh=0.3"]])
def test_config_typos_fail_before_anything_loads(capsys, args):
    assert main(args) == 2
    assert "did you mean 'actor.clip_ratio_high'" in capsys.readouterr().err


def test_replaying_a_file_that_does_not_exist_is_an_error_naming_it(capsys, tmp_path):
    missing = tmp_path / "step_5.jsonl"
    assert main(["--replay", str(missing), "--index", "0"]) == 2
    assert (
        f"error: --replay {missing}: no such file; give a run's rollouts/step_N.jsonl"
        in capsys.readouterr().err
    )


@pytest.mark.slow
def test_sample_on_the_code_env_shows_why_each_reward_is_what_it_is(capsys, tmp_path):
    one_turn = ["env.kwargs.max_turns=1", "rollout.max_turns=1"]  # the preset gives two attempts
    code, out = run(capsys, tmp_path, ["env=code_sandbox", *one_turn, "--row", "0"], "sample 2\n")
    assert code == 0
    rows = re.findall(r"^│ ([01]) │.*│ (\d+(?:\.\d+)?) +│ (\w+) +│$", out, flags=re.MULTILINE)
    infos = [json.loads(info) for info in re.findall(r"^[01]: info (\{.*\})$", out, flags=re.MULTILINE)]
    assert [row[0] for row in rows] == ["0", "1"]
    for (_, reward, status), info in zip(rows, infos, strict=True):
        # One turn: each sample ends the episode; reward_mode fraction is the hidden tests' pass rate.
        assert status == "completed"
        assert float(reward) == info["pass_rate_last_turn"]
        assert set(info) >= {"has_code_block", "pass_rate_last_turn", "correct", "hidden_verdicts"}
        # The verdicts say why: the pass rate is the share of hidden tests judged AC.
        verdicts = info["hidden_verdicts"].split()
        assert info["pass_rate_last_turn"] == (verdicts.count("AC") / len(verdicts) if verdicts else 0.0)


def test_a_mixed_config_drives_the_chosen_rows_env_with_that_envs_budgets(capsys, tmp_path):
    from agentrl.config_loader import load_config
    from agentrl.data_mixture import ENV_COLUMN
    from agentrl.trainer.components import load_task_data

    rows = load_task_data(load_config(["env=mixed"])).train_rows
    row = next(index for index, row in enumerate(rows) if row[ENV_COLUMN] == "tool")
    code, out = run(
        capsys, tmp_path, ["env=mixed", "--row", str(row), "--policy", "human"], "say \\boxed{1}\n"
    )
    assert code == 0
    assert f"env tool, row {row}, policy human" in out
    # the tool entry's budgets (64 new tokens a turn), not the rollout section's 96
    assert re.search(r"budgets: turns 1/4, episode tokens \d+/1000, this turn \d+/64 new tokens", out), out
