"""Import checks the ids it keeps (issue 55 item 4): ``generation_config.json``'s
``eos_token_id: 99999`` for a 300-row vocabulary, or a special token the tokenizer lacks, was
kept, and the export then had one token more than the model has rows (transformers adds a
missing special token as a new id). An id outside the model's vocabulary and a special token
the tokenizer cannot produce are refused in one line naming the file and the key, before
anything is written; ``export`` refuses a checkpoint that records them (an import of an
earlier version), and ``export --verify`` a tokenizer longer than the embedding."""

from __future__ import annotations

import json

import pytest
from modelout_support import assert_one_line_error, invoke

from tests.modelout.test_import_checks import llama_dir, refused_before_writing

pytest.importorskip("tokenizers")


@pytest.mark.parametrize(
    "name, doc, needle",
    [
        ("generation_config.json", {"eos_token_id": 99999},
         "generation_config.json: eos_token_id 99999"),
        ("generation_config.json", {"eos_token_id": [2, 300]},
         "generation_config.json: eos_token_id 300"),
        ("generation_config.json", {"pad_token_id": -1}, "generation_config.json: pad_token_id -1"),
        ("generation_config.json", {"bos_token_id": "1"},
         "generation_config.json: bos_token_id '1'"),
    ],
    ids=["eos-99999", "eos-list", "negative-pad", "text-id"],
)  # fmt: skip
def test_an_id_outside_the_vocabulary_is_refused_naming_the_file_and_key(
    name, doc, needle, tmp_path
):
    src = llama_dir(tmp_path)
    (src / name).write_text(json.dumps(doc))
    result = invoke("import", src, tmp_path / "run")
    line = refused_before_writing(result, tmp_path, needle)
    assert "300" in line  # the vocabulary it must fit


def test_config_jsons_own_ids_are_held_to_the_vocabulary_too(tmp_path):
    src = llama_dir(tmp_path, eos_token_id=300)
    result = invoke("import", src, tmp_path / "run")
    refused_before_writing(result, tmp_path, "config.json: eos_token_id 300")


@pytest.mark.parametrize(
    "name, doc, needle",
    [
        ("tokenizer_config.json", {"eos_token": "<|missing|>"},
         "tokenizer_config.json: eos_token '<|missing|>'"),
        ("special_tokens_map.json", {"pad_token": {"content": "<pad>", "special": True}},
         "special_tokens_map.json: pad_token '<pad>'"),
        ("tokenizer_config.json", {"additional_special_tokens": ["!", "<tool>"]},
         "tokenizer_config.json: additional_special_tokens '<tool>'"),
    ],
    ids=["eos", "pad-mapping", "additional"],
)  # fmt: skip
def test_a_special_token_the_tokenizer_lacks_is_refused(name, doc, needle, tmp_path):
    src = llama_dir(tmp_path)
    (src / name).write_text(json.dumps(doc))
    result = invoke("import", src, tmp_path / "run")
    refused_before_writing(result, tmp_path, needle, "tokenizer.json")


def test_ids_and_tokens_the_model_has_import(tmp_path):
    src = llama_dir(tmp_path)
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 299]}))
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "!", "bos_token": None}))
    result = invoke("import", src, tmp_path / "run")
    assert result.exit_code == 0, result.stderr


def recorded_specials(run, **specials):
    """Edit what the checkpoint records, as an import of an earlier version wrote it."""
    meta_path = next((run / "checkpoints").glob("step_*")) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["tokenizer"]["specials"] = specials
    meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "specials, needle",
    [
        ({"generation_ids": {"eos_token_id": 99999}},
         "tokenizer.specials.generation_ids.eos_token_id 99999"),
        ({"eos_token": "<|missing|>"}, "tokenizer.specials.eos_token '<|missing|>'"),
    ],
    ids=["id", "token"],
)  # fmt: skip
def test_export_refuses_a_checkpoint_that_records_them(specials, needle, tmp_path):
    src = llama_dir(tmp_path, vocab_size=256)
    assert invoke("import", src, tmp_path / "run").exit_code == 0
    recorded_specials(tmp_path / "run", **specials)
    result = invoke("export", tmp_path / "run", tmp_path / "exp")
    assert_one_line_error(result, "meta.json", needle)
    assert not (tmp_path / "exp").exists()


def test_export_verify_refuses_a_tokenizer_longer_than_the_embedding(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from speedtronic.modelout import export

    src = llama_dir(tmp_path, vocab_size=256)
    assert invoke("import", src, tmp_path / "run").exit_code == 0
    monkeypatch.setattr(export, "special_tokens", lambda *a: {"eos_token": "<|missing|>"})
    result = invoke("export", tmp_path / "run", tmp_path / "exp", "--verify")
    assert_one_line_error(result, "--verify", "257 tokens", "256", code=1)
    assert not (tmp_path / "exp").exists()
