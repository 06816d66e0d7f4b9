"""Environment stage: the typed exception an env raises when its infrastructure fails.

The failure boundary decides what training does with an episode. A wrong answer, a malformed
tool call or a program that crashes is the model's doing and stays trainable data. A sandbox
that cannot run the program, a tool's backing service that is down, or any other outage the
model did not cause is signalled by raising `InfraError` from `reset`/`step` (or their async
variants): the agent loop retries such an episode with the same task and seed a bounded number
of times, then excludes it from group statistics and the loss and counts it.
"""

from __future__ import annotations


class InfraError(Exception):
    """The infrastructure behind an env failed (sandbox, tool service); not the model's fault."""
