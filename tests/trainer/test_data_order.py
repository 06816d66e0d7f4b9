from agentrl.trainer.data_order import StepSampler

ROWS = [{"i": i} for i in range(10)]


def test_batches_are_a_pure_function_of_seed_and_step():
    first, again = StepSampler(ROWS, 3, seed=7, shuffle=True), StepSampler(ROWS, 3, seed=7, shuffle=True)
    assert [first.batch(s)[1] for s in range(7)] == [again.batch(s)[1] for s in range(7)]


def test_an_epoch_visits_each_row_at_most_once_and_drops_the_ragged_tail():
    sampler = StepSampler(ROWS, 3, seed=0, shuffle=False)
    assert [sampler.batch(s)[1] for s in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 2]]
