"""The one scorer and the text windowing rule (issue 39).

Batched scores equal one request at a time and a plain log-softmax of the model's logits;
every token of a text is scored exactly once whatever the stride; a byte-level model's bits per
byte is its loss per token / ln 2 and its loss the one training's own blocks give; two
tokenizers of the same text are measured on the same bytes.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from modelout_support import TEXT, train, train_text

from speedtronic.errors import DataError
from speedtronic.evaluate.scorer import Request, Scorer
from speedtronic.evaluate.text import score_text, windows
from speedtronic.model import ReferenceConfig, ReferenceTransformer


def tiny_model(seq_len: int = 12) -> ReferenceTransformer:
    torch.manual_seed(0)
    config = ReferenceConfig(vocab_size=50, seq_len=seq_len, n_layer=2, n_head=2, d_model=32)
    model = ReferenceTransformer(config).eval()
    with torch.no_grad():  # away from the init, so that every position's logits differ
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def direct(model, request: Request, window: int) -> float:
    """The continuation's log-probability from one unpadded forward pass, by hand."""
    full = (list(request.context) + list(request.continuation))[-(window + 1) :]
    ids = torch.tensor([full])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1]).double(), dim=-1)[0]
    n = len(request.continuation)
    targets = ids[0, 1:]
    return sum(logp[t, targets[t]].item() for t in range(len(full) - 1 - n, len(full) - 1))


def random_requests(count: int, seed: int = 0) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        c, k = (int(x) for x in torch.randint(1, 9, (2,), generator=g))
        ids = torch.randint(0, 50, (c + k,), generator=g).tolist()
        out.append(Request(ids[:c], ids[c:]))
    return out


def test_batched_padded_scores_equal_unpadded_single_passes():
    """Fails if padding leaks into a sequence's logits, a mask is off by one, or the order of
    results is not the order of requests (they are sorted by length inside)."""
    model, requests = tiny_model(), random_requests(11)
    batched = Scorer(model, window=12, batch_size=4).score(requests)
    single = Scorer(model, window=12, batch_size=1).score(requests)
    for request, b, s in zip(requests, batched, single, strict=True):
        assert b.tokens == s.tokens == len(request.continuation)
        assert b.logprob == pytest.approx(s.logprob, abs=1e-4)
        assert b.logprob == pytest.approx(direct(model, request, 12), abs=1e-4)


def test_a_long_context_is_cut_from_the_left_and_the_continuation_kept():
    model = tiny_model(seq_len=8)
    request = Request(list(range(1, 20)), [7, 8, 9])
    (score,) = Scorer(model, window=8).score([request])
    assert score.tokens == 3
    assert score.logprob == pytest.approx(direct(model, request, 8), abs=1e-4)
    with pytest.raises(DataError, match="does not fit the model's window"):
        Scorer(model, window=8).score([Request([1], list(range(9)))])
    with pytest.raises(DataError, match="outside the model's vocabulary"):
        Scorer(model, window=8).score([Request([1], [50])])


@pytest.mark.parametrize("stride", [1, 3, 7, 8])
def test_every_token_after_the_first_is_scored_exactly_once(stride):
    ids = list(range(100, 141))
    requests = windows(ids, window=8, stride=stride)
    scored = [t for r in requests for t in r.continuation]
    assert scored == ids[1:]
    for r in requests:
        assert r.context and len(r.context) + len(r.continuation) <= 9  # window + 1 ids
        start = ids.index(r.continuation[0])
        assert list(r.context) == ids[max(0, start - len(r.context)) : start]
    later = [r for r in requests if ids.index(r.continuation[0]) >= 8 + 1 - stride]
    assert later and all(len(r.context) == 8 + 1 - stride for r in later)  # full context


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    return train_text(tmp_path_factory.mktemp("bpb"), run={"max_steps": 20})


def test_byte_level_bits_per_byte_is_loss_per_token_over_ln2_and_trainings_own_loss(byte_run):
    """With no overlap (stride = window) a byte model's bits per byte is its loss / ln 2, and
    that loss is what the model's own forward(labels) gives over the same blocks."""
    from speedtronic.modelout.source import open_run

    run = open_run(byte_run)
    model, tok = run.model, run.tokenizer
    window = model.config.seq_len
    result = score_text(Scorer(model, window, batch_size=7), tok, TEXT)
    nbytes = len(TEXT.encode("utf-8"))
    assert result.tokens == result.bytes == nbytes - 1
    assert result.bits_per_byte == pytest.approx(result.loss / math.log(2), rel=1e-12)
    ids = torch.tensor(tok(TEXT))
    full = (len(ids) - 1) // window
    blocks = [ids[s : s + window + 1] for s in range(0, len(ids) - 1, window)]
    total = 0.0
    with torch.no_grad():  # training's layout: blocks of window + 1 ids overlapping by one
        whole = torch.stack(blocks[:full])
        total += model(whole[:, :-1], labels=whole[:, 1:]).item() * full * window
        for block in blocks[full:]:
            total += model(block[None, :-1], labels=block[None, 1:]).item() * (len(block) - 1)
    assert result.loss == pytest.approx(total / (nbytes - 1), rel=1e-5)


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("acgt ") for _ in range(n))  # log2(5) bits of entropy per byte


def bpe_for(text: str, path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet))
    tok.save(str(path))
    return path


def test_two_tokenizers_of_one_text_give_comparable_bits_per_byte(tmp_path):
    """Text drawn uniformly from 5 symbols carries log2(5) = 2.32 bits per byte, and no model
    can do better on text it has not seen. A byte model and a BPE model trained on that source
    both land near it in bits per byte, while their losses per token are > 2x apart (a BPE
    token spends ~2 bytes): bits per byte is the figure that compares, loss is not."""
    from speedtronic.modelout.source import open_run

    rng = random.Random(0)
    corpus, held_out = random_text(rng, 20000), random_text(rng, 4000)
    (tmp_path / "corpus.txt").write_text(corpus)
    data = {"text_path": str(tmp_path / "corpus.txt")}
    results = {}
    for name, tokenizer, vocab in (
        ("byte", "byte", 256),
        ("bpe", str(bpe_for(corpus, tmp_path / "bpe.json")), 320),
    ):
        folder = train(
            tmp_path, name, model={"vocab_size": vocab}, run={"max_steps": 60},
            data={**data, "tokenizer": tokenizer},
        )  # fmt: skip
        run = open_run(folder)
        scorer = Scorer(run.model, run.model.config.seq_len, batch_size=32)
        results[name] = score_text(scorer, run.tokenizer, held_out)
    byte, bpe = results["byte"], results["bpe"]
    entropy = math.log2(5)
    assert byte.bytes == bpe.bytes == len(held_out) - 1  # the text's bytes, not the tokens'
    assert bpe.loss / byte.loss > 2
    for r in (byte, bpe):
        assert entropy - 0.02 < r.bits_per_byte < entropy * 1.15, (r, entropy)
        assert r.bits_per_byte * r.bytes * math.log(2) == pytest.approx(r.loss * r.tokens)
