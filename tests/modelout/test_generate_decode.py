"""``generate`` prints what the tokenizer decodes (issue 57): bytes that never form a character
show as U+FFFD as soon as they are known invalid, a character the sample ends inside is shown
as the tokenizer decodes it (it was dropped), and the JSON gives the tokens beside the text.

The emitted tokens are forced through ``pick`` (the sampler) so the sample holds invalid bytes
mid-sample and at its end; everything after it (the streaming decode, the stop texts, the CLI's
text and JSON output) is the real path, for the byte tokenizer and a tokenizers file."""

from __future__ import annotations

import json
import random

import pytest
from modelout_support import invoke, train_text, write_bpe

from speedtronic.data.tokenizer import ByteTokenizer, HFTokenizer
from speedtronic.modelout.stops import Completion

# x, a lone continuation byte, y, an invalid lead, a lead cut by "(", "€" whole, then a 4-byte
# character the sample ends inside
BYTES = [0x78, 0x80, 0x79, 0xFF, 0xC3, 0x28, 0xE2, 0x82, 0xAC, 0xF0, 0x9F]


def byte_level_ids(tok: HFTokenizer, data: list[int]) -> list[int]:
    """The ids of single-byte tokens of a byte-level BPE file (GPT-2's byte-to-character map)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + n) for n, b in enumerate(sorted(set(range(256)) - set(printable)))})
    return [tok._impl.token_to_id(table[b]) for b in data]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("decode")
    bpe = train_text(root, str(write_bpe(root)), name="bpe")
    bpe_tok = HFTokenizer(root / "bpe.json")
    return {"byte": (train_text(root), ByteTokenizer()), "bpe": (bpe, bpe_tok)}


def forced(monkeypatch, ids: list[int]) -> None:
    """The sampler picks ``ids`` in turn, whatever the logits."""
    queue = iter(ids)
    monkeypatch.setattr("speedtronic.modelout.generate.pick", lambda *_: next(queue))


def generated(run, ids, *args):
    common = ("-p", "It", "--max-new-tokens", len(ids), "--seed", 0, *args)
    as_text = invoke("generate", run, *common)
    as_json = invoke("generate", run, *common, "--format", "json")
    assert as_text.exit_code == as_json.exit_code == 0, as_text.stderr + as_json.stderr
    return as_text.stdout, json.loads(as_json.stdout)


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_the_completion_is_the_tokenizers_decode_of_the_tokens(runs, kind, monkeypatch):
    run, tok = runs[kind]
    ids = BYTES if kind == "byte" else byte_level_ids(tok, BYTES)
    forced(monkeypatch, ids + ids)  # one sample for the text output, one for the JSON
    text, sample = generated(run, ids)
    decoded = tok.decode(ids)
    assert decoded == "x\ufffdy\ufffd\ufffd(€\ufffd"
    assert sample["tokens"] == ids and sample["completion"] == decoded
    assert text == f"It{decoded}\n"


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_a_stop_text_after_invalid_bytes_is_still_left_out(runs, kind, monkeypatch):
    run, tok = runs[kind]
    ids = BYTES if kind == "byte" else byte_level_ids(tok, BYTES)
    forced(monkeypatch, ids[:6] + ids[:6])  # each sample stops at "(", its 6th token
    text, sample = generated(run, ids, "--stop", "(")
    assert sample["stop"] == "stop_text" and sample["tokens"] == ids[:6]
    assert sample["completion"] == tok.decode(ids[:5]) == "x\ufffdy\ufffd\ufffd"
    assert text == "It" + sample["completion"] + "\n"


def pieces_of(tok, ids: list[int]) -> tuple[list[str], str]:
    """What a completion writes after each token, and its whole text at the end."""
    written: list[str] = []
    completion = Completion(tok.decode_stream(tok("It")), (), written.append)
    after = []
    for token in ids:
        completion.add(token)
        after.append("".join(written))
    return after, completion.finish()


def test_bytes_show_as_soon_as_they_are_known_invalid():
    after, whole = pieces_of(ByteTokenizer(), BYTES)
    # 0x80 and 0xFF at once; C3 when "(" shows it cut; E2 82 held until AC completes "€"
    assert after == [
        "x",
        "x\ufffd",
        "x\ufffdy",
        "x\ufffdy\ufffd",
        "x\ufffdy\ufffd",
        "x\ufffdy\ufffd\ufffd(",
        "x\ufffdy\ufffd\ufffd(",
        "x\ufffdy\ufffd\ufffd(",
        "x\ufffdy\ufffd\ufffd(€",
        "x\ufffdy\ufffd\ufffd(€",
        "x\ufffdy\ufffd\ufffd(€",
    ]
    assert whole == "x\ufffdy\ufffd\ufffd(€\ufffd"


def test_random_bytes_stream_to_their_decode_holding_at_most_an_incomplete_character():
    tok, draw = ByteTokenizer(), random.Random(0)
    for _ in range(200):
        ids = [draw.choice([0x41, 0x80, 0xBF, 0xC3, 0xE2, 0xF0, 0xFF, 0x9F]) for _ in range(12)]
        after, whole = pieces_of(tok, ids)
        assert whole == tok.decode(ids)
        for n, shown in enumerate(after, 1):
            assert tok.decode(ids[:n]).startswith(shown)
            assert len(tok.decode(ids[:n])) - len(shown) <= 1  # one U+FFFD at most: a tail


def test_a_byte_level_tokenizers_file_holds_at_most_one_trailing_replacement(tmp_path):
    tok = HFTokenizer(write_bpe(tmp_path))
    draw = random.Random(1)
    pool = [0x41, 0x80, 0xBF, 0xC3, 0xE2, 0xF0, 0xFF, 0x9F, 0xA9]
    for _ in range(100):
        ids = byte_level_ids(tok, [draw.choice(pool) for _ in range(12)])
        ids.insert(6, tok("the")[0])  # a merged token among the bytes
        after, whole = pieces_of(tok, ids)
        assert whole == tok.decode(ids)
        for n, shown in enumerate(after, 1):
            so_far = tok.decode(ids[:n])
            assert so_far.startswith(shown) and len(so_far) - len(shown) <= 1


def byte_fallback_tokenizer(tmp_path) -> HFTokenizer:
    """A sentencepiece-style file: letters, and ``<0xHH>`` byte tokens for everything else."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<unk>": 0, "a": 1, "b": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    impl = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    impl.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    impl.save(str(tmp_path / "fallback.json"))
    return HFTokenizer(tmp_path / "fallback.json")


def test_a_byte_fallback_file_never_shows_text_its_decode_takes_back(tmp_path):
    # that decoder shows a whole run of byte tokens as U+FFFDs once one byte of it is invalid:
    # "é" from <0xC3><0xA9> becomes three U+FFFD when <0xFF> follows
    tok, draw = byte_fallback_tokenizer(tmp_path), random.Random(2)
    assert tok.decode([3 + 0xC3, 3 + 0xA9, 3 + 0xFF]) == "\ufffd" * 3
    pool = [1, 2, *(3 + b for b in (0x41, 0x80, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xFF))]
    for _ in range(200):
        ids = [draw.choice(pool) for _ in range(12)]
        after, whole = pieces_of(tok, ids)
        assert whole == tok.decode(ids)
        assert all(whole.startswith(shown) for shown in after)
        for n, shown in enumerate(after, 1):
            if ids[n - 1] < 3:  # a letter ends the run: everything before it is settled
                assert shown == tok.decode(ids[:n])
