"""The scorer's memory bound (issue 55 item 5): ``eval`` of an 8k-context, 49k-vocabulary model
asked for 25.8 GB of logits at once (16 whole windows). A batch now holds no more rows than keep
its float32 logits within a budget, the log-softmax reads them in slices within it, and the
scores are the same however the rows were cut."""

from __future__ import annotations

import pytest
import torch

from speedtronic.evaluate.scorer import LOGITS_BUDGET, Scorer, rows_per_batch
from tests.evaluate.test_scorer import random_requests, tiny_model

GB = 2**30


@pytest.mark.parametrize(
    ("length", "width"),
    [(8192, 49152), (16384, 49152), (2048, 151936), (1024, 50304), (256, 32000), (64, 256)],
)
def test_a_batch_of_logits_stays_within_the_budget(length, width):
    rows = rows_per_batch(length, width, 16, LOGITS_BUDGET)
    assert 1 <= rows <= 16
    assert rows == 1 or rows * length * width * 4 <= LOGITS_BUDGET
    assert rows == 16 or (rows + 1) * length * width * 4 > LOGITS_BUDGET  # no smaller than needed


def test_the_issue_s_model_reads_one_window_per_forward_not_sixteen():
    assert 16 * 8192 * 49152 * 4 > 25.7e9  # what the default asked for: 25.8 GB
    assert rows_per_batch(8192, 49152, 16, LOGITS_BUDGET) == 1  # 1.6 GB: a laptop's
    assert rows_per_batch(512, 32000, 16, LOGITS_BUDGET) == 4
    assert rows_per_batch(64, 256, 16, LOGITS_BUDGET) == 16  # a small model: as before
    assert rows_per_batch(64, None, 16, LOGITS_BUDGET) == 1  # width unknown until a forward


class Recording(torch.nn.Module):
    """The model, with the shape of every logits tensor it gives."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.shapes = inner, []

    def forward(self, input_ids):
        logits = self.inner(input_ids)
        self.shapes.append(tuple(logits.shape))
        return logits


def test_scores_are_the_same_in_small_batches_as_in_one():
    requests = random_requests(23, seed=4)
    whole = Recording(tiny_model())
    one = Scorer(whole, window=12, batch_size=64, logits_budget=GB).score(requests)
    small = Recording(whole.inner)
    budget = 2 * 12 * 50 * 4  # two full windows of 50-wide logits
    cut = Scorer(small, window=12, batch_size=64, logits_budget=budget).score(requests)
    assert len(whole.shapes) == 1 and len(small.shapes) >= 8  # by tokens: short rows go 3 a time
    assert all(b == 1 or b * t * v * 4 <= budget for b, t, v in small.shapes)
    # another padded length changes float32 attention's last bits, nothing more
    assert [s.tokens for s in cut] == [s.tokens for s in one]
    assert [s.logprob for s in cut] == pytest.approx([s.logprob for s in one], abs=1e-5)


def test_the_log_softmax_in_slices_gives_the_same_scores_exactly():
    requests, model = random_requests(23, seed=4), tiny_model()
    alone = Scorer(model, window=12, batch_size=1, logits_budget=GB).score(requests)
    sliced = Scorer(model, window=12, batch_size=1, logits_budget=3 * 50 * 4).score(requests)
    assert sliced == alone  # the same forwards; the log-softmax 3 positions at a time


class Anonymous(torch.nn.Module):
    """Logits from a plain table: no config, no nn.Embedding, so no vocabulary to read."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table, self.out = torch.nn.Parameter(torch.randn(50, 8)), torch.nn.Linear(8, 50)

    def forward(self, input_ids):
        return self.out(self.table[input_ids])  # (B, T, 50)


def test_a_model_that_names_no_vocabulary_is_sized_after_its_first_forward():
    model = Recording(Anonymous())
    scorer = Scorer(model, window=12, batch_size=64, logits_budget=4 * 12 * 50 * 4)
    assert scorer.vocab is None
    scores = scorer.score(random_requests(9, seed=5))
    assert model.shapes[0][0] == 1 and all(b <= 4 for b, _, _ in model.shapes)
    assert scores == Scorer(model, window=12, batch_size=64, logits_budget=GB).score(
        random_requests(9, seed=5)
    )
