"""A tool-calling agent written only against the `openai` client: it trains unmodified with env=agent.

It solves the tool_calling env's tasks (rows of `envs.tool_calling.synthetic`): arithmetic with a
calculator, and questions about a fictional world that take one search per hop (person -> city ->
country -> population). It sends the question with the tools' schemas, runs every tool call the
model makes and sends the results back, until the model answers without a call; the reward is 1.0
when the answer in `\\boxed{}` is the row's ground truth, graded as the env grades it. Nothing in
it knows about training:

    python -m agentrl.train env=agent                      # trains the policy through the gateway
    OPENAI_BASE_URL=http://127.0.0.1:8000/s/<session>/v1 OPENAI_API_KEY=<key> python examples/openai_agent.py

`solve(base_url, api_key, task)` is what env=agent calls once per episode (env.kwargs.agent).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from openai import AsyncOpenAI

from agentrl.rewards.answers import extract_boxed_answer
from envs.tool_calling.calculator import calculator
from envs.tool_calling.env import is_correct_answer
from envs.tool_calling.retrieval import search
from envs.tool_calling.synthetic import generate
from envs.tool_calling.tools import Tool

# In env=tool_calling's order (its `tools`), so the prompt lists them as that env's does.
TOOLS = {tool.name: tool for tool in [Tool.from_function(calculator), Tool.from_function(search)]}


async def solve(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """Answer one task with tool calls; 1.0 if the boxed answer is right, else 0.0."""
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0)
    messages: list[dict[str, Any]] = list(task["prompt"])
    async with client:
        while True:
            completion = await client.chat.completions.create(
                model="policy", messages=messages, tools=[tool.schema for tool in TOOLS.values()]
            )
            reply = completion.choices[0].message
            messages.append(reply.model_dump(exclude_none=True))
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": await run_tool(call.function)}
                )
    return await grade(reply.content or "", task["reward_model"]["ground_truth"])


async def run_tool(function: Any) -> str:
    """The tool's output, or what went wrong in words the model reads."""
    if function.name not in TOOLS:
        return f"Error: unknown tool {function.name!r}; the tools are: {', '.join(TOOLS)}."
    return (await TOOLS[function.name].call(json.loads(function.arguments))).content


async def grade(reply: str, ground_truth: str) -> float:
    answer = extract_boxed_answer(reply)
    return float(answer is not None and await is_correct_answer(answer, ground_truth))


if __name__ == "__main__":
    base_url = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
    task = generate(1, seed=0, tasks=["country"])[0]
    print(
        task["prompt"][0]["content"], "->", asyncio.run(solve(base_url, os.environ["OPENAI_API_KEY"], task))
    )
