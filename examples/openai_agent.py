"""A tool-calling agent written only against the `openai` client: it trains unmodified with env=agent.

It solves the tool_calling env's calculator tasks (rows of `envs.tool_calling.synthetic`): it
sends the question with the calculator's schema, runs every tool call the model makes and sends
the results back, until the model answers without a call; the reward is 1.0 when the answer in
`\\boxed{}` equals the row's ground truth. Nothing in it knows about training:

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

from agentrl.rewards.answers import Verdict, extract_boxed_answer, shared_grader
from envs.tool_calling.calculator import calculator
from envs.tool_calling.synthetic import generate
from envs.tool_calling.tools import Tool

TOOLS = {tool.name: tool for tool in [Tool.from_function(calculator)]}


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
    if answer is None:
        return 0.0
    verdict = await asyncio.to_thread(shared_grader().grade, answer, ground_truth)
    return float(verdict is Verdict.CORRECT)


if __name__ == "__main__":
    base_url = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
    task = generate(1, seed=0)[0]
    print(
        task["prompt"][0]["content"], "->", asyncio.run(solve(base_url, os.environ["OPENAI_API_KEY"], task))
    )
