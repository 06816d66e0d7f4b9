"""`python -m agentrl.debug` on a real pseudo-terminal: the prompt, completion, history and Ctrl-C/Ctrl-D."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pexpect
import pytest

ROOT = Path(__file__).resolve().parents[2]
MATH = ["env=math", "env.kwargs.max_attempts=2", "--row", "3"]  # row 3 asks "What is 2 * 4?"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
PROMPT = "debug>"
HANG_GUARD_S = 180  # only a hang trips it: every expected text appears within seconds


class Terminal:
    """The debugger on a pseudo-terminal; `run` types a line and returns what the screen showed."""

    def __init__(self, args: list[str]) -> None:
        env = dict(os.environ, TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1")  # pexpect answers no CPR
        self.child = pexpect.spawn(
            sys.executable, ["-m", "agentrl.debug", *args],
            cwd=ROOT, env=env, encoding="utf-8", timeout=HANG_GUARD_S, dimensions=(60, 220),
        )  # fmt: skip
        self.expect(PROMPT)

    def expect(self, text: str) -> str:
        """Wait for `text` on the screen; the screen text (colours stripped) up to and including it."""
        self.child.expect_exact(text)
        return ANSI.sub("", self.child.before + self.child.after)

    def run(self, line: str, last: str) -> str:
        """Type `line` and Enter; what the screen showed until the prompt after its `last` text."""
        self.child.sendline(line)
        shown = self.expect(last)
        return shown + self.expect(PROMPT).removesuffix(PROMPT)

    def leave(self) -> tuple[int, str]:
        """The exit status and the rest of the screen once the debugger has exited."""
        self.child.expect(pexpect.EOF)
        rest = ANSI.sub("", self.child.before)
        self.child.close()
        return self.child.exitstatus, rest


@pytest.mark.slow
def test_every_command_runs_at_the_prompt_with_completion_and_history(tmp_path):
    terminal = Terminal(MATH)
    shown = terminal.run("help", "trailing spaces")
    assert 'say "a\\nb"' in shown and "Ctrl-C" in shown

    shown = terminal.run("say \\boxed{5}", "this turn 5/48 new tokens")
    assert "reward: 0 (episode 0), finish: stop" in shown
    assert "status: running, terminated=False, truncated=False" in shown

    shown = terminal.run('say "\\boxed{8}\\nok"', "new tokens")
    assert "assistant: \\boxed{8}\nok" in shown  # quoted: \n became a newline
    assert "reward: 1 (episode 1), finish: stop" in shown

    shown = terminal.run("show", "budgets:")
    assert (
        "assistant: \\boxed{5}\nuser: Your answer is incorrect. Try again.\nassistant: \\boxed{8}\nok"
        in shown
    )

    saved = tmp_path / "episode.jsonl"
    shown = terminal.run(f"save {saved}", "turns)")
    assert f"saved to {saved} (status completed, 2 turns)" in shown
    assert json.loads(saved.read_text())["status"] == "completed"

    shown = terminal.run("rewind 1", "status: running")
    assert "── prompt ──" in shown

    shown = terminal.run("temperature 0.7", "temperature: 0.7")
    shown = terminal.run("sample 3", "2: info")
    rows = re.findall(
        r"^│ ([0-2]) │.*│ (\d+(?:\.\d+)?) +│ (completed|running) +│$", shown, flags=re.MULTILINE
    )
    assert [row[0] for row in rows] == ["0", "1", "2"]
    infos = [json.loads(info) for info in re.findall(r"^[0-2]: info (\{.*\})$", shown, flags=re.MULTILINE)]
    for (_, reward, status), info in zip(rows, infos, strict=True):  # the env's verdict explains each row
        assert (float(reward), status) == ((1.0, "completed") if info["correct"] else (0.0, "running"))

    shown = terminal.run("pick 1", "new tokens")
    assert "── turn 1 ──" in shown

    shown = terminal.run("rewind 1", "status: running")
    shown = terminal.run("step", "new tokens")
    assert "── turn 1 ──" in shown and "finish: stop" in shown

    terminal.child.send("temp")
    terminal.expect(" temperature ")  # the completion menu offers it
    terminal.child.send("\t")
    terminal.run(" 0.3", "temperature: 0.3")
    terminal.run("show", "budgets:")
    terminal.child.send("\x1b[A")  # up: history brings back `show`, then `temperature 0.3`
    terminal.expect("show")
    terminal.child.send("\x1b[A")
    terminal.expect("temperature 0.3")
    terminal.run("", "temperature: 0.3")

    terminal.child.sendline("quit")
    status, rest = terminal.leave()
    assert status == 0
    assert "Traceback" not in rest


@pytest.mark.slow
def test_ctrl_c_cancels_a_long_sample_and_the_session_goes_on_then_two_leave_with_130():
    terminal = Terminal([*MATH, "rollout.max_new_tokens_per_turn=200", "rollout.max_tokens_per_episode=1024"])
    terminal.run("temperature 2.5", "temperature: 2.5")
    terminal.child.sendline("sample 500")  # minutes of sampling on a CPU
    terminal.expect("sampling 500 ...")
    terminal.child.sendcontrol("c")
    shown = terminal.expect("to leave)")
    assert (
        "(Ctrl-C: `sample 500` cancelled; the episode has 0 turns; Ctrl-C again, or Ctrl-D, to leave)"
        in shown
    )
    terminal.expect(PROMPT)

    shown = terminal.run("pick 0", "first")
    assert "error: no samples to pick from: run `sample K` first" in shown
    shown = terminal.run("say \\boxed{8}", "new tokens")
    assert "reward: 1 (episode 1), finish: stop" in shown

    terminal.child.send("sample 2")
    terminal.child.sendcontrol("c")  # with text typed: the line is dropped
    terminal.expect("(Ctrl-C: line dropped)")
    terminal.expect(PROMPT)
    terminal.child.sendcontrol("c")  # at an empty prompt: a note
    terminal.expect("(Ctrl-C again, or Ctrl-D, to leave)")
    terminal.expect(PROMPT)
    terminal.child.sendcontrol("c")
    status, rest = terminal.leave()
    assert status == 130
    assert "Traceback" not in rest


@pytest.mark.slow
def test_a_typed_turn_is_read_at_the_prompt_ctrl_c_cancels_it_and_ctrl_d_leaves_with_0():
    terminal = Terminal([*MATH, "--policy", "human"])
    terminal.child.sendline("step")
    terminal.expect("assistant>")
    terminal.child.sendcontrol("c")
    shown = terminal.expect("to leave)")
    assert "(Ctrl-C: `step` cancelled; the episode has 0 turns" in shown
    terminal.expect(PROMPT)

    terminal.child.sendline("step")
    terminal.expect("assistant>")
    shown = terminal.run("\\boxed{8}", "new tokens")
    assert "reward: 1 (episode 1), finish: stop" in shown

    shown = terminal.run("say", "quoting)")
    assert "error: `say` needs the turn's text" in shown
    terminal.child.sendcontrol("d")
    status, rest = terminal.leave()
    assert status == 0
    assert "Traceback" not in rest
