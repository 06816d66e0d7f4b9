"""Environment stage: the typed exception an env raises when its infrastructure fails.

The failure boundary decides what training does with an episode. A wrong answer, a malformed
tool call or a program that crashes is the model's doing and stays trainable data. A sandbox
that cannot run the program, a tool's backing service that is down, or any other outage the
model did not cause is signalled by raising `InfraError` from `reset`/`step` (or their async
variants): the agent loop retries such an episode with the same task and seed a bounded number
of times, then excludes it from group statistics and the loss and counts it. `EnvAborted`
carries a `SystemExit` or `KeyboardInterrupt` that env code raised, so that it ends only its
episode.
"""

from __future__ import annotations


class InfraError(Exception):
    """The infrastructure behind an env failed (sandbox, tool service); not the model's fault."""


class EnvAborted(Exception):
    """Env code raised `SystemExit`, `KeyboardInterrupt` or another `BaseException` that is not an `Exception`.

    The agent loop runs env code on threads of its own, and signals are delivered only to the
    main thread, so such an exception is the env's own doing, never the user's Ctrl-C: it becomes
    the episode's env_error instead of ending the process.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
        self.error = error
