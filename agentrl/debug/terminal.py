"""Debugger: the interactive prompt on a terminal.

prompt_toolkit's async prompt runs inside the debugger's event loop, with completion of the
command names and this session's history (up arrow, Ctrl-R). Ctrl-C drops the line being typed,
or cancels the command that is running (the session keeps the episode whole) and the session goes
on. After a cancelled command, or a Ctrl-C at an empty prompt, a Ctrl-C at an empty prompt leaves
with status 130; Ctrl-D at an empty prompt, or `quit`, leaves with status 0.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import WordCompleter
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from rich.console import Console

from agentrl.debug.commands import COMMANDS, Quit, run_command
from agentrl.debug.session import DebugSession

INTERRUPTED = 130  # exit status after Ctrl-C, as a shell reports a program ended by SIGINT


class _EmptyPromptInterrupt(KeyboardInterrupt):
    """Ctrl-C at a prompt with nothing typed."""


def _ctrl_c_bindings() -> KeyBindings:
    bindings = KeyBindings()

    @bindings.add("c-c")
    def _(event: KeyPressEvent) -> None:
        typed = event.app.current_buffer.text
        event.app.exit(
            exception=KeyboardInterrupt() if typed else _EmptyPromptInterrupt(), style="class:aborting"
        )

    return bindings


async def interact(session: DebugSession, console: Console) -> int:
    """Read and run commands until `quit`, Ctrl-D or a second Ctrl-C; returns the exit status."""
    commands = PromptSession(completer=WordCompleter(list(COMMANDS)), key_bindings=_ctrl_c_bindings())
    actions = PromptSession()

    async def read_action() -> str:  # a typed turn, with --policy human
        try:
            return await actions.prompt_async("assistant> ")
        except (KeyboardInterrupt, EOFError):
            raise asyncio.CancelledError from None  # the `step` is cancelled like any command

    armed = False  # the next Ctrl-C at an empty prompt leaves
    while True:
        try:
            line = await commands.prompt_async("debug> ")
        except EOFError:  # Ctrl-D at an empty prompt
            return 0
        except _EmptyPromptInterrupt:
            if armed:
                return INTERRUPTED
            armed = True
            console.print("(Ctrl-C again, or Ctrl-D, to leave)")
            continue
        except KeyboardInterrupt:
            console.print("(Ctrl-C: line dropped)")
            continue
        armed = False
        try:
            finished = await _cancellable(run_command(session, console, line, read_action))
        except ValueError as error:
            console.print(f"error: {error}", style="red")
            continue
        except Quit:
            return 0
        if not finished:
            armed = True
            console.print(
                f"(Ctrl-C: `{line.strip()}` cancelled; the episode has "
                f"{len(session.episode.trajectory.turns)} turns; Ctrl-C again, or Ctrl-D, to leave)"
            )


async def _cancellable(command: Coroutine[Any, Any, None]) -> bool:
    """Run `command` as a task that Ctrl-C cancels; False if it was cancelled."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(command)

    def cancel_once() -> None:
        if not task.cancelling():  # one cancellation: what the task does to stay whole runs to its end
            task.cancel()

    # A Python-level handler, not loop.add_signal_handler: a prompt opened by the command (a typed
    # turn) installs its own loop handler and afterwards restores only the Python-level one.
    previous = signal.signal(signal.SIGINT, lambda signum, frame: loop.call_soon_threadsafe(cancel_once))
    try:
        await asyncio.wait([task])
    finally:
        signal.signal(signal.SIGINT, previous)
    if task.cancelled():
        return False
    task.result()  # raises what the command raised
    return True
