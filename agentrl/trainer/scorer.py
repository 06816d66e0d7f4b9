"""Training stage, model side: the module the policy worker shards and calls for every forward pass.

It wraps a transformers causal LM and returns logprobs (and entropy when asked) of the scored
tokens only: the decoder runs on the packed or padded inputs, the hidden states that predict
scored tokens are picked out, and the language-model head is applied to them in chunks
(agentrl.trainer.token_logprobs). The model's own forward would compute logits at every
position, prompt and padding included. Given the loss as a `TokenLoss`, the head also takes the
loss's gradient as it goes (agentrl.trainer.head_loss) and returns the loss with the scores.

It is the FSDP root (the decoder layers are their own FSDP units), so the head's weight and
the embeddings are gathered by FSDP around this forward exactly as around the model's own.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from agentrl.trainer.head_loss import head_loss
from agentrl.trainer.loss import TokenLoss
from agentrl.trainer.packing import ScoringInputs
from agentrl.trainer.token_logprobs import TokenScores, token_logprobs

# Config attributes of model families whose head does more than a linear map (e.g. Gemma 2's
# soft-capping, Cohere's logit scale): the chunked head would silently compute something else.
UNSUPPORTED_HEAD_OPTIONS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


class CausalLMScorer(torch.nn.Module):
    """Decoder + chunked head of `model`: ScoringInputs -> TokenScores of the scored tokens."""

    def __init__(
        self, model: PreTrainedModel, temperature: float, chunk_size: int, compiled_head: bool = False
    ) -> None:
        super().__init__()
        for option in UNSUPPORTED_HEAD_OPTIONS:
            if getattr(model.config, option, None) not in (None, 1.0):
                raise ValueError(
                    f"{type(model).__name__} sets config.{option}={getattr(model.config, option)}: its "
                    "head is not a plain linear map, which the chunked logprob head assumes"
                )
        if getattr(model.get_output_embeddings(), "bias", None) is not None:
            raise ValueError(
                f"{type(model).__name__}'s lm_head has a bias; the chunked logprob head has none"
            )
        self.model = model
        self.temperature = temperature
        self.chunk_size = chunk_size
        self.compiled_head = compiled_head

    def forward(
        self, inputs: ScoringInputs, with_entropy: bool, loss: TokenLoss | None = None
    ) -> tuple[TokenScores, torch.Tensor | None]:
        """The scored tokens' scores, and with `loss` that loss (its gradient runs through the model).

        The scores never carry a gradient; without `loss`, call it under torch.no_grad().
        """
        decoder = self.model.get_decoder()
        hidden = decoder(**inputs.model_kwargs(), use_cache=False).last_hidden_state  # [R, L, H]
        hidden = hidden.flatten(0, 1)[inputs.hidden_index]  # [N, H]
        weight = self.model.get_output_embeddings().weight
        settings = (self.temperature, self.chunk_size, with_entropy, self.compiled_head)
        if loss is None:
            return token_logprobs(hidden, weight, inputs.target_ids, *settings), None
        value, scores = head_loss(hidden, weight, inputs.target_ids, loss, *settings)
        return scores, value
