import ast
import asyncio
import gzip
import json
from pathlib import Path

import pytest
import pytest_asyncio

from agentrl.data import load_rows
from agentrl.env import make
from agentrl.testing import play
from envs.code_sandbox import CodeSandboxEnv
from envs.code_sandbox.convert import main as convert
from envs.code_sandbox.loaders import load_apps, load_codecontests, load_humaneval, load_mbpp, load_verl
from envs.code_sandbox.task import CodeTask
from sandbox import runners
from sandbox.types import AssertTest, CallTest, StdioTest

module_loop = pytest.mark.asyncio(loop_scope="module")

HUMANEVAL = {
    "task_id": "HumanEval/0",
    "prompt": 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n',
    "canonical_solution": "    return sum(xs)\n",
    "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n",
    "entry_point": "total",
}
MBPP = {
    "task_id": 2,
    "text": "Write a function to double a number.",
    "code": "def double(x):\n    return 2 * x",
    "test_list": ["assert double(2) == 4", "assert double(0) == 0", "assert double(-3) == -6"],
    "test_setup_code": "",
}
APPS = {
    "problem_id": 7,
    "question": "Print the sum of two integers.",
    "input_output": json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}),
    "starter_code": "",
}
CONTEST = {
    "name": "sum",
    "description": "Print a + b.",
    "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
    "private_tests": {"input": ["5 5\n"], "output": ["10\n"]},
}


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def task_of(row: dict) -> CodeTask:
    return CodeTask.model_validate_json(row["reward_model"]["ground_truth"])


def test_a_humaneval_record_becomes_one_hidden_check_with_the_prompt_before_its_function_as_preamble(
    tmp_path,
):
    [row] = load_humaneval(write_jsonl(tmp_path / "he.jsonl", [HUMANEVAL]))
    task = task_of(row)
    assert (task.entry_point, task.preamble, task.visible_tests) == (
        "total",
        "from typing import List\n\n\n",
        [],
    )
    assert task.hidden_tests == [
        AssertTest(code="from typing import List\n\n\n" + HUMANEVAL["test"] + "\ncheck(total)\n")
    ]
    assert row["prompt"][0]["content"].endswith("```python\n" + HUMANEVAL["prompt"] + "```")
    assert (row["data_source"], row["extra_info"]) == ("humaneval", {"index": 0, "task_id": "HumanEval/0"})


HELPER_PROMPT = (
    "import math\n\n\ndef poly(xs: list, x: float):\n    return sum(c * x**i for i, c in enumerate(xs))\n\n\n"
    'def find_zero(xs: list):\n    """A zero of poly(xs)."""\n'
)


def test_a_humaneval_preamble_keeps_the_helpers_the_prompt_defines_before_the_asked_function(tmp_path):
    record = {**HUMANEVAL, "prompt": HELPER_PROMPT, "entry_point": "find_zero"}
    [row] = load_humaneval(write_jsonl(tmp_path / "he.jsonl", [record]))
    assert task_of(row).preamble == HELPER_PROMPT.split("def find_zero")[0]
    with pytest.raises(
        ValueError, match="he.jsonl row 0: column 'prompt' does not define the entry point 'zero'"
    ):
        load_humaneval(write_jsonl(tmp_path / "he.jsonl", [{**record, "entry_point": "zero"}]))


def test_an_mbpp_record_shows_its_first_assert_and_hides_all_of_them(tmp_path):
    [row] = load_mbpp(write_jsonl(tmp_path / "mbpp.jsonl", [MBPP]))
    task = task_of(row)
    assert task.visible_tests == [AssertTest(code="assert double(2) == 4\n")]
    assert [test.code for test in task.hidden_tests] == [test + "\n" for test in MBPP["test_list"]]
    assert "Your code should pass this test:\nassert double(2) == 4\n" in row["prompt"][0]["content"]


def test_apps_and_codecontests_records_become_stdin_stdout_tests(tmp_path):
    [apps] = load_apps(write_jsonl(tmp_path / "apps.jsonl", [APPS]))
    assert task_of(apps).hidden_tests == [
        StdioTest(stdin="1 2\n", expected_stdout="3\n"),
        StdioTest(stdin="3 4\n", expected_stdout="7\n"),
    ]
    assert task_of(apps).visible_tests == task_of(apps).hidden_tests[:1]
    assert "Read the input from stdin" in apps["prompt"][0]["content"]
    [contest] = load_codecontests(write_jsonl(tmp_path / "cc.jsonl", [CONTEST]))
    assert task_of(contest).visible_tests == [StdioTest(stdin="1 2\n", expected_stdout="3\n")]
    assert len(task_of(contest).hidden_tests) == 2


def test_an_apps_record_with_fn_name_becomes_call_tests(tmp_path):
    cases = {"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}
    [row] = load_apps(write_jsonl(tmp_path / "apps.jsonl", [{**APPS, "input_output": cases}]))
    task = task_of(row)
    assert task.entry_point == "add"
    assert task.hidden_tests == [CallTest(args=[1, 2], expected=3), CallTest(args=[3, 4], expected=7)]


@pytest.mark.parametrize(
    ("loader", "record", "message"),
    [
        (
            load_humaneval,
            {**HUMANEVAL, "entry_point": None},
            "rows.jsonl row 1: column 'entry_point' must be str",
        ),
        (
            load_mbpp,
            {**MBPP, "test_list": []},
            "rows.jsonl row 1: column 'test_list' must be a non-empty list",
        ),
        (
            load_mbpp,
            {k: v for k, v in MBPP.items() if k != "text"},
            "rows.jsonl row 1: column 'text' is missing",
        ),
        (
            load_apps,
            {**APPS, "input_output": '{"inputs": ["1"]}'},
            "rows.jsonl row 1: column 'input_output' is not a set of test cases",
        ),
        (
            load_codecontests,
            {**CONTEST, "public_tests": {"input": ["1"], "output": []}},
            "rows.jsonl row 1: column 'public_tests' must be",
        ),
    ],
)
def test_a_malformed_record_is_reported_with_file_row_and_column(tmp_path, loader, record, message):
    good = {load_humaneval: HUMANEVAL, load_mbpp: MBPP, load_apps: APPS, load_codecontests: CONTEST}[loader]
    with pytest.raises(ValueError, match=message):
        loader(write_jsonl(tmp_path / "rows.jsonl", [good, record]))


def verl_row(ground_truth) -> dict:
    return {
        "data_source": "codecontests",
        "prompt": [{"role": "user", "content": "Print a + b."}],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": 0},
    }


def test_verl_parquet_rows_are_kept_and_a_bad_ground_truth_names_its_row(tmp_path):
    good = verl_row(json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}))
    path = tmp_path / "verl.jsonl"
    convert(
        [
            "--format",
            "codecontests",
            write_jsonl(tmp_path / "cc.jsonl", [CONTEST]),
            str(tmp_path / "cc.parquet"),
        ]
    )
    assert load_rows(tmp_path / "cc.parquet")[0]["data_source"] == "codecontests"
    assert load_verl(write_jsonl(path, [good])) == [good]
    bad = verl_row(json.dumps({"inputs": ["1 2\n"], "outputs": []}))
    with pytest.raises(
        ValueError, match="verl.jsonl row 1: column 'reward_model.ground_truth': verl test cases"
    ):
        load_verl(write_jsonl(path, [good, bad]))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env():
    env = CodeSandboxEnv(backend="bwrap", max_turns=2)
    yield env
    await env.aclose()
    await runners.close_all()


@module_loop
async def test_converted_rows_of_every_layout_reward_their_reference_solution(tmp_path, env):
    solutions = {
        "humaneval": "def total(xs: List[int]) -> int:\n    return sum(xs)\n",
        "mbpp": "def double(x):\n    return 2 * x\n",
        "apps": "a, b = map(int, input().split())\nprint(a + b)\n",
        "codecontests": "a, b = map(int, input().split())\nprint(a + b)\n",
    }
    loaders = {
        "humaneval": load_humaneval,
        "mbpp": load_mbpp,
        "apps": load_apps,
        "codecontests": load_codecontests,
    }
    records = {"humaneval": HUMANEVAL, "mbpp": MBPP, "apps": APPS, "codecontests": CONTEST}
    rewards = {}
    for name, loader in loaders.items():
        [row] = loader(write_jsonl(tmp_path / f"{name}.jsonl", [records[name]]))
        episode = await play(env, (f"```python\n{solutions[name]}```",), row=row)
        rewards[name] = episode.total_reward
    verl = verl_row(json.dumps({"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}))
    rewards["verl"] = (await play(env, (f"```python\n{solutions['apps']}```",), row=verl)).total_reward
    assert rewards == {"humaneval": 1.0, "mbpp": 1.0, "apps": 1.0, "codecontests": 1.0, "verl": 1.0}


@module_loop
async def test_a_humaneval_reply_with_only_the_asked_function_may_call_the_prompts_helper(tmp_path, env):
    test = "def check(candidate):\n    assert abs(poly([-2, 0, 1], candidate([-2, 0, 1]))) < 1e-6\n"
    record = {**HUMANEVAL, "prompt": HELPER_PROMPT, "entry_point": "find_zero", "test": test}
    [row] = load_humaneval(write_jsonl(tmp_path / "he.jsonl", [record]))
    solution = (
        "def find_zero(xs: list):\n    low, high = 0.0, 10.0\n    for _ in range(100):\n"
        "        middle = (low + high) / 2\n"
        "        if poly(xs, low) * poly(xs, middle) <= 0:\n            high = middle\n"
        "        else:\n            low = middle\n    return low\n"
    )
    episode = await play(env, (f"```python\n{solution}```",), row=row)
    assert episode.total_reward == 1.0
    # The test's `poly` is the prompt's: a wrong answer cannot bring a `poly` that agrees with it.
    forged = "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 12345.0\n"
    assert (await play(env, (f"```python\n{forged}```",), row=row)).total_reward == 0.0


HUMANEVAL_DATA = Path(__file__).parents[1] / "sandbox" / "data" / "HumanEval.jsonl.gz"


def only_the_asked_function(problem: dict) -> str:
    """The entry point's definition alone, as a model that leaves out the prompt's helpers writes it."""
    source = problem["prompt"] + problem["canonical_solution"]
    [function] = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == problem["entry_point"]
    ]
    return ast.get_source_segment(source, function) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_every_humaneval_canonical_solution_earns_reward_one_through_the_code_env(tmp_path, backend):
    """HumanEval/10, /32, /38 and /50 call a helper that only the prompt defines."""
    with gzip.open(HUMANEVAL_DATA, "rt", encoding="utf-8") as data:
        problems = [json.loads(line) for line in data]
    rows = load_humaneval(write_jsonl(tmp_path / "HumanEval.jsonl", problems))

    async def rewards() -> list[float]:
        async def one(problem: dict, row: dict) -> float:
            env = make("code_sandbox", backend=backend, max_concurrency=2)
            reply = f"```python\n{only_the_asked_function(problem)}```"
            return (await play(env, (reply,), row=row)).total_reward

        try:
            return await asyncio.gather(*(one(problem, row) for problem, row in zip(problems, rows)))
        finally:
            await runners.close_all()

    earned = asyncio.run(rewards())
    below_one = [(problem["task_id"], reward) for problem, reward in zip(problems, earned) if reward != 1.0]
    assert (len(earned), below_one) == (164, [])
