"""``generate --stop TEXT`` (issue 46): the stop text is part of neither output. The text output
printed it ("the cat��s�4" for ``--stop 4``) while the JSON ``completion`` left it out; now
both show one text; a character the sample ends inside shows in both as the tokenizer decodes it
(issue 57: it was dropped)."""

from __future__ import annotations

import json

import pytest
from modelout_support import invoke, train_text

from speedtronic.data.tokenizer import ByteTokenizer
from speedtronic.modelout.stops import Completion, Stopper

ARGS = ("-p", "It was", "--max-new-tokens", 40, "--seed", 3)


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    return train_text(tmp_path_factory.mktemp("stop"))  # barely trained: bytes, often invalid


def test_text_and_json_show_the_same_completion_without_the_stop_text(byte_run):
    free = invoke("generate", byte_run, *ARGS, "--no-stop", "--format", "json")
    assert free.exit_code == 0, free.stderr
    whole = json.loads(free.stdout)["completion"]
    stop = next(c for c in whole[1:] if c.isascii() and c.isprintable() and c != " ")
    cut = whole[: whole.find(stop)]
    as_json = invoke("generate", byte_run, *ARGS, "--no-stop", "--stop", stop, "--format", "json")
    as_text = invoke("generate", byte_run, *ARGS, "--no-stop", "--stop", stop)
    assert as_json.exit_code == as_text.exit_code == 0, as_json.stderr + as_text.stderr
    sample = json.loads(as_json.stdout)
    assert sample["stop"] == "stop_text" and sample["completion"] == cut
    assert as_text.stdout == f"It was{cut}\n"  # the stop text is not printed


def written(completion: Completion, tokens: list[int]) -> tuple[list[str], bool]:
    pieces: list[str] = []
    completion.write = pieces.append
    stopped = any(completion.add(t) for t in tokens)  # stops adding at the first stop
    return pieces, stopped


def test_text_that_may_begin_a_stop_text_is_held_until_it_does_not():
    tok = ByteTokenizer()
    completion = Completion(tok.decode_stream([]), ("ab",))
    pieces, stopped = written(completion, tok("xaab"))
    assert stopped and pieces == ["x", "a"] and completion.finish() == "xa"
    completion = Completion(tok.decode_stream([]), ("ab",))
    pieces, stopped = written(completion, tok("xa"))
    assert not stopped and pieces == ["x"] and completion.finish() == "xa"  # held, then shown
    assert "".join(pieces) == "xa"


def test_a_character_the_sample_ends_inside_is_shown_as_the_tokenizer_decodes_it():
    tok = ByteTokenizer()
    completion = Completion(tok.decode_stream([]), ("4",))
    pieces, stopped = written(completion, tok("é4")[:1] + tok("ça"))
    assert not stopped and completion.finish() == "\ufffdça" == "".join(pieces)
    completion = Completion(tok.decode_stream([]))
    pieces, _ = written(completion, tok("aé")[:2])  # the token budget ends inside é
    assert pieces == ["a"] and completion.finish() == "a\ufffd" == tok.decode(tok("aé")[:2])


def test_an_end_token_is_not_part_of_the_text():
    tok = ByteTokenizer()
    stopper = Stopper({3: "\\x03"}, Completion(tok.decode_stream([])))
    assert [stopper([t]) for t in (97, 3)] == [None, "eos"]
    assert stopper.completion.finish() == "a"
