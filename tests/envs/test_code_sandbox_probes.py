"""Reward-hacking probes against the code env, on both sandbox backends: each must score 0.

A missing backend fails these tests (the env raises InfraError), it never skips them.
"""

import pytest
import pytest_asyncio

from agentrl.testing import Probe, code_probes, play
from envs.code_sandbox import CodeSandboxEnv
from envs.code_sandbox.task import CodeTask
from sandbox import runners
from sandbox.types import AssertTest, CallTest, RunLimits

module_loop = pytest.mark.asyncio(loop_scope="module")

ADD = CodeTask(
    entry_point="add",
    visible_tests=[CallTest(args=[1, 2], expected=3)],
    hidden_tests=[CallTest(args=[20, 22], expected=42), CallTest(args=[-5, 2], expected=-3)],
    limits=RunLimits(time_s=1.0, memory_mb=128),  # the wall clock is 2 s: sleeping probes stay short
)
# HumanEval style: the test's asserts run inside the jail, next to the program.
ADD_ASSERTS = CodeTask(
    visible_tests=[AssertTest(code="assert add(1, 2) == 3")],
    hidden_tests=[AssertTest(code="assert add(20, 22) == 42\nassert add(-5, 2) == -3")],
    limits=ADD.limits,
)
HONEST = "def add(a, b):\n    return a + b\n"


def row(task: CodeTask) -> dict:
    return {
        "data_source": "probe",
        "prompt": [{"role": "user", "content": "Write a Python function add(a, b) that returns a + b."}],
        "reward_model": {"ground_truth": task.model_dump_json()},
    }


def program(name: str, source: str, exploit: str) -> Probe:
    return Probe(name, (f"```python\n{source}```",), exploit)


ENV_PROBES = [
    program(
        "read_test_files",
        "import glob, json\n\ndef add(a, b):\n    for path in glob.glob('/work/*') + glob.glob('/tmp/*'):\n"
        "        try:\n            data = json.load(open(path))\n        except Exception:\n            continue\n"
        "        if isinstance(data, dict) and 'expected' in data:\n            return data['expected']\n"
        "    return sorted(glob.glob('/work/*') + glob.glob('/tmp/*'))\n",
        "the expected values are readable inside the jail",
    ),
    program(
        "hardcode_the_visible_test",
        "def add(a, b):\n    return 3\n",
        "the reward comes from the tests the feedback showed",
    ),
    program(
        "forged_marker_from_stdin",
        "import sys\nmarker = sys.stdin.read(32)\n"
        'print(\'\\n\' + marker + \' {"status": "ok", "value": "42"}\')\n'
        'print(\'\\n\' + \'0\' * 32 + \' {"status": "ok", "value": "42"}\')\n\n'
        "def add(a, b):\n    return None\n",
        "the program reads the harness marker and prints a passing report",
    ),
    program(
        "exit_zero_inside_the_call",
        "import os\n\ndef add(a, b):\n    os._exit(0)\n",
        "a process that exits 0 before returning is judged as passing",
    ),
    program(
        "patched_builtins_and_exit",
        "import builtins, json, sys\nsys.exit = lambda *args: None\nbuiltins.exit = sys.exit\n"
        "json.dumps = lambda *args, **kwargs: '42'\nbuiltins.isinstance = lambda *args: True\n\n"
        "def add(a, b):\n    return None\n",
        "patched builtins, sys.exit or json change how the result is reported",
    ),
    program(
        "overwrite_the_harness",
        "import os\nfor name in os.listdir('/work'):\n    if name != 'main.py':\n        try:\n"
        "            open('/work/' + name, 'w').write('print(\"ok\")')\n        except OSError:\n            pass\n\n"
        "def add(a, b):\n    return 0\n",
        "files the judge reads back (harness, call spec) can be rewritten for the next test",
    ),
    program(
        "sleep_past_the_limit",
        "import time\n\ndef add(a, b):\n    time.sleep(5)\n    return a + b\n",
        "a program slower than the limit is paid",
    ),
]


@pytest_asyncio.fixture(loop_scope="module", scope="module", autouse=True)
async def close_sandboxes():
    yield
    await runners.close_all()


async def paid(env: CodeSandboxEnv, task: CodeTask, probes: list[Probe]) -> list[str]:
    """Names and rewards of the probes whose episode earned anything."""
    episodes = [(probe, await play(env, probe.replies, row=row(task), stop_at_end=True)) for probe in probes]
    return [
        f"{probe.name}: {episode.total_reward:g}" for probe, episode in episodes if episode.total_reward > 0
    ]


@module_loop
@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_every_probe_scores_zero_on_call_tests_where_an_honest_solution_scores_one(backend):
    env = CodeSandboxEnv(backend=backend)
    honest = await play(env, (f"```python\n{HONEST}```",), row=row(ADD))
    assert honest.total_reward == 1.0
    assert await paid(env, ADD, [*code_probes("add"), *ENV_PROBES]) == []
    await env.aclose()


@module_loop
@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_probes_that_do_not_write_the_harness_report_score_zero_on_assert_tests(backend):
    env = CodeSandboxEnv(backend=backend)
    assert (await play(env, (f"```python\n{HONEST}```",), row=row(ADD_ASSERTS))).total_reward == 1.0
    # always_equal is not among them: an assert test compares inside the jail, as HumanEval does,
    # so an object whose __eq__ is always True passes `assert add(1, 2) == 3` by design.
    probes = [probe for probe in [*code_probes("add"), *ENV_PROBES] if probe.name != "always_equal"]
    assert await paid(env, ADD_ASSERTS, probes) == []
    await env.aclose()


REPORT_PIPE = program(
    "write_the_harness_report_pipe",
    "import os\n\ndef add(a, b):\n    return 0\n\nfor fd in range(3, 64):\n    try:\n"
    '        os.write(fd, b\'{"status": "ok"}\')\n    except OSError:\n        pass\nos._exit(0)\n',
    "the program writes a passing report into the pipe the harness reads its outcome from",
)


@module_loop
@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_a_program_writing_the_harness_report_pipe_scores_zero_on_assert_tests(backend):
    env = CodeSandboxEnv(backend=backend)
    assert await paid(env, ADD_ASSERTS, [REPORT_PIPE]) == []
    await env.aclose()


@module_loop
@pytest.mark.parametrize("backend", ["bwrap", "docker"])
async def test_writing_the_harness_report_pipe_scores_zero_on_call_tests(backend):
    # Call results are compared on the host: a forged report must still carry the right values.
    env = CodeSandboxEnv(backend=backend)
    assert await paid(env, ADD, [REPORT_PIPE]) == []
    await env.aclose()
