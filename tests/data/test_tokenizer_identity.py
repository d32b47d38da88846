"""One tokenizer identity (issue 53 item 9): two ``tokenizer.json`` files are the same
tokenizer when they turn text into the same ids, whatever their bytes. A file saved compactly,
with its keys in another order, its merges in the older ``"a b"`` form or its text escaped
has the identity of the original; another merge, normalizer, special token id or
post-processor (which decides a document's separator) is another tokenizer. The decoder and
the format version never change an id, so they are not part of it."""

from __future__ import annotations

import json

import pytest
from modelout_support import write_bpe

from speedtronic.checkpoint.tokenizer import same_tokenizer, tokenizer_record
from speedtronic.data.tokenizer import HFTokenizer, tokenizer_identity

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    path = write_bpe(tmp_path_factory.mktemp("identity"), specials=("<bos>", "</s>"))
    return path.read_bytes()


# what transformers 5's save_pretrained adds to a tokenizer.json without a post-processor
NO_OP_TEMPLATE = {
    "type": "TemplateProcessing",
    "single": [{"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {},
}


def reshaped(data: bytes, change=None, **dump) -> bytes:
    doc = json.loads(data)
    if change is not None:
        change(doc)
    return json.dumps(doc, **dump).encode("utf-8")


def reversed_keys(value):
    if isinstance(value, dict):
        return {k: reversed_keys(value[k]) for k in reversed(list(value))}
    return [reversed_keys(v) for v in value] if isinstance(value, list) else value


def string_merges(doc):
    doc["model"]["merges"] = [" ".join(pair) for pair in doc["model"]["merges"]]


def test_a_compact_save_is_the_same_tokenizer(bpe, tmp_path):
    compact = tmp_path / "compact.json"
    tokenizers.Tokenizer.from_str(bpe.decode()).save(str(compact), pretty=False)
    assert compact.read_bytes() != bpe
    assert tokenizer_identity(compact.read_bytes()) == tokenizer_identity(bpe)


@pytest.mark.parametrize(
    "variant",
    [
        lambda d: reshaped(d, separators=(",", ":")),
        lambda d: json.dumps(reversed_keys(json.loads(d)), indent=4).encode(),
        lambda d: reshaped(d, string_merges),  # tokenizers < 0.20 wrote merges as "a b"
        lambda d: reshaped(d, ensure_ascii=True),  # \u0120 for Ġ
        lambda d: reshaped(d, lambda doc: doc["model"].pop("ignore_merges")),  # older writer
        lambda d: reshaped(d, lambda doc: doc["added_tokens"].reverse()),
        lambda d: reshaped(d, lambda doc: doc.update(version="9.9", decoder=None)),
        lambda d: reshaped(d, lambda doc: doc.update(post_processor=NO_OP_TEMPLATE)),
    ],
    ids=["compact", "key-order", "string-merges", "ascii", "no-default-flag",
         "added-order", "decoder", "no-op-template"],
)  # fmt: skip
def test_the_same_ids_are_the_same_identity(bpe, variant):
    other = variant(bpe)
    assert other != bpe
    assert tokenizer_identity(other) == tokenizer_identity(bpe)


def swap_specials(doc):
    first, second = doc["added_tokens"][:2]
    first["content"], second["content"] = second["content"], first["content"]


@pytest.mark.parametrize(
    "change",
    [
        lambda doc: doc["model"]["merges"].reverse(),
        lambda doc: doc["model"]["vocab"].update({"Ġt": doc["model"]["vocab"]["Ġw"],
                                                  "Ġw": doc["model"]["vocab"]["Ġt"]}),
        lambda doc: doc.update(normalizer={"type": "Lowercase"}),
        lambda doc: doc["pre_tokenizer"].update(add_prefix_space=True),
        swap_specials,
        lambda doc: doc["added_tokens"][1].update(special=False),
        lambda doc: doc.update(post_processor={
            "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>",
            "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [0], "tokens": ["<bos>"]}}}),
    ],
    ids=["merges", "vocab", "normalizer", "pre-tokenizer", "special-ids", "special-flag",
         "bos-template"],
)  # fmt: skip
def test_what_changes_ids_is_another_identity(bpe, change):
    assert tokenizer_identity(reshaped(bpe, change)) != tokenizer_identity(bpe)


def test_records_carry_it_and_same_tokenizer_compares_it(bpe, tmp_path):
    (tmp_path / "a.json").write_bytes(bpe)
    (tmp_path / "b.json").write_bytes(reshaped(bpe, separators=(",", ":")))
    a = tokenizer_record(HFTokenizer(tmp_path / "a.json"))[0]
    b = tokenizer_record(HFTokenizer(tmp_path / "b.json"))[0]
    assert a["sha256"] != b["sha256"] and a["identity"] == tokenizer_identity(bpe)
    assert same_tokenizer(a, b) and same_tokenizer(b, a)
    other = {**b, "identity": "0" * 64}
    assert not same_tokenizer(a, other)
    # a record written before identities: the same bytes are the same tokenizer, else unknown
    old = {k: v for k, v in a.items() if k != "identity"}
    assert same_tokenizer(old, a) and not same_tokenizer(old, b)
    assert same_tokenizer({"kind": "byte", "vocab_size": 256}, {"kind": "byte"})
    assert not same_tokenizer({"kind": "byte", "vocab_size": 256}, a)


def test_the_same_tokenizer_saved_by_transformers_is_the_same(bpe, tmp_path):
    """transformers 5 re-saves a tokenizer.json with a template that adds nothing; its ids
    (transformers' own, the oracle) are the file's, and so is its identity."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    (tmp_path / "bpe.json").write_bytes(bpe)
    saved = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "bpe.json"), bos_token="<bos>", eos_token="</s>"
    )
    saved.save_pretrained(tmp_path / "out")
    data = (tmp_path / "out" / "tokenizer.json").read_bytes()
    assert data != bpe
    text = "It was the age of wisdom, naïve café"
    ours = HFTokenizer(tmp_path / "bpe.json")(text)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "out")(text)["input_ids"] == ours
    assert tokenizer_identity(data) == tokenizer_identity(bpe)
