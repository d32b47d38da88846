"""Export gives back what import kept (issue 48 item 2): the tokenizer's special tokens, its
chat template, config.json's and generation_config.json's token ids, and the card's
``base_model``, for an imported model and for a run trained from it; ``export --verify`` holds
transformers' reading of them to the source's. transformers is the oracle."""

from __future__ import annotations

import shutil

import pytest
import transformers
import yaml
from modelout_support import assert_one_line_error, invoke, text_file, write_bpe

transformers.utils.logging.set_verbosity_error()
SPECIALS = ("<bos>", "</s>", "<pad>", "<tool>")
TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A tiny Llama whose tokenizer has BOS, EOS, PAD, one more special and a chat template,
    saved by transformers and imported."""
    tmp = tmp_path_factory.mktemp("specials")
    config = transformers.LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )  # fmt: skip
    src = tmp / "src"
    transformers.LlamaForCausalLM(config).save_pretrained(src)
    shutil.copy(write_bpe(tmp, specials=SPECIALS), src / "tokenizer.json")
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(src / "tokenizer.json"), bos_token="<bos>", eos_token="</s>",
        pad_token="<pad>", additional_special_tokens=["<tool>"],
    )  # fmt: skip
    tok.chat_template = TEMPLATE
    tok.save_pretrained(src)
    assert invoke("import", src, tmp / "run").exit_code == 0
    return tmp


def assert_round_trip(out):
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<bos>", "</s>", "<pad>")
    assert "<tool>" in tok.all_special_tokens and tok.chat_template == TEMPLATE
    assert tok("it was the")["input_ids"][0] not in (0, 1)  # still adds no BOS
    config = transformers.AutoConfig.from_pretrained(out)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (0, 1, 2)
    assert transformers.GenerationConfig.from_pretrained(out).eos_token_id == 1
    card = (out / "README.md").read_text()
    assert yaml.safe_load(card.split("---")[1])["base_model"] == "src"


def test_export_of_an_import_carries_the_sources_tokenizer(imported):
    result = invoke("export", imported / "run", imported / "exp", "--verify")
    assert result.exit_code == 0, result.stderr
    assert_round_trip(imported / "exp")


def test_a_run_trained_from_the_import_exports_them_too(imported, tmp_path):
    data = {"text_path": str(text_file(tmp_path)), "seq_len": 16}
    data.update(micro_batch_size=4, target_batch_size=4)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"run": {"device": "cpu", "max_steps": 1}, "data": data}))
    args = ("--init-from", imported / "run", "--output-dir", tmp_path / "tuned")
    assert invoke("train", "-c", config, *args).exit_code == 0
    result = invoke("export", tmp_path / "tuned", tmp_path / "exp", "--verify")
    assert result.exit_code == 0, result.stderr
    assert_round_trip(tmp_path / "exp")


def test_verify_refuses_an_export_that_drops_the_eos_token(imported, tmp_path, monkeypatch):
    from speedtronic.modelout import export

    monkeypatch.setattr(export, "special_tokens", lambda *a: {})  # the export of issue 48
    result = invoke("export", imported / "run", tmp_path / "exp", "--verify")
    assert_one_line_error(result, "--verify: the export's bos_token reads None", code=1)
    assert not (tmp_path / "exp").exists()


def test_base_model_is_the_hub_repo_an_import_came_from():
    from speedtronic.modelout.card import base_model

    meta = {"imported_from": {"source": "hf://alice/tiny-llama@" + "a" * 40}}
    assert base_model(meta, {}) == "alice/tiny-llama"
    assert base_model({}, {"checkpoint": {"init_from": "hf://bob/m@main"}}) == "bob/m"
    assert base_model({}, {"checkpoint": {"init_from": None}}) is None
