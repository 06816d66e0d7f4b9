"""Environment stage (terminal): a tool call's result as the text the model reads.

One home for the format, used by the env and by the example conversations the tiny policy's
corpus takes (`envs.terminal.synthetic.solved_conversations`), so both always agree. Long output
is cut to `max_chars` with a note saying how much was left out; output the sandbox cut off
(past its byte cap, which also stops the command) says so too.
"""

from __future__ import annotations

from sandbox.sessions.types import ExecResult, FileContent

DEFAULT_MAX_CHARS = 2000


def truncate(text: str, max_chars: int, cut_by_sandbox: bool = False) -> str:
    if len(text) > max_chars:
        return f"{text[:max_chars]}\n[output truncated: {len(text) - max_chars} more characters not shown]"
    if cut_by_sandbox:
        return f"{text}\n[output truncated: the command printed more than the sandbox keeps and was stopped]"
    return text


def exec_observation(result: ExecResult, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """`exit code: N`, then the non-empty streams, each truncated."""
    if result.timed_out:
        status = "timed out (the command was killed)"
    elif result.memory_exceeded:
        status = "out of memory (the command was killed)"
    elif result.exit_code is None:
        status = f"killed by signal {result.signal}"
    else:
        status = f"exit code: {result.exit_code}"
    parts = [status]
    if result.stdout:
        parts.append("stdout:\n" + truncate(result.stdout, max_chars, result.stdout_truncated))
    if result.stderr:
        parts.append("stderr:\n" + truncate(result.stderr, max_chars, result.stderr_truncated))
    return "\n".join(parts)


def write_observation(path: str, num_bytes: int) -> str:
    return f"wrote {num_bytes} bytes to {path}"


def read_observation(path: str, content: FileContent, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    if not content.exists:
        return f"Error: no such file: {path}"
    return truncate(content.data.decode(errors="replace"), max_chars, content.truncated)
