r"""Debugger: the command language, shared by the interactive prompt and `--script` files.

step              the policy takes the next turn (with --policy human: type it)
say TEXT          commit TEXT as the next assistant turn, whatever the policy
sample K          K samples of the current turn side by side, each with the env's reward,
                  status and info (tried on a fresh env), none committed
pick I            commit sample I of the last `sample`
rewind K          go back to just before turn K (then `say` an edited action, or `step`)
temperature T     sampling temperature of later samples
show              the conversation and the whole token sequence so far
save PATH         append the episode to PATH as a trajectory JSONL line (an episode the env
                  has not ended is saved as truncated_turns, as if max_turns ended it here)
help, quit        (on a terminal: Ctrl-C cancels a command or drops the line; Ctrl-C again
                  at an empty prompt, or Ctrl-D, leaves)

Quoting: `say` takes the rest of the line as it is typed, so `say a\nb` sends a backslash and
an n. Quoted, `say "a\nb"` (or 'a\nb') turns each \n into a newline and keeps leading and
trailing spaces; inside double quotes \" is a quote and \\ a backslash.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from pathlib import Path

from rich.console import Console

from agentrl.debug import display
from agentrl.debug.session import DebugSession

ReadAction = Callable[[], Awaitable[str]]  # reads a typed turn (--policy human on a terminal)

COMMANDS = ("step", "say", "sample", "pick", "rewind", "temperature", "show", "save", "help", "quit")


class Quit(Exception):
    """The user asked to leave."""


def _show_turn(session: DebugSession, console: Console, start: int) -> None:
    episode = session.episode
    console.print(
        display.turn_view(
            session.setup.template,
            episode.trajectory,
            episode.messages,
            session.setup.budgets,
            episode.done,
            start,
        )
    )


def show_all(session: DebugSession, console: Console) -> None:
    episode, template = session.episode, session.setup.template
    trajectory = episode.trajectory
    console.print(display.prompt_view(template, trajectory, episode.messages, episode.done))
    if trajectory.turns:
        for number, sample in enumerate(trajectory.samples()):
            if number:
                console.print(f"── new sample: history rewritten ── {len(sample.prompt_ids)} prompt tokens")
            console.print(
                display.token_table(
                    template,
                    sample.response_ids,
                    sample.loss_mask,
                    sample.rollout_logprobs,
                    len(sample.prompt_ids),
                )
            )
        console.print(
            display.budgets_line(trajectory, session.setup.budgets, len(trajectory.turns[-1].completion_ids))
        )


def _one_number(argument: str, command: str, kind: Callable = int):
    try:
        return kind(argument)
    except ValueError:
        raise ValueError(f"`{command}` needs a number, got {argument!r} (e.g. `{command} 2`)") from None


async def run_command(
    session: DebugSession, console: Console, line: str, read_action: ReadAction | None
) -> None:
    """Run one command line; ValueError for a command that cannot run, Quit to leave."""
    words = line.strip().split(maxsplit=1)
    if not words or words[0].startswith("#"):
        return
    command, argument = words[0], (words[1] if len(words) > 1 else "")
    start = len(session.episode.trajectory.response_ids)
    if command == "step":
        if session.policy == "human":
            if read_action is None:
                raise ValueError("with --policy human a script types each turn: `say TEXT`")
            await session.say(await read_action())
        else:
            await session.step()
        _show_turn(session, console, start)
    elif command == "say":
        await session.say(_unquote(argument))
        _show_turn(session, console, start)
    elif command == "sample":
        k = _one_number(argument, "sample")
        console.print(f"sampling {k} ...")
        candidates = await session.sample(k)
        console.print(display.candidates_view(session.setup.template, candidates))
    elif command == "pick":
        await session.pick(_one_number(argument, "pick"))
        _show_turn(session, console, start)
    elif command == "rewind":
        await session.rewind(_one_number(argument, "rewind"))
        show_all(session, console)
    elif command == "temperature":
        session.set_temperature(_one_number(argument, "temperature", float))
        console.print(f"temperature: {session.sampling.temperature:g}")
    elif command == "show":
        show_all(session, console)
    elif command == "save":
        if not argument:
            raise ValueError("`save` needs a path, e.g. `save episode.jsonl`")
        saved = session.save(Path(argument))
        console.print(f"saved to {argument} (status {saved.status.value}, {len(saved.turns)} turns)")
    elif command == "help":
        console.print(__doc__)
    elif command == "quit":
        raise Quit
    else:
        raise ValueError(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")


def _unquote(argument: str) -> str:
    """`say "a b"` and `say a b` both type `a b`; quotes allow leading spaces and \\n escapes."""
    if not argument:
        raise ValueError("`say` needs the turn's text, e.g. `say \\boxed{8}` (`help` explains quoting)")
    if argument[0] not in "\"'":
        return argument
    try:
        words = shlex.split(argument)
    except ValueError as error:  # e.g. "No closing quotation"
        raise ValueError(f"`say {argument}`: {error} (`help` explains quoting)") from None
    if len(words) != 1:
        raise ValueError(f"`say {argument}`: quote the whole turn as one string (`help` explains quoting)")
    return words[0].replace("\\n", "\n")
