"""Set-up: the tool-call parser of the model this process trains, for reward functions.

Reward functions are called with TRL's signature (completions and dataset columns), which has
no place for the model's format, so the run's build site names its renderer's parser here once
and `tool_call_format` (and any user reward) reads it with `run_parser()`. Until a run sets
it, replies parse as Hermes blocks, the generic renderer's format.
"""

from __future__ import annotations

from agentrl.parsing.tool_calls import HermesToolCallParser, ToolCallParser

_run_parser: ToolCallParser = HermesToolCallParser()


def use_run_parser(parser: ToolCallParser) -> None:
    """Make `parser` the one `run_parser()` returns in this process (the build site calls it)."""
    global _run_parser
    _run_parser = parser


def run_parser() -> ToolCallParser:
    """The parser of the run's renderer; the Hermes parser before a run sets one."""
    return _run_parser
