import pytest
import torch

from agentrl.trainer.packing import scatter_scores, scoring_inputs

# two right-padded sequences: [2 3 4 5] and [6 7 _ _]; tokens 4, 5 and 7 are scored
INPUT_IDS = torch.tensor([[2, 3, 4, 5], [6, 7, 0, 0]])
ATTENTION_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
POSITION_IDS = torch.arange(4).expand(2, 4)
SCORED = torch.tensor([[False, False, True, True], [False, True, False, False]])


def test_packing_concatenates_real_tokens_and_restarts_positions_per_sequence():
    inputs = scoring_inputs(INPUT_IDS, ATTENTION_MASK, POSITION_IDS, SCORED, pack=True)
    assert inputs.input_ids.tolist() == [[2, 3, 4, 5, 6, 7]]
    assert inputs.position_ids.tolist() == [[0, 1, 2, 3, 0, 1]]
    assert inputs.attention_mask is None
    assert inputs.document_lengths == (4, 2)
    # token 4 is predicted by packed state 1 (token 3), 5 by 2, and 7 by 4 (token 6)
    assert inputs.hidden_index.tolist() == [1, 2, 4]
    assert inputs.target_ids.tolist() == [4, 5, 7]
    assert inputs.model_kwargs().keys() == {"input_ids", "position_ids", "document_lengths"}


def test_padded_layout_points_into_the_flattened_batch():
    inputs = scoring_inputs(INPUT_IDS, ATTENTION_MASK, POSITION_IDS, SCORED, pack=False)
    assert inputs.input_ids is INPUT_IDS
    assert inputs.document_lengths is None
    assert inputs.hidden_index.tolist() == [1, 2, 4]  # row 1 starts at 4 in [2 * 4, H]
    assert inputs.model_kwargs().keys() == {"input_ids", "position_ids", "attention_mask"}


def test_scores_scatter_back_to_their_batch_positions_and_zero_elsewhere():
    inputs = scoring_inputs(INPUT_IDS, ATTENTION_MASK, POSITION_IDS, SCORED, pack=True)
    values = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    scattered = scatter_scores(values, inputs)
    assert scattered.tolist() == [[0, 0, -1, -2], [0, -3, 0, 0]]
    (scattered * torch.arange(8.0).view(2, 4)).sum().backward()
    assert values.grad.tolist() == [2.0, 3.0, 5.0]


def test_a_scored_first_position_is_rejected():
    scored = SCORED.clone()
    scored[1, 0] = True
    with pytest.raises(ValueError, match="position 0"):
        scoring_inputs(INPUT_IDS, ATTENTION_MASK, POSITION_IDS, scored, pack=True)
