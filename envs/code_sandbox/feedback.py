"""Environment stage of the code env: tell the model what failed, or that it wrote no program.

The observation after a failed attempt carries only what a programmer could act on: the verdict,
the first failing visible test's input, the expected against the actual output, and the start
of stderr. Hidden tests never appear in feedback. Which block of a reply is the program is
decided in `agentrl.parsing.code_blocks`, for the env and the rewards alike.
"""

from __future__ import annotations

import json

from agentrl.parsing.code_blocks import FENCE_LABELS
from sandbox.types import AssertTest, CallTest, Language, StdioTest, Test, TestResult, Verdict

MAX_FIELD_CHARS = 300  # per quoted input/output/stderr, so feedback stays a few hundred tokens
VERDICT_NAMES = {
    Verdict.WA: "wrong answer",
    Verdict.TLE: "time limit exceeded",
    Verdict.MLE: "memory limit exceeded",
    Verdict.OLE: "output limit exceeded",
    Verdict.RE: "runtime error",
    Verdict.CE: "compile error",
}
ASK_FOR_FIX = "Fix the code and reply with the complete corrected solution in one ```{label} block."
FORMAT_FEEDBACK = (
    "Your reply has no code block. Reply with the complete solution in one fenced ```{label} block."
)


def format_feedback(language: Language) -> str:
    return FORMAT_FEEDBACK.format(label=FENCE_LABELS[language][0])


def failure_feedback(test: Test, result: TestResult, entry_point: str | None, language: Language) -> str:
    """What the first failing visible test says about the program, and a request for a fix."""
    lines = [f"Your code failed a test: {VERDICT_NAMES.get(result.verdict, result.verdict.value)}."]
    if result.verdict == Verdict.CE:
        lines.append(f"Compiler output:\n{_clip(result.stderr.strip(), keep_end=True)}")
    else:
        lines.append(_describe_input(test, entry_point))
        expected = _expected(test)
        if expected is not None:
            lines.append(f"Expected: {_clip(expected)}")
        if result.verdict == Verdict.WA and isinstance(test, StdioTest):
            lines.append(f"Got: {_clip(result.stdout)}")
        elif result.verdict == Verdict.WA:
            lines.append(f"Judge: {_clip(result.message)}")  # e.g. "$: expected 5, got 6"
        if result.stderr.strip():
            lines.append(f"Error output:\n{_clip(result.stderr.strip(), keep_end=True)}")
        elif result.verdict != Verdict.WA and result.message:
            lines.append(f"Details: {_clip(result.message)}")
    lines.append(ASK_FOR_FIX.format(label=FENCE_LABELS[language][0]))
    return "\n".join(lines)


def _describe_input(test: Test, entry_point: str | None) -> str:
    if isinstance(test, StdioTest):
        return f"Input (stdin):\n{_clip(test.stdin)}"
    if isinstance(test, CallTest):
        arguments = [json.dumps(value) for value in test.args]
        arguments += [f"{name}={json.dumps(value)}" for name, value in test.kwargs.items()]
        return f"Call: {entry_point}({_clip(', '.join(arguments))})"
    assert isinstance(test, AssertTest)
    return f"Test code:\n{_clip(test.code)}"


def _expected(test: Test) -> str | None:
    if isinstance(test, StdioTest):
        return test.expected_stdout
    if isinstance(test, CallTest):
        return json.dumps(test.expected)
    return None  # an assert test states its expectation in its own code


def _clip(text: str, keep_end: bool = False) -> str:
    """At most MAX_FIELD_CHARS characters; a traceback keeps its end, where the error is."""
    if len(text) <= MAX_FIELD_CHARS:
        return text
    return "[...] " + text[-MAX_FIELD_CHARS:] if keep_end else text[:MAX_FIELD_CHARS] + " [...]"
