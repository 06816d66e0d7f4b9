"""The agent of `openai_agent.py` (calculator and search), written only against the `anthropic` client.

    python -m agentrl.train env=agent env.kwargs.agent=examples.anthropic_agent:solve

The tools' schemas go out as Anthropic tools (`input_schema`), its results come back as
`tool_result` blocks; the gateway renders both exactly as the tool_calling env does.
"""

from __future__ import annotations

from typing import Any

from anthropic import AsyncAnthropic

from examples.openai_agent import TOOLS, grade

ANTHROPIC_TOOLS = [
    {
        "name": tool.name,
        "description": tool.schema["function"]["description"],
        "input_schema": tool.schema["function"]["parameters"],
    }
    for tool in TOOLS.values()
]


async def solve(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """Answer one task with tool calls; 1.0 if the boxed answer is right, else 0.0."""
    client = AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict[str, Any]] = list(task["prompt"])
    async with client:
        while True:
            reply = await client.messages.create(
                model="policy", max_tokens=1024, messages=messages, tools=ANTHROPIC_TOOLS
            )
            messages.append({"role": "assistant", "content": [block.model_dump() for block in reply.content]})
            calls = [block for block in reply.content if block.type == "tool_use"]
            if not calls:
                break
            results = [
                {"type": "tool_result", "tool_use_id": call.id, "content": await _run(call.name, call.input)}
                for call in calls
            ]
            messages.append({"role": "user", "content": results})
    text = "".join(block.text for block in reply.content if block.type == "text")
    return await grade(text, task["reward_model"]["ground_truth"])


async def _run(name: str, arguments: dict[str, Any]) -> str:
    if name not in TOOLS:
        return f"Error: unknown tool {name!r}; the tools are: {', '.join(TOOLS)}."
    return (await TOOLS[name].call(arguments)).content
