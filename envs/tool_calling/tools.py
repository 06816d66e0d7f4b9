"""Environment stage (tool_calling): a tool is a typed Python function with a docstring.

`Tool.from_function(fn)` derives everything else from the function itself, so the schema the
model sees cannot drift from the code that runs: pydantic builds one model of the function's
parameters (type hints, defaults, and descriptions given as
`Annotated[str, Field(description=...)]`); that model both validates the arguments the model
sends and produces the JSON schema the chat template renders. The tool's description is the
docstring's first paragraph.

`Tool.call(arguments)` never raises for the model's mistakes: invalid arguments, a tool that
raises and a tool that runs past its timeout all come back as a `ToolOutcome` whose text tells
the model what went wrong. Only `InfraError` (the tool's backing service is down) propagates.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.json_schema import GenerateJsonSchema

from agentrl.env import InfraError
from agentrl.env.threads import run_in_daemon_thread


class ToolTimeoutError(Exception):
    """Raised by a tool that enforces its own time limit (e.g. a sandboxed program ran too long)."""


@dataclass(frozen=True)
class ToolOutcome:
    """What one call produced: the text returned to the model, and whether it was an error."""

    content: str
    is_error: bool


@dataclass(frozen=True)
class Tool:
    """A callable tool: its OpenAI-style schema, an argument validator and a time limit."""

    name: str
    function: Callable[..., Any]  # sync or async; its return value is shown to the model with str()
    schema: dict[str, Any]  # {"type": "function", "function": {name, description, parameters}}
    arguments_model: type[BaseModel]
    timeout_s: float

    @classmethod
    def from_function(cls, function: Callable[..., Any], timeout_s: float = 10.0) -> Tool:
        """Wrap a type-hinted function with a docstring; its name is the tool's name."""
        if not timeout_s > 0:
            raise ValueError(f"tool timeout_s must be > 0 seconds, got {timeout_s!r}")
        docstring = inspect.getdoc(function)
        if not docstring:
            raise ValueError(
                f"tool {function.__name__} needs a docstring: its first paragraph tells the model what it does"
            )
        arguments_model = _arguments_model(function)
        description = " ".join(docstring.split("\n\n")[0].split())
        schema = {
            "type": "function",
            "function": {
                "name": function.__name__,
                "description": description,
                "parameters": _parameters_schema(arguments_model),
            },
        }
        return cls(function.__name__, function, schema, arguments_model, float(timeout_s))

    async def call(self, arguments: dict[str, Any]) -> ToolOutcome:
        """Validate `arguments`, run the function within `timeout_s`, describe any failure."""
        try:
            validated = self.arguments_model.model_validate(arguments)
        except ValidationError as error:
            return ToolOutcome(f"Error: invalid arguments for {self.name}: {_describe(error)}.", True)
        keyword_arguments = {key: getattr(validated, key) for key in type(validated).model_fields}
        try:
            result = await asyncio.wait_for(self._invoke(keyword_arguments), self.timeout_s)
        except TimeoutError:
            return ToolOutcome(f"Error: {self.name} timed out after {self.timeout_s:g} s.", True)
        except ToolTimeoutError as error:
            return ToolOutcome(f"Error: {self.name} timed out ({error}).", True)
        except InfraError:
            raise  # not the model's doing: the episode is retried, not graded
        except Exception as error:  # noqa: BLE001 - any failure of the tool is feedback for the model
            return ToolOutcome(f"Error: {self.name} failed: {type(error).__name__}: {error}", True)
        return ToolOutcome(str(result), False)

    async def _invoke(self, keyword_arguments: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.function):
            return await self.function(**keyword_arguments)
        # A sync tool runs on its own daemon thread so the event loop keeps serving other
        # episodes, and one that hangs past its timeout is abandoned without holding a pool slot.
        return await run_in_daemon_thread(self.function, **keyword_arguments)


def _arguments_model(function: Callable[..., Any]) -> type[BaseModel]:
    """A strict pydantic model of the function's parameters: no coercion, no extra keys."""
    fields: dict[str, Any] = {}
    hints = inspect.get_annotations(function, eval_str=True)
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ValueError(f"tool {function.__name__} must not take *args or **kwargs (no schema for them)")
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (hints.get(parameter.name, Any), default)
    config = ConfigDict(strict=True, extra="forbid")
    return create_model(f"{function.__name__}_arguments", __config__=config, **fields)


class _UntitledSchema(GenerateJsonSchema):
    """Pydantic's JSON schema without the titles it derives from field names (noise in a prompt)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _parameters_schema(arguments_model: type[BaseModel]) -> dict[str, Any]:
    """The `parameters` object of an OpenAI function schema, in the usual key order."""
    generated = arguments_model.model_json_schema(schema_generator=_UntitledSchema)
    parameters: dict[str, Any] = {"type": "object", "properties": generated["properties"]}
    if generated.get("required"):
        parameters["required"] = generated["required"]
    if "$defs" in generated:  # nested pydantic models or enums referenced from the properties
        parameters["$defs"] = generated["$defs"]
    return parameters


def _describe(error: ValidationError) -> str:
    """Pydantic's errors in a line a model can act on: `'x' is required; 'y' must be ...`."""
    problems = []
    for item in error.errors(include_url=False):
        location = ".".join(str(part) for part in item["loc"])
        if item["type"] == "missing":
            problems.append(f"'{location}' is required")
        elif item["type"] == "extra_forbidden":
            problems.append(f"'{location}' is not an argument")
        else:
            problems.append(f"'{location}' {item['msg'].removeprefix('Input ')}, got {item['input']!r}")
    return "; ".join(problems)
