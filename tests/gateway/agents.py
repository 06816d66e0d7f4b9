"""Agent programs for env=agent's tests: each does one thing (well or badly) against its session."""

from __future__ import annotations

import json
import time
import urllib.request

from openai import OpenAI


def _ask(base_url: str, api_key: str, task: dict) -> str:
    client = OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0)
    reply = client.chat.completions.create(model="policy", messages=task["prompt"])
    return reply.choices[0].message.content or ""


def answers(base_url: str, api_key: str, task: dict) -> float:
    """One call; reward 1.0 when the reply is the row's ground truth."""
    return float(_ask(base_url, api_key, task).strip() == task["reward_model"]["ground_truth"])


def posts_reward(base_url: str, api_key: str, task: dict) -> None:
    """One call, then the reward through the session's reward endpoint (returns nothing)."""
    _ask(base_url, api_key, task)
    request = urllib.request.Request(
        f"{base_url}/reward", json.dumps({"reward": 0.5}).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )  # fmt: skip
    urllib.request.urlopen(request).close()


def gives_no_reward(base_url: str, api_key: str, task: dict) -> None:
    _ask(base_url, api_key, task)


def raises(base_url: str, api_key: str, task: dict) -> float:
    _ask(base_url, api_key, task)
    raise KeyError("the agent's own bug")


def hangs(base_url: str, api_key: str, task: dict) -> float:
    _ask(base_url, api_key, task)
    time.sleep(30)
    return 1.0


def never_calls(base_url: str, api_key: str, task: dict) -> float:
    return 1.0


def loops_forever(base_url: str, api_key: str, task: dict) -> float:
    """Calls until the gateway refuses (the turn budget), then lets the refusal raise."""
    messages = list(task["prompt"])
    client = OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0)
    while True:
        reply = client.chat.completions.create(model="policy", messages=messages)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "Again."},
        ]


def rewrites_history(base_url: str, api_key: str, task: dict) -> float:
    """Two calls; the second sends the first reply back as something the model did not say."""
    client = OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0)
    client.chat.completions.create(model="policy", messages=task["prompt"])
    rewritten = [*task["prompt"], {"role": "assistant", "content": "8"}, {"role": "user", "content": "Sure?"}]
    client.chat.completions.create(model="policy", messages=rewritten)
    return 1.0


async def answers_async(base_url: str, api_key: str, task: dict) -> float:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0) as client:
        reply = await client.chat.completions.create(model="policy", messages=task["prompt"])
    return float((reply.choices[0].message.content or "").strip() == task["reward_model"]["ground_truth"])
