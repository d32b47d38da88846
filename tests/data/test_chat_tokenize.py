"""``data tokenize --chat`` (issue 56 item 1): conversations rendered with the model's chat
template, packed whole into examples of ``--seq-len + 1`` tokens (``--pad``: one padded example
each), a loss mask beside each shard that trains only the assistant turns (their end-of-turn
token included) and marks where each packed conversation starts. transformers is the oracle of
the rendering and of where each role's text lies; bad input is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from chat_support import CONVERSATIONS, TEMPLATE, chat_llama, tokenizer_dir, write_jsonl
from modelout_support import assert_one_line_error, invoke

transformers = pytest.importorskip("transformers")
pytest.importorskip("jinja2")
transformers.utils.logging.set_verbosity_error()
SEQ = 96


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chat")
    src, imported = chat_llama(tmp)
    return src, imported


def tokenize(tmp_path, rows, tokenizer, *args, name="out"):
    source = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    return invoke(
        "data", "tokenize", source, tmp_path / name, "--tokenizer", tokenizer, "--chat",
        "--workers", "1", *args,
    )  # fmt: skip


def read_back(folder):
    """Each example's tokens and mask, as the shards hold them."""
    manifest = json.loads((folder / "manifest.json").read_text())
    slot = manifest["chat"]["seq_len"] + 1
    record = manifest["parts"]["train"][0]
    tokens = np.fromfile(folder / record["file"], dtype=np.uint16).reshape(-1, slot)
    mask = np.fromfile(folder / record["mask"], dtype=np.uint8).reshape(-1, slot)
    return manifest, tokens, mask


def conversations_in(tokens, mask, packed: bool) -> list[tuple[list[int], list[int]]]:
    """Each conversation of the examples (its ids and trained bits), split at the start bits
    (a padded example: one, up to its padding); the padding after them checked untrained."""
    found = []
    for row, bits in zip(tokens, mask, strict=True):
        starts = np.flatnonzero(bits & 2).tolist() if packed else [0]
        assert not packed or starts[0] == 0  # an example starts with a conversation
        end = int(np.flatnonzero(row != 2)[-1]) + 1  # the pad id is <pad>'s, 2
        for a, b in zip(starts, [*starts[1:], end], strict=True):
            found.append((row[a:b].tolist(), (bits[a:b] & 1).tolist()))
        assert not (bits[end:]).any() and (row[end:] == 2).all()  # padding: never trained on
    return found


def ids_of(tok, conversation) -> list[int]:
    return tok.apply_chat_template(conversation, tokenize=True)["input_ids"]


def expected_mask(tok, conversation) -> tuple[list[int], list[int]]:
    """transformers' ids of the conversation, and 1 on each token whose text lies in an
    assistant message's content or the end of its turn (``<|im_end|>\\n``), found from the
    rendered text's character offsets, not from the prefixes the code under test compares."""
    text = tok.apply_chat_template(conversation, tokenize=False)
    spans, at = [], 0
    for message in conversation:
        head = f"<|im_start|>{message['role']}\n"
        start = text.index(head, at) + len(head)
        at = text.index("<|im_end|>\n", start) + len("<|im_end|>\n")
        if message["role"] == "assistant":
            spans.append((start, at))
    encoded = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= s < b for a, b in spans)) for s, _ in encoded["offset_mapping"]]
    return encoded["input_ids"], mask


@pytest.mark.parametrize("masking", ["packed", "padded"])
def test_every_position_of_the_shards_is_masked_by_its_role(masking, model, tmp_path):
    src, imported = model
    rows = CONVERSATIONS * 3  # packed: several to an example, and the last ones in a new one
    pad = ("--pad",) if masking == "padded" else ()
    result = tokenize(tmp_path, rows, imported, "--seq-len", SEQ, *pad)
    assert result.exit_code == 0, result.stderr
    manifest, tokens, mask = read_back(tmp_path / "out")
    tok = transformers.AutoTokenizer.from_pretrained(src)
    assert tok.chat_template == TEMPLATE
    found = conversations_in(tokens, mask, masking == "packed")
    expected = [expected_mask(tok, conversation) for conversation in rows]
    assert sorted(found) == sorted(expected)  # transformers' rendering and roles, exactly
    if masking == "packed":  # first fit: fewer examples, each conversation whole in one
        assert len(expected) // 3 <= len(tokens) < len(expected)
    else:
        assert found == expected and len(tokens) == len(rows)
    chat = manifest["chat"]
    template = (imported / "tokenizer" / "chat_template.jinja").read_bytes()
    import hashlib

    assert chat["template_sha256"] == hashlib.sha256(template).hexdigest()
    assert (chat["train_on"], chat["masking"], chat["seq_len"]) == ("assistant", masking, SEQ)
    assert manifest["counts"]["chat"]["trained_tokens"] == int((mask & 1).sum())


def test_train_on_all_trains_every_token_but_the_padding(model, tmp_path):
    _, imported = model
    result = tokenize(tmp_path, CONVERSATIONS[:1], imported, "--seq-len", SEQ, "--train-on", "all")
    assert result.exit_code == 0, result.stderr
    _, tokens, mask = read_back(tmp_path / "out")
    length = int((tokens[0] != 2).sum())  # the pad id is <pad>'s, 2
    assert mask[0, 0] == 2  # a conversation starts here, and is no token's label
    assert (mask[0, 1:length] == 1).all() and not mask[0, length:].any()


def test_a_long_conversation_is_cut_at_a_turn_or_dropped_and_both_are_counted(model, tmp_path):
    _, imported = model
    tok = transformers.AutoTokenizer.from_pretrained(imported / "tokenizer")
    two_turns = CONVERSATIONS[1]
    first = len(ids_of(tok, two_turns[:2]))
    rows = [two_turns, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]]
    result = tokenize(tmp_path, rows, imported, "--seq-len", first + 2)  # the first turn fits
    assert result.exit_code == 0, result.stderr
    manifest, tokens, mask = read_back(tmp_path / "out")
    counts = manifest["counts"]["chat"]
    assert counts | {"trained_tokens": 0} == {
        "conversations": 2, "cut": 1, "dropped": 0, "no_assistant": 0, "trained_tokens": 0,
        "chat_tokens": first + len(ids_of(tok, rows[1])),
    }  # fmt: skip
    assert "cut at a turn to fit" in result.stdout
    assert tokens[0, :first].tolist() == ids_of(tok, two_turns[:2])
    dropped = tokenize(tmp_path, rows[:1], imported, "--seq-len", first - 2, name="short")
    assert dropped.exit_code == 2 and "1 whose first answer does not fit" in dropped.stderr


def test_a_conversation_without_an_answer_is_skipped_and_counted(model, tmp_path):
    _, imported = model
    rows = [*CONVERSATIONS[:1], [{"role": "user", "content": "no answer"}]]
    result = tokenize(tmp_path, rows, imported, "--seq-len", SEQ, "--format", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["chat"]["no_assistant"] == 1 and report["chat"]["conversations"] == 1


def test_a_row_without_messages_names_the_file_and_line(model, tmp_path):
    _, imported = model
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps({"messages": CONVERSATIONS[0]}) + "\n" + '{"text": "hi"}\n')
    args = ("--tokenizer", imported, "--chat", "--seq-len", SEQ, "--workers", 1)
    result = invoke("data", "tokenize", source, tmp_path / "out", *args)
    first = len(json.dumps({"messages": CONVERSATIONS[0]})) + 1
    assert_one_line_error(result, "rows.jsonl", f"line at byte {first}", "no field 'messages'")


def test_a_role_the_template_does_not_know_is_its_error(model, tmp_path):
    _, imported = model
    rows = [[{"role": "tool", "content": "{}"}, {"role": "assistant", "content": "ok"}]]
    result = tokenize(tmp_path, rows, imported, "--seq-len", SEQ)
    assert_one_line_error(result, "out.jsonl: the line at byte 0", "raised: unknown role: tool")


@pytest.mark.parametrize(
    "template, needle",
    [
        ("{{ raise_exception('system prompts only') }}", "raised: system prompts only"),
        ("{{ messages[0]['content'] + 1 }}", "the chat template failed (TypeError"),
        (  # its generation prompt is not how it renders an answer's start
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}Assistant:{% endif %}",
            "does not render message 2 (assistant) as a continuation",
        ),
    ],
    ids=["raises", "breaks", "no-prefix"],
)
def test_a_template_that_raises_or_cannot_mask_is_refused(template, needle, tmp_path):
    folder = tokenizer_dir(tmp_path, template)
    result = tokenize(tmp_path, CONVERSATIONS[:1], folder, "--seq-len", SEQ)
    assert_one_line_error(result, needle)


def test_a_tokenizer_without_a_template_names_its_file(tmp_path):
    folder = tokenizer_dir(tmp_path, None)
    result = tokenize(tmp_path, CONVERSATIONS[:1], folder, "--seq-len", SEQ)
    assert_one_line_error(result, f"{folder / 'tokenizer_config.json'} has no chat_template")


def test_chat_needs_seq_len(model, tmp_path):
    result = tokenize(tmp_path, CONVERSATIONS[:1], model[1])
    assert_one_line_error(result, "--chat: needs --seq-len N")


def test_an_interrupted_chat_tokenize_resumes_to_identical_shards_and_masks(model, tmp_path):
    from speedtronic.data.ingest.pipeline import tokenize_corpus
    from speedtronic.data.ingest.plan import Request

    src = tmp_path / "chats"
    src.mkdir()
    for n in range(6):  # a file is a unit here: each one's end is a commit
        write_jsonl(src / f"{n}.jsonl", CONVERSATIONS[n % 3 :] + CONVERSATIONS[: n % 3])
    request = Request(
        (str(src),), str(model[1]), shard_tokens=300, val_fraction=0.3, chat=True, seq_len=SEQ
    )
    tokenize_corpus(request, tmp_path / "straight", workers=1)
    seen = []

    def stop_after_a_while(snapshot):
        seen.append(snapshot)
        if len(seen) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(request, tmp_path / "cut", workers=1, on_progress=stop_after_a_while)
    tokenize_corpus(request, tmp_path / "cut", workers=1)
    names = sorted(p.name for p in (tmp_path / "straight").iterdir())
    assert any(n.endswith(".mask") for n in names) and "val_00000.mask" in names
    assert names == sorted(p.name for p in (tmp_path / "cut").iterdir())
    for name in names:
        assert (tmp_path / "straight" / name).read_bytes() == (tmp_path / "cut" / name).read_bytes()


def test_max_tokens_stops_at_the_conversation_that_reaches_it(model, tmp_path):
    result = tokenize(tmp_path, CONVERSATIONS, model[1], "--seq-len", SEQ, "--max-tokens", SEQ)
    assert result.exit_code == 0, result.stderr
    manifest, tokens, mask = read_back(tmp_path / "out")
    counts = manifest["counts"]["chat"]
    assert len(tokens) == 1 and manifest["counts"]["capped"]  # the example that reaches it
    assert counts["conversations"] == int((mask & 2).astype(bool).sum()) > 1  # all it packs
    assert counts["trained_tokens"] == int((mask & 1).sum()) > 0
    assert counts["chat_tokens"] == int((tokens != 2).sum())


def test_a_parquet_column_of_conversations_gives_the_jsonl_bytes(model, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    _, imported = model
    table = pa.table({"id": [1, 2, 3], "conversation": CONVERSATIONS})
    pq.write_table(table, tmp_path / "chats.parquet")
    args = ("--tokenizer", imported, "--chat", "--seq-len", SEQ, "--workers", 1)
    key = ("--messages-key", "conversation")
    result = invoke("data", "tokenize", tmp_path / "chats.parquet", tmp_path / "pq", *args, *key)
    assert result.exit_code == 0, result.stderr
    assert tokenize(tmp_path, CONVERSATIONS, imported, "--seq-len", SEQ).exit_code == 0
    for name in ("train_00000.bin", "train_00000.mask"):
        assert (tmp_path / "pq" / name).read_bytes() == (tmp_path / "out" / name).read_bytes()
    wrong = invoke("data", "tokenize", tmp_path / "chats.parquet", tmp_path / "x", *args)
    assert_one_line_error(wrong, "chats.parquet: no column 'messages'", "--messages-key NAME")
