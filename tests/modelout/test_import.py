"""``speedtronic import`` (issue 37): a transformers-written Llama becomes a run at step 0.

transformers writes the sources (tiny random models, tied and untied, sharded or not) and is
the oracle: the imported run's export gives the source's tensors back bit for bit, greedy
``generate --temperature 0`` equals transformers' greedy, ``--verify`` holds the logits within
1e-5, and what does not map (GPT-2, a RoPE scaling, a sliding window, experts, pickled weights)
is refused in one line before OUT exists. A Hub model repo on the emulator imports like the
same directory.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers  # the oracle: a test dependency (the dev extra), never one of training
from modelout_support import assert_one_line_error, assert_same_tensors, invoke, tensors, write_bpe
from safetensors.torch import load_file

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SIZES = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
)


def llama_dir(tmp_path, name="src", tied=True, dtype=torch.float32, shard=None, **changes):
    """A random LlamaForCausalLM saved by transformers, with a tokenizers file beside it."""
    torch.manual_seed(len(name))
    config = transformers.LlamaConfig(**{**SIZES, **changes}, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    folder = tmp_path / name
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    shutil.copy(write_bpe(tmp_path), folder / "tokenizer.json")
    return folder


@pytest.mark.parametrize(
    "tied, dtype, shard, export_dtype",
    [
        (True, torch.float32, None, "fp32"),
        (False, torch.float32, None, "fp32"),
        (False, torch.bfloat16, None, "bf16"),
        (True, torch.float32, "60KB", "fp32"),
    ],
    ids=["tied", "untied", "untied-bf16", "sharded"],
)
def test_import_then_export_gives_the_sources_tensors_bit_for_bit(
    tied, dtype, shard, export_dtype, tmp_path
):
    src = llama_dir(tmp_path, tied=tied, dtype=dtype, shard=shard)
    if shard:
        assert (src / "model.safetensors.index.json").is_file()
    result = invoke("import", src, tmp_path / "run")
    assert result.exit_code == 0, result.stderr
    result = invoke("export", tmp_path / "run", tmp_path / "exp", "--dtype", export_dtype)
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(tensors(src), tensors(tmp_path / "exp"))
    stored = json.loads((tmp_path / "run/checkpoints/step_0000000000/meta.json").read_text())
    assert stored["config"]["model"]["tie_embeddings"] is tied
    assert stored["tokenizer"]["kind"] == "tokenizers"  # recorded, as a trained run's is


def test_the_imported_run_generates_transformers_greedy_tokens(tmp_path):
    src = llama_dir(tmp_path, tied=False)
    assert invoke("import", src, tmp_path / "run").exit_code == 0
    result = invoke(
        "generate", tmp_path / "run", "-p", "it was the", "--temperature", "0",
        "--max-new-tokens", "12", "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    ours = json.loads(result.stdout.splitlines()[0])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    prompt = transformers.AutoTokenizer.from_pretrained(tmp_path / "run" / "tokenizer")(
        "it was the", add_special_tokens=False
    )["input_ids"]
    out = theirs.generate(
        torch.tensor([prompt]), max_new_tokens=len(ours["tokens"]), do_sample=False
    )
    assert ours["tokens"] == out[0, len(prompt) :].tolist()[: len(ours["tokens"])]
    assert ours["tokens"] and ours["prompt_tokens"] == len(prompt)


def test_import_verify_compares_logits_and_greedy_tokens(tmp_path):
    src = llama_dir(tmp_path)
    result = invoke("import", src, tmp_path / "run", "--verify", "--format", "json")
    assert result.exit_code == 0, result.stderr
    verified = json.loads(result.stdout)["verified"]
    assert verified["max_diff"] <= 1e-5 and len(verified["greedy_tokens"]) > 0
    inspect = invoke("ckpt", "inspect", tmp_path / "run", "--verify")
    assert inspect.exit_code == 0, inspect.stderr


def test_a_verify_that_disagrees_writes_nothing(tmp_path, monkeypatch):
    from speedtronic.modelout import verify

    monkeypatch.setattr(verify, "IMPORT_TOLERANCE", -1.0)  # no difference can pass
    result = invoke("import", llama_dir(tmp_path), tmp_path / "run", "--verify")
    assert_one_line_error(result, "--verify: transformers' logits differ", code=1)
    assert not (tmp_path / "run").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_gpt2_is_refused_in_one_line_naming_it_and_nothing_is_written(tmp_path):
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    result = invoke("import", tmp_path / "gpt2", tmp_path / "run")
    assert_one_line_error(result, "model_type: 'gpt2' is not supported")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type: 'yarn'"),
        ({"sliding_window": 32}, "sliding_window: 32"),
        ({"num_local_experts": 8}, "num_local_experts: 8"),
        ({"hidden_act": "gelu"}, "hidden_act: 'gelu'"),
        ({"mlp_bias": True}, "mlp_bias: True"),
    ],
    ids=["rope-yarn", "sliding-window", "moe", "gelu", "mlp-bias"],
)
def test_what_does_not_map_is_refused_before_anything_is_written(changes, needle, tmp_path):
    src = llama_dir(tmp_path)
    edit_config(src, **changes)
    result = invoke("import", src, tmp_path / "run")
    assert_one_line_error(result, needle, "config.json")
    assert not (tmp_path / "run").exists()


def test_pickled_weights_are_never_read(tmp_path):
    src = llama_dir(tmp_path)
    weights = load_file(str(src / "model.safetensors"))
    (src / "model.safetensors").unlink()
    torch.save(weights, src / "pytorch_model.bin")
    result = invoke("import", src, tmp_path / "run")
    assert_one_line_error(result, "pytorch_model.bin", "never loaded")
    assert not (tmp_path / "run").exists()


def test_a_non_empty_out_is_refused_and_left_alone(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mine.txt").write_text("keep")
    result = invoke("import", llama_dir(tmp_path), tmp_path / "run")
    assert_one_line_error(result, "is not empty")
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["mine.txt"]


@pytest.mark.hub
def test_a_hub_model_repo_imports_like_the_same_directory(
    hub_emulator, tmp_path, monkeypatch, library_sleeps
):
    src = llama_dir(tmp_path, tied=False, shard="60KB")
    files = {p.name: p.read_bytes() for p in src.iterdir()}
    files["pytorch_model.bin"] = b"not fetched: a pickle is never read"
    hub_emulator.create_repo("alice/tiny-llama", files=files)
    monkeypatch.setenv("HF_ENDPOINT", hub_emulator.url)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    result = invoke("import", "hf://alice/tiny-llama@main", tmp_path / "run", "--format", "json")
    assert result.exit_code == 0, result.stderr
    sha = hub_emulator.repo("alice/tiny-llama").head.sha
    assert json.loads(result.stdout)["source"] == f"hf://alice/tiny-llama@{sha}"
    assert not list((tmp_path / "cache").rglob("pytorch_model.bin"))
    assert invoke("export", tmp_path / "run", tmp_path / "exp").exit_code == 0
    assert_same_tensors(tensors(src), tensors(tmp_path / "exp"))
    missing = invoke("import", "hf://alice/nope", tmp_path / "run2")
    assert missing.exit_code in (1, 2) and "alice/nope" in missing.stderr
    assert not (tmp_path / "run2").exists()


def train_config(tmp_path, name: str, **model) -> str:
    """A config for text in ``tmp_path``; ``model`` keys only when given (else it names none)."""
    import yaml
    from modelout_support import text_file

    config = {
        "run": {"max_steps": 12, "device": "cpu", "seed": 0, "output_dir": str(tmp_path / name)},
        "data": {"text_path": str(text_file(tmp_path)), "seq_len": 32, "micro_batch_size": 8,
                 "target_batch_size": 8},
        "optimizer": {"name": "adamw", "lr": 3e-3},
        "scheduler": {"warmup_steps": 2},
        "logging": {"every_steps": 1, "json_file": "metrics.jsonl"},
    }  # fmt: skip
    if model:
        config["model"] = {"name": "reference_transformer", **model}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def losses(tmp_path, name: str) -> list[float]:
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [r["loss"] for r in records if r.get("event") == "train_step"]


@pytest.mark.parametrize("how", ["import", "directory", "export"])
def test_a_run_from_a_pretrained_model_whose_config_names_no_model_learns(how, tmp_path):
    src = llama_dir(tmp_path)
    init = src
    if how in ("import", "export"):
        assert invoke("import", src, tmp_path / "imported").exit_code == 0
        init = tmp_path / "imported"
    if how == "export":  # the project's own export directory said "no usable checkpoint"
        assert invoke("export", init, tmp_path / "exported").exit_code == 0
        init = tmp_path / "exported"
    result = invoke("train", "-c", train_config(tmp_path, "tuned"), "--init-from", init)
    assert result.exit_code == 0, result.stderr
    meta = json.loads((tmp_path / "tuned/checkpoints/step_0000000012/meta.json").read_text())
    assert meta["config"]["model"]["n_kv_head"] == 2 and meta["config"]["model"]["d_model"] == 64
    assert meta["tokenizer"]["vocab_size"] == 300  # the source's tokenizer, not bytes
    first, *_, last = losses(tmp_path, "tuned")
    assert last < first - 0.5  # it learns


def test_a_model_key_that_changes_the_function_is_refused_unless_overridden(tmp_path):
    """Issue 35: n_head 8 instead of 4 keeps every tensor's shape and loaded silently."""
    src = llama_dir(tmp_path, num_key_value_heads=4)  # n_kv_head: None follows n_head
    keys = dict(vocab_size=300, n_layer=2, d_model=64, mlp_hidden=96,
                rope_theta=100000.0, norm_eps=1e-5, tie_embeddings=True)  # fmt: skip
    same = invoke("train", "-c", train_config(tmp_path, "same", n_head=4, **keys),
                  "--init-from", src, "--max-steps", "1")  # fmt: skip
    assert same.exit_code == 0, same.stderr
    config = train_config(tmp_path, "other", n_head=8, **keys)
    result = invoke("train", "-c", config, "--init-from", src)
    assert_one_line_error(result, "model.n_head is 8 here and 4 in", "--init-override n_head")
    assert not (tmp_path / "other").exists()
    for key, value in [("rope_theta", 10000.0), ("norm_eps", 1e-6), ("tie_embeddings", False)]:
        changed = train_config(tmp_path, key, **{**keys, "n_head": 4, key: value})
        refused = invoke("train", "-c", changed, "--init-from", src)
        assert_one_line_error(refused, f"model.{key} is {value!r} here and")
    allowed = invoke("train", "-c", config, "--init-from", src, "--init-override", "n_head",
                     "--init-override", "n_kv_head", "--max-steps", "1")  # fmt: skip
    assert allowed.exit_code == 0, allowed.stderr


@pytest.mark.hub
def test_init_from_a_hub_model(hub_emulator, tmp_path, monkeypatch, library_sleeps):
    src = llama_dir(tmp_path)
    hub_emulator.create_repo(
        "alice/tiny-llama", files={p.name: p.read_bytes() for p in src.iterdir()}
    )
    monkeypatch.setenv("HF_ENDPOINT", hub_emulator.url)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = train_config(tmp_path, "tuned")
    result = invoke(
        "train", "-c", config, "--init-from", "hf://alice/tiny-llama", "--max-steps", "2"
    )
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "tuned/checkpoints/step_0000000002/tokenizer.json").is_file()


def test_an_imported_runs_completion_is_its_tokenizers_decode(tmp_path):
    # issue 57: a tail of byte tokens that formed no character was held, then dropped
    src = llama_dir(tmp_path, tied=False)
    assert invoke("import", src, tmp_path / "run").exit_code == 0
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "run" / "tokenizer")
    prompt = ("-p", "def main():\n    return", "--temperature", "0", "--no-stop")

    def sample(n: int, *args: str):
        result = invoke("generate", tmp_path / "run", *prompt, "--max-new-tokens", n, *args)
        assert result.exit_code == 0, result.stderr
        return result.stdout

    tokens = json.loads(sample(20, "--format", "json"))["tokens"]
    # this random model's greedy tokens hold bytes that form no character: end a sample there
    n = next(n for n in range(1, 21) if theirs.decode(tokens[:n]).endswith("\ufffd"))
    decoded = theirs.decode(tokens[:n])
    as_json = json.loads(sample(n, "--format", "json"))
    assert as_json["tokens"] == tokens[:n] and as_json["completion"] == decoded
    assert sample(n) == "def main():\n    return" + decoded + "\n"
