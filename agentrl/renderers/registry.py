"""Set-up: which renderer a model gets, detected from its tokenizer or named by `model.renderer`.

Detection reads the chat template's text, where each family's format is spelled out (its turn
and tool tokens); a template that matches no family gets the generic renderer (the template
as it is, Hermes tool calls). `model.renderer=NAME` overrides detection, for a fine-tune whose
template was rewritten or to turn Qwen3's thinking off (`qwen3_no_thinking`).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from agentrl.parsing.tool_calls import ToolCallParser
from agentrl.renderers.base import Renderer
from agentrl.renderers.deepseek import DeepSeekRenderer, DeepSeekThinkingRenderer
from agentrl.renderers.glm import Glm45Renderer
from agentrl.renderers.gpt_oss import GptOssRenderer
from agentrl.renderers.llama import Llama3Renderer
from agentrl.renderers.mistral import MistralRenderer
from agentrl.renderers.names import AUTO, RENDERER_NAMES, check_renderer_name
from agentrl.renderers.qwen import Qwen3NoThinkingRenderer, Qwen3Renderer, Qwen25Renderer

RENDERERS: dict[str, type[Renderer]] = {
    cls.name: cls
    for cls in (
        Renderer, Qwen25Renderer, Qwen3Renderer, Qwen3NoThinkingRenderer, Llama3Renderer,
        MistralRenderer, DeepSeekRenderer, DeepSeekThinkingRenderer, Glm45Renderer, GptOssRenderer,
    )
}  # fmt: skip
assert tuple(RENDERERS) == RENDERER_NAMES, "agentrl.renderers.names must list every renderer"

# (family, text its template contains), first match wins: the more specific markers come first.
_MARKERS = (
    ("gpt-oss", "<|channel|>"),
    ("deepseek", "<｜Assistant｜>"),
    ("glm4.5", "<arg_key>"),
    ("mistral", "[INST]"),
    ("llama3", "<|start_header_id|>"),
    ("qwen3", "</think>"),
    ("qwen2.5", "You are Qwen, created by Alibaba Cloud"),
)


def detect_family(tokenizer: PreTrainedTokenizerBase) -> str:
    """The family whose format the tokenizer's chat template writes; "generic" when none does."""
    template = tokenizer.chat_template or ""
    if isinstance(template, dict):  # several named templates: the default one renders chats
        template = template.get("default", "")
    for family, marker in _MARKERS:
        if marker in template and (family != "qwen3" or "<|im_start|>" in template):
            return family
    return "generic"


def build_renderer(tokenizer: PreTrainedTokenizerBase, name: str = AUTO) -> Renderer:
    """The renderer `name` (or the detected family's, for "auto") around `tokenizer`."""
    family = detect_family(tokenizer) if check_renderer_name(name) == AUTO else name
    return RENDERERS[family](tokenizer)


def reply_parser(name: str) -> ToolCallParser:
    """The tool-call parser of the family `name` (no tokenizer needed: parsing is text to text)."""
    if check_renderer_name(name, setting="renderer") == AUTO:
        raise ValueError('the parser of "auto" depends on the model: build the renderer with build_renderer')
    return RENDERERS[name].parser
