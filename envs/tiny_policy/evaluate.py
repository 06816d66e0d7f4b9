"""Model stage (offline default policy): measure what a built checkpoint does on each format.

`python -m envs.tiny_policy.evaluate --model DIR` samples held-out math prompts (the math
env's split="val" rows, difficulties 1-3) at temperature 1.0 and greedily, plus calculator
and code prompts, and prints the rates as JSON.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from envs.math.synthetic import MAX_DIFFICULTY, generate
from envs.tiny_policy.code_tasks import make_code_conversation
from envs.tiny_policy.corpus import CALCULATOR_TOOL, RETRY_FEEDBACK, make_tool_conversation
from envs.tiny_policy.tokenizer import IM_END

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
TOOL_CALL = re.compile(r"^<tool_call>\n(.*)\n</tool_call>$", re.DOTALL)
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class EvalReport:
    """Rates over the evaluated prompts (fractions in [0, 1])."""

    math_sampled_well_formed: float  # one \boxed{...} and the reply ended with <|im_end|>
    math_sampled_accuracy: float
    math_greedy_well_formed: float
    math_greedy_accuracy: float
    math_sampled_accuracy_by_difficulty: dict[int, float]
    math_sampled_retry_accuracy: float  # second try after "incorrect" feedback, on first-try misses
    tool_call_parseable: float  # a calculator call whose arguments carry the asked expression
    code_block_parses: float  # a ```python block that parses and defines the asked function


MathPrompt = tuple[list[dict], int, int]  # (messages, answer, difficulty)


def math_prompts(num_prompts: int, seed: int) -> list[MathPrompt]:
    """(messages, answer, difficulty) from the math env's val split, difficulties interleaved."""
    per_difficulty = -(-num_prompts // MAX_DIFFICULTY)
    rows = [generate(per_difficulty, d, seed, split="val") for d in range(1, MAX_DIFFICULTY + 1)]
    interleaved = [row for group in zip(*rows) for row in group][:num_prompts]
    return [
        (row["prompt"], int(row["reward_model"]["ground_truth"]), index % MAX_DIFFICULTY + 1)
        for index, row in enumerate(interleaved)
    ]


@torch.no_grad()
def complete(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[dict]],
    sample: bool,
    tools: list[dict] | None = None,
    max_new_tokens: int = 96,
) -> list[str]:
    """Decoded completions, special tokens kept so the stop token can be checked."""
    texts = [
        tokenizer.apply_chat_template(p, tools=tools, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = (
        {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
    )
    output = model.generate(**batch, max_new_tokens=max_new_tokens, **sampling)
    completions = output[:, batch["input_ids"].shape[1] :]
    return [
        tokenizer.decode(ids, skip_special_tokens=False).split(tokenizer.pad_token)[0]  # drop right padding
        for ids in completions
    ]


def grade_math(completion: str, answer: int) -> tuple[bool, bool]:
    """(well formed, correct) for one math completion."""
    matches = BOXED.findall(completion)
    well_formed = len(matches) == 1 and completion.endswith(IM_END)
    try:
        correct = well_formed and int(matches[0]) == answer
    except ValueError:
        correct = False
    return well_formed, correct


def tool_call_is_parseable(completion: str, expression: str) -> bool:
    match = TOOL_CALL.match(completion.removesuffix(IM_END))
    if not match:
        return False
    try:
        call = json.loads(match.group(1))
    except json.JSONDecodeError:
        return False
    return call.get("name") == "calculator" and call.get("arguments") == {"expression": expression}


def code_block_parses(completion: str, function_name: str) -> bool:
    match = PYTHON_BLOCK.search(completion)
    if not match:
        return False
    try:
        tree = ast.parse(match.group(1))
    except SyntaxError:
        return False
    return any(isinstance(node, ast.FunctionDef) and node.name == function_name for node in tree.body)


def rate(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def retry_accuracy(model, tokenizer, math: list[MathPrompt], first_completions: list[str]) -> float:
    """Accuracy of a second sampled answer after "incorrect" feedback, over the wrongly answered prompts."""
    retries = [
        (
            [
                *messages,
                {"role": "assistant", "content": text.removesuffix(IM_END)},
                {"role": "user", "content": RETRY_FEEDBACK},
            ],
            answer,
        )
        for (messages, answer, _), text in zip(math, first_completions)
        if not grade_math(text, answer)[1]
    ]
    completions = complete(model, tokenizer, [messages for messages, _ in retries], sample=True)
    return rate([grade_math(text, answer)[1] for text, (_, answer) in zip(completions, retries)])


def evaluate_math(model, tokenizer, math: list[MathPrompt]) -> dict:
    """Sampled and greedy format rate and accuracy, sampled accuracy per difficulty, retry accuracy."""
    metrics = {}
    for mode, sample in (("sampled", True), ("greedy", False)):
        completions = complete(model, tokenizer, [messages for messages, _, _ in math], sample)
        graded = [grade_math(text, answer) for text, (_, answer, _) in zip(completions, math)]
        metrics[f"math_{mode}_well_formed"] = rate([well_formed for well_formed, _ in graded])
        metrics[f"math_{mode}_accuracy"] = rate([correct for _, correct in graded])
        if sample:
            metrics["math_sampled_accuracy_by_difficulty"] = {
                d: rate([ok for (_, ok), (_, _, dd) in zip(graded, math) if dd == d])
                for d in range(1, MAX_DIFFICULTY + 1)
            }
            metrics["math_sampled_retry_accuracy"] = retry_accuracy(model, tokenizer, math, completions)
    return metrics


def evaluate(model_dir: Path, num_math: int = 200, num_other: int = 50, seed: int = 0) -> EvalReport:
    """Math metrics plus tool-call and code format rates (all sampled at temperature 1.0)."""
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    metrics = evaluate_math(model, tokenizer, math_prompts(num_math, seed))
    rng = random.Random(f"eval-{seed}")
    tool = [make_tool_conversation(rng).messages for _ in range(num_other)]
    tool_out = complete(model, tokenizer, [list(m[:1]) for m in tool], sample=True, tools=[CALCULATOR_TOOL])
    expressions = [m[1]["tool_calls"][0]["function"]["arguments"]["expression"] for m in tool]
    code = [make_code_conversation(rng)[:1] for _ in range(num_other)]
    code_out = complete(model, tokenizer, [list(m) for m in code], sample=True, max_new_tokens=160)
    names = [m[0]["content"].split("function ")[1].split("(")[0] for m in code]
    return EvalReport(
        **metrics,
        tool_call_parseable=rate(list(map(tool_call_is_parseable, tool_out, expressions))),
        code_block_parses=rate(list(map(code_block_parses, code_out, names))),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Measure a tiny-policy checkpoint.")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--num-math", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(json.dumps(asdict(evaluate(args.model, args.num_math, seed=args.seed)), indent=2))


if __name__ == "__main__":
    main()
