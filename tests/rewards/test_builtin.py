"""Ready-made reward functions: format checks, math accuracy, code pass rate in the sandbox."""

import json
import subprocess
import sys
import textwrap

import pytest

from agentrl.rewards.answers import shared_grader
from agentrl.rewards.builtin import boxed_format, code_block_format, math_accuracy, tool_call_format
from agentrl.rewards.code_tests import CodePassRate
from agentrl.testing import code_probes


def reply(text):
    return [{"role": "assistant", "content": text}]


def test_boxed_format_needs_a_closed_non_empty_box_in_the_final_reply():
    completions = [reply("so \\boxed{12}"), reply("\\boxed{12"), reply("\\boxed{}"), reply("12")]
    assert boxed_format(completions) == [1.0, 0.0, 0.0, 0.0]


def test_code_block_format_needs_a_python_block_that_parses():
    completions = [
        reply("```python\ndef f():\n    return 1\n```"),
        reply("```python\ndef f(:\n```"),
        reply("f()"),
    ]
    assert code_block_format(completions) == [1.0, 0.0, 0.0]


def test_code_block_format_checks_the_block_the_code_env_would_run():
    program = "```python\ndef f():\n    return 1\n```"
    completions = [
        reply(program + "\nOutput:\n```\nf() -> 1\n```"),  # the untagged output block is not the program
        reply(program.replace("python", "python3")),
        reply("```python\ndef f(:\n```\n```\nx = 1\n```"),  # the broken tagged block is the program
    ]
    assert code_block_format(completions) == [1.0, 1.0, 0.0]


def test_tool_call_format_is_the_well_formed_fraction_and_none_without_calls():
    good = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}\n</tool_call>'
    episode = [*reply(good), {"role": "tool", "content": "1"}, *reply("<tool_call>{oops</tool_call>")]
    assert tool_call_format([episode, reply("\\boxed{1}")]) == [0.5, None]


def test_math_accuracy_compares_the_boxed_answer_with_math_verify():
    completions = [reply("\\boxed{0.5}"), reply("\\boxed{2}"), reply("no box")]
    truths = [{"ground_truth": "\\frac{1}{2}"}, {"ground_truth": "3"}, {"ground_truth": "1"}]
    assert math_accuracy(completions, reward_model=truths) == [1.0, 0.0, 0.0]


ANSWERS_AND_TRUTHS = [
    ("\\frac{1}{2}", "0.5"),
    ("1/2", "0.5"),
    ("13", "12"),
    ("\\sqrt{2}", "2^{1/2}"),
    ("x+1", "1+x"),
    ("9^{9^{9}}", "3"),  # sympy needs seconds: the worker's own limit decides
]


@pytest.mark.parametrize(("answer", "truth"), ANSWERS_AND_TRUTHS)
def test_math_accuracy_gives_every_answer_the_math_envs_verdict(answer, truth):
    from envs.math.reward import score_reply

    env_score = score_reply(f"\\boxed{{{answer}}}", truth, format_reward=0.0, grader=shared_grader())
    [reward] = math_accuracy([reply(f"\\boxed{{{answer}}}")], reward_model=[{"ground_truth": truth}])
    assert reward == env_score.reward


def test_math_accuracy_called_off_the_main_thread_grades_a_pathological_answer_as_wrong():
    # Off the main thread math-verify has no time limit of its own, and sympy holds the GIL on this
    # power for minutes: only a grader in other processes returns. A child process, so that a
    # reward that hangs fails this test instead of hanging the test run.
    script = textwrap.dedent(
        """
        import threading
        from agentrl.rewards.builtin import math_accuracy

        completions = [[{"role": "assistant", "content": "\\\\boxed{9^{9^{9^{9}}}}"}]] * 2
        scores = []
        worker = threading.Thread(target=lambda: scores.extend(
            math_accuracy(completions, reward_model=[{"ground_truth": "3"}] * 2)
        ))
        worker.start()
        worker.join()
        print(scores)
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=120
    )
    assert child.stdout.strip().splitlines()[-1] == "[0.0, 0.0]"


def test_code_pass_rate_runs_the_tests_in_the_sandbox():
    truth = json.dumps({"inputs": [[1, 2], [3, 4], [5, 5]], "outputs": [3, 7, 10], "fn_name": "add"})
    completions = [
        reply("```python\ndef add(a, b):\n    return a + b\n```"),
        reply("```python\ndef add(a, b):\n    return 3 if a == 1 else 7\n```"),
        reply("no code"),
    ]
    pass_rate = CodePassRate(backend="bwrap")
    assert pass_rate(completions, reward_model=[{"ground_truth": truth}] * 3) == [1.0, 2 / 3, 0.0]


def test_code_pass_rate_pays_nothing_to_the_code_probes():
    truth = {"entry_point": "add", "hidden_tests": [{"kind": "call", "args": [1, 2], "expected": 3}]}
    completions = [reply(probe.replies[0]) for probe in code_probes("add")]
    scores = CodePassRate(backend="bwrap")(
        completions, reward_model=[{"ground_truth": truth}] * len(completions)
    )
    assert scores == [0.0] * len(completions)


def test_code_pass_rate_runs_the_tasks_preamble_before_the_reply():
    # A HumanEval row's preamble holds the prompt's helpers; a reply may call them without copying them.
    truth = {
        "entry_point": "double",
        "preamble": "def helper(x):\n    return 2 * x\n\n\n",
        "hidden_tests": [{"kind": "call", "args": [3], "expected": 6}],
    }
    completions = [reply("```python\ndef double(x):\n    return helper(x)\n```")]
    assert CodePassRate(backend="bwrap")(completions, reward_model=[{"ground_truth": truth}]) == [1.0]
