"""Environment stage (tool_calling): the calculator tool, evaluated by simpleeval, never `eval`.

simpleeval walks the expression's syntax tree and allows only arithmetic operators on
literals: no names, no function calls, no attribute access, and it refuses powers and strings
too large to compute quickly, so a model-written expression cannot run code or stall a worker.
Its schema is exactly the calculator the bundled tiny policy was trained to call.
"""

from __future__ import annotations

from simpleeval import SimpleEval

_EVALUATOR = SimpleEval(names={}, functions={})


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    value = _EVALUATOR.eval(expression)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"the expression must compute a number, got {type(value).__name__}")  # noqa: TRY004
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 84 / 2 reads as 42, as the model's answers are written
    return str(value) if isinstance(value, int) else format(value, ".12g")
