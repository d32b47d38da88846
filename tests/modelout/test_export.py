"""``speedtronic export`` (issue 29): a directory that transformers loads as the same model.

transformers is the oracle here (a test dependency, never one of training): the mapping of the
reference transformer onto ``LlamaForCausalLM`` holds for every option it maps (logits within
1e-5 in float32, the same tensor names transformers itself uses), a field it cannot map is
refused, a trained run's export gives the run's logits and greedy tokens, the tokenizer gives
the run's ids, and an OUT that is not an export is never touched.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
import transformers  # the oracle: a test dependency (the dev extra), never one of training
from modelout_support import (
    assert_one_line_error,
    invoke,
    latest,
    train,
    train_text,
    write_bpe,
)

from speedtronic.model import ReferenceConfig, ReferenceTransformer
from speedtronic.modelout import llama
from speedtronic.modelout.llama import ExportError, check_exportable

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()


def hf_model_from(config: ReferenceConfig, model: ReferenceTransformer, tmp_path):
    """LlamaForCausalLM built from our config.json, our weights loaded strictly by name."""
    from safetensors.torch import save_file

    folder = tmp_path / "hf"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(llama.llama_config(config, "fp32")))
    save_file(llama.llama_state(model, "fp32"), str(folder / "model.safetensors"), {"format": "pt"})
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


MAPPED_VARIANTS = {
    "mha-tied": {},
    "gqa": {"n_kv_head": 2},
    "mqa-untied": {"n_kv_head": 1, "tie_embeddings": False},
    "mlp-theta-eps": {"mlp_hidden": 96, "rope_theta": 500000.0, "norm_eps": 1e-6, "n_layer": 3},
    "zero-init-projections": {"zero_init_projections": True},
}


@pytest.mark.parametrize("variant", MAPPED_VARIANTS.values(), ids=list(MAPPED_VARIANTS))
def test_the_reference_model_is_llama_for_every_option_export_maps(variant, tmp_path):
    """Fails the day model.py drifts from LlamaForCausalLM (a renamed tensor, another RoPE
    pairing, a bias, another norm): the same names as transformers' own model, equal logits."""
    torch.manual_seed(0)
    config = ReferenceConfig(
        **{"vocab_size": 131, "seq_len": 48, "n_layer": 2, "n_head": 4, "d_model": 64, **variant}
    )
    ours = ReferenceTransformer(config).eval()
    with torch.no_grad():  # not the init's values: every norm weight and head differs too
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    theirs = hf_model_from(config, ours, tmp_path)
    expected = set(theirs.state_dict()) - ({"lm_head.weight"} if config.tie_embeddings else set())
    assert set(llama.llama_state(ours, "fp32")) == expected
    ids = torch.randint(0, 131, (3, 48))
    with torch.no_grad():
        diff = (ours(ids) - theirs(ids).logits).abs().max().item()
    assert diff <= 1e-5, diff


def non_default(f: dataclasses.Field):
    value = f.default
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "-other"
    return 1  # None: any set value is an option turned on


def test_every_model_field_is_mapped_or_refused_when_set():
    """A new ReferenceConfig field (a model option) makes export refuse until it is mapped."""
    base = ReferenceTransformer(ReferenceConfig(vocab_size=64, seq_len=16, d_model=32))
    check_exportable(base, "reference_transformer")
    for f in dataclasses.fields(ReferenceConfig):
        if f.name in llama.MAPPED_FIELDS:
            continue
        config = dataclasses.replace(base.config)
        object.__setattr__(config, f.name, non_default(f))
        model = ReferenceTransformer.__new__(ReferenceTransformer)
        nn_init = torch.nn.Module.__init__
        nn_init(model)
        model.config = config
        with pytest.raises(ExportError, match=f"model.{f.name}: .* has no LlamaForCausalLM"):
            check_exportable(model, "reference_transformer")


def test_a_tensor_llama_has_no_name_for_is_refused():
    model = ReferenceTransformer(ReferenceConfig(vocab_size=64, seq_len=16, d_model=32))
    model.blocks[0].attn.q_norm = torch.nn.LayerNorm(8)
    with pytest.raises(ExportError, match="no place for .*q_norm"):
        check_exportable(model, "reference_transformer")


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    return train_text(folder, data={"eval_fraction": 0.1, "eval_every": 3})


def test_a_trained_run_exports_and_transformers_gives_its_logits_and_greedy_tokens(
    byte_run, tmp_path
):
    out = tmp_path / "hf"
    result = invoke("export", byte_run, out)
    assert result.exit_code == 0, result.stderr
    assert f"wrote {out}" in result.stdout
    names = {p.name for p in out.iterdir()}
    assert names == {
        "config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
        "tokenizer_config.json", "README.md", "speedtronic_export.json",
    }  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    from speedtronic.modelout.source import open_run

    ours = open_run(byte_run).model
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(ids) - model(ids).logits).abs().max().item() <= 1e-5
    prompt = "It was the"
    mine = invoke(
        "generate", byte_run, "-p", prompt, "--temperature", 0, "--max-new-tokens", 6,
        "--format", "json",
    )  # fmt: skip
    assert mine.exit_code == 0, mine.stderr
    encoded = tokenizer(prompt, return_tensors="pt").input_ids
    assert encoded[0].tolist() == list(prompt.encode())  # no BOS added
    out_ids = model.generate(encoded, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert out_ids[0, encoded.shape[1] :].tolist() == json.loads(mine.stdout)["tokens"]


def test_config_json_states_every_field_transformers_would_default_otherwise(byte_run, tmp_path):
    out = tmp_path / "hf"
    assert invoke("export", byte_run, out).exit_code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["rope_theta"] == 10000.0
    assert config["rms_norm_eps"] == 1e-5 and config["tie_word_embeddings"] is True
    # issue 37: the byte tokenizer's document separator (ETX) is the EOS; no BOS is added
    assert config["bos_token_id"] is None and config["eos_token_id"] == 3
    from speedtronic.checkpoint.layout import read_safetensors_header

    header = read_safetensors_header(out / "model.safetensors")
    assert header["__metadata__"] == {"format": "pt"}
    assert "lm_head.weight" not in header  # tied: stored once, as transformers saves it
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert generation.eos_token_id == 3
    # no max_length: transformers warns on every generate(max_new_tokens=...) beside one
    assert "max_length" not in json.loads((out / "generation_config.json").read_text())


TEXTS = ["It was the best of times", "naïve café 🙂\n\tend", "", " leading  spaces "]


@pytest.mark.parametrize("bos_template", [False, True], ids=["plain", "bos-template"])
def test_autotokenizer_gives_the_ids_of_a_tokenizers_file_run(tmp_path, bos_template):
    """A tokenizer that adds a BOS in transformers would shift every id the model learned:
    the export drops that post-processor (Speedtronic tokenizes without special tokens)."""
    from speedtronic.data.tokenizer import HFTokenizer

    bpe = write_bpe(tmp_path, template_bos=bos_template)
    run = train_text(tmp_path, str(bpe))
    out = tmp_path / "hf"
    assert invoke("export", run, out, "--verify").exit_code == 0
    theirs, ours = transformers.AutoTokenizer.from_pretrained(out), HFTokenizer(bpe)
    for text in TEXTS:
        assert theirs(text)["input_ids"] == ours(text), text
        assert theirs.decode(ours(text)) == text


def test_autotokenizer_gives_bytes_for_a_byte_level_run(byte_run, tmp_path):
    out = tmp_path / "hf"
    assert invoke("export", byte_run, out).exit_code == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    every_byte = bytes(range(256)).decode("latin-1")
    for text in [*TEXTS, every_byte]:
        assert tokenizer(text)["input_ids"] == list(text.encode()), text
        assert tokenizer.decode(list(text.encode())) == text


def test_verify_and_bf16(byte_run, tmp_path):
    out = tmp_path / "hf16"
    result = invoke("export", byte_run, out, "--dtype", "bf16", "--verify", "--format", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verified"]["max_diff"] <= 1e-5 and len(report["verified"]["greedy_tokens"]) == 8
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert next(model.parameters()).dtype == torch.bfloat16
    text = invoke("export", byte_run, out, "--verify")  # over its own export: replaced
    assert text.exit_code == 0 and "replaced the export in" in text.stdout
    assert "max |logit difference|" in text.stdout


def test_a_failed_verify_writes_nothing(byte_run, tmp_path, monkeypatch):
    wrong = llama.llama_config

    def drifted(config, dtype, *ids):
        return {**wrong(config, dtype, *ids), "rope_theta": 500.0, "rope_parameters": None}

    monkeypatch.setattr(llama, "llama_config", drifted)
    out = tmp_path / "hf"
    result = invoke("export", byte_run, out, "--verify")
    assert_one_line_error(result, "logits differ", code=1)
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))


def test_an_occupied_out_is_refused_and_left_alone(byte_run, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert_one_line_error(invoke("export", byte_run, out), "not empty", "not written by")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    (tmp_path / "f").write_text("x")
    assert_one_line_error(invoke("export", byte_run, tmp_path / "f"), "is a file")
    made = tmp_path / "made"
    assert invoke("export", byte_run, made).exit_code == 0
    (made / "extra.bin").write_bytes(b"1")  # a file of the user's in an export: not ours
    assert_one_line_error(invoke("export", byte_run, made), "not written by")
    assert (made / "extra.bin").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert invoke("export", byte_run, empty).exit_code == 0


def test_bad_runs_and_options_are_one_line(byte_run, tmp_path):
    assert_one_line_error(invoke("export", tmp_path / "nope", tmp_path / "o"), "does not exist")
    assert_one_line_error(invoke("export", byte_run, tmp_path / "o", "--dtype", "fp8"), "--dtype")
    bad_repo = invoke("export", byte_run, tmp_path / "o", "--push", "not a repo")
    assert_one_line_error(bad_repo, "not a Hugging Face Hub repo id")
    assert not (tmp_path / "o").exists()


def test_a_model_that_is_not_the_reference_is_refused_with_what_to_do(tmp_path):
    run = train(tmp_path, model={"name": "modelout_support:LossOnly", "vocab_size": 64})
    message = assert_one_line_error(invoke("export", run, tmp_path / "o"), "LossOnly")
    assert "reference_transformer" in message
    result = invoke("export", run, tmp_path / "o")
    assert "hint:" in result.stderr and "plain safetensors" in result.stderr


def test_the_model_card_says_what_the_model_is_and_how_it_was_trained(byte_run, tmp_path):
    out = tmp_path / "hf"
    assert invoke("export", byte_run, out, "--push", "alice/tiny", "--help").exit_code == 0
    assert invoke("export", byte_run, out).exit_code == 0
    card = (out / "README.md").read_text()
    meta = json.loads((latest(byte_run) / "meta.json").read_text())
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert f"| parameters | {meta['param_count']:,} |" in card
    assert f"| tokens trained | {meta['tokens']:,} |" in card
    assert f"| final training loss | {meta['loss']:.4f} |" in card
    assert "| eval loss | " in card and "at step 6 |" in card  # eval_every 3: the last, step 6
    assert "byte-level" in card and "AutoModelForCausalLM.from_pretrained(" in card
    assert "text_path:" in card and "eval_every: 3" in card  # the config that trained it


def test_export_needs_a_tokenizer_and_says_how_to_give_one(tmp_path):
    from modelout_support import config_of

    from speedtronic.runtime import train_from_config

    config = config_of(tmp_path, model={"vocab_size": 256})
    config["data"]["text_path"] = str(tmp_path / "t.txt")
    (tmp_path / "t.txt").write_text("hello world\n" * 300)
    train_from_config(config, tokenizer=lambda s: list(s.encode()), console=False)
    run = tmp_path / "run"
    result = invoke("export", run, tmp_path / "o")
    assert_one_line_error(result, "does not record its run's tokenizer")
    assert invoke("export", run, tmp_path / "o", "--tokenizer", "byte").exit_code == 0


def test_an_export_of_a_copied_weights_directory(byte_run, tmp_path):
    """A directory with model.safetensors and meta.json only (a DumbDiLoCo final global)."""
    bare = tmp_path / "global"
    shutil.copytree(latest(byte_run), bare)
    (bare / "trainer_state.pt").unlink()
    assert invoke("export", bare, tmp_path / "o", "--verify").exit_code == 0


def test_transformers_stays_out_of_training():
    """transformers is the oracle and the optional --verify, never a dependency of training:
    one module imports it, and nothing that training loads reaches the model-out package."""
    from house.test_layering import MODULES, imports_of, load_closure, top

    users = {n for n in MODULES if any(top(i) == "transformers" for i in imports_of(n))}
    assert users == {"speedtronic.modelout.verify"}
    for engine in (
        "speedtronic.runtime",
        "speedtronic.train.trainer",
        "speedtronic.checkpoint.plugin",
    ):
        assert not [m for m in load_closure(engine) if m.startswith("speedtronic.modelout")]
    heavy = [m for m in load_closure("speedtronic.checkpoint.tokenizer") if top(m) == "torch"]
    assert not heavy  # ckpt inspect reads the record without torch


def test_the_eval_loss_comes_from_the_metrics_file_when_meta_has_none(tmp_path):
    from speedtronic.modelout.card import last_eval_loss

    run = train_text(
        tmp_path, data={"eval_fraction": 0.1, "eval_every": 2}, logging={"json_file": "m.jsonl"}
    )
    checkpoint = latest(run)
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert last_eval_loss(checkpoint, meta)[0] == 6
    recorded = last_eval_loss(checkpoint, {**meta, "eval_loss": None})
    assert recorded[0] == 6 and recorded[1] == pytest.approx(meta["eval_loss"]["loss"])
