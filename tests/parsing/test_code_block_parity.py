"""One program per reply: the code_sandbox env and the code_pass_rate reward run the same block.

Every block of a probe reply defines `which()`. The block that should be the program returns
"program" and the others return something else, so the hidden test `which() == "program"`
passes exactly when the consumer ran the right block. In replies that hold no program, every
block returns "program": running any of them would be caught as a pass.
"""

import asyncio

from agentrl.rewards.code_tests import CodePassRate
from envs.code_sandbox import CodeSandboxEnv, CodeTask
from sandbox.types import CallTest, RunLimits

TASK = CodeTask(
    entry_point="which",
    hidden_tests=[CallTest(args=[], expected="program")],
    limits=RunLimits(time_s=10.0, memory_mb=256),  # generous: these tests run on a busy machine
)
ROW = {
    "data_source": "test",
    "prompt": [{"role": "user", "content": "Write which()."}],
    "reward_model": {"ground_truth": TASK.model_dump_json()},
}


def block(tag: str, returns: str) -> str:
    return f"```{tag}\ndef which():\n    return {returns!r}\n```"


UNCLOSED = "```python\ndef which():\n    return 'program'\n"
HAS_PROGRAM = {
    "python": block("python", "program"),
    "untagged only": block("", "program"),
    "python then its output untagged": block("python", "program") + "\nIt prints:\n" + block("", "output"),
    "untagged then python": block("", "untagged") + "\n" + block("python", "program"),
    "python then a text block": block("python", "program") + "\n" + block("text", "text"),
    "python then a bash block": block("python", "program") + "\nRun:\n" + block("bash", "bash"),
    "a draft then the fix": block("python", "draft") + "\nFixed:\n" + block("py", "program"),
    "an upper-case tag": block("Python", "program"),
    "python then an unclosed fence": block("python", "program") + "\n" + UNCLOSED.replace("program", "cut"),
    "python then a blank python block": block("python", "program") + "\n```python\n\n```",
}
NO_PROGRAM = {
    "another language only": block("text", "program"),
    "an unclosed fence only": UNCLOSED,
    "no fence": "def which():\n    return 'program'\n",
}
PROBES = {**HAS_PROGRAM, **NO_PROGRAM}


async def env_outcomes() -> dict[str, tuple[float, bool]]:
    """(reward, has a code block) of a one-turn episode per probe."""
    env = CodeSandboxEnv(backend="bwrap", max_turns=1)
    outcomes = {}
    for name, reply in PROBES.items():
        await env.areset(options=ROW)
        _, reward, _, _, info = await env.astep(reply)
        outcomes[name] = (reward, info["has_code_block"])
    await env.aclose()
    return outcomes


def test_the_code_env_and_the_code_pass_rate_reward_run_the_same_block_of_a_reply():
    env = asyncio.run(env_outcomes())
    completions = [[{"role": "assistant", "content": reply}] for reply in PROBES.values()]
    scores = CodePassRate(backend="bwrap")(completions, reward_model=[ROW["reward_model"]] * len(PROBES))
    ran_the_program = {
        name: {"env found a program": has_code, "env ran it": reward == 1.0, "reward ran it": score == 1.0}
        for (name, (reward, has_code)), score in zip(env.items(), scores, strict=True)
    }
    assert ran_the_program == {
        name: dict.fromkeys(["env found a program", "env ran it", "reward ran it"], name in HAS_PROGRAM)
        for name in PROBES
    }
