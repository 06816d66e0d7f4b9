from __future__ import annotations

import copy

from agentrl.rollout.chat_template import ChatTemplate

HISTORY = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]
FEEDBACK = [{"role": "user", "content": "Sure?"}]


def test_the_observation_delta_is_the_text_after_the_sampled_end_of_turn_token(tokenizer, template):
    completion_ids = tokenizer.encode("4", add_special_tokens=False) + [tokenizer.eos_token_id]
    delta = template.observation_delta(HISTORY, completion_ids, FEEDBACK, tools=None)
    full = tokenizer.apply_chat_template(HISTORY + FEEDBACK, tokenize=False, add_generation_prompt=True)
    closed_at_eos = full.index(tokenizer.eos_token, full.index("4")) + len(tokenizer.eos_token)
    assert delta.prefix_ok
    assert tokenizer.decode(delta.token_ids) == full[closed_at_eos:]
    assert full[closed_at_eos:].startswith("\n")  # the template's between-turn newline is part of the delta


def test_a_template_that_rewrites_earlier_turns_is_detected(tokenizer):
    rewriting = copy.deepcopy(tokenizer)
    # Strips whitespace from assistant turns: the model sampled " 4" but the template shows "4".
    rewriting.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{{ m.content | trim if m.role == 'assistant' else m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    template = ChatTemplate(rewriting)
    completion_ids = rewriting.encode(" 4 ", add_special_tokens=False) + [rewriting.eos_token_id]
    history = [HISTORY[0], {"role": "assistant", "content": " 4 "}]
    delta = template.observation_delta(history, completion_ids, FEEDBACK, tools=None)
    assert not delta.prefix_ok
