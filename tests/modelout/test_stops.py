"""Tokens that stop (issue 37): ``speedtronic generate`` ends a sample where the run's documents
end, and transformers' ``generate`` on the export stops at the same token.

The model is a random Llama written by transformers whose head row for ETX (0x03, the byte
tokenizer's document separator) is the row of the token greedy decoding picks most, scaled up a
little: wherever greedy would pick that token it picks ETX instead, so samples end after a
number of tokens that depends on the prompt. On 20 prompts, greedy ``speedtronic generate`` and
transformers' greedy ``generate`` of the export give the same tokens and stop at the same
place; ``--stop TEXT`` and ``--no-stop`` do what they say, and the JSON says why a sample ended.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
import transformers
from modelout_support import assert_one_line_error, invoke

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

PROMPTS = [f"{word} {n}" for word in ("the", "a", "we", "it", "go") for n in range(4)]  # 20
NEW = 24


def greedy(model, prompt: str) -> list[int]:
    ids = torch.tensor([list(prompt.encode())])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=NEW, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


@pytest.fixture(scope="module")
def etx_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("stops")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
        num_attention_heads=4, max_position_embeddings=64, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    seen = Counter(t for p in PROMPTS for t in greedy(model, p)[1:] if t != 3)
    favourite = seen.most_common(1)[0][0]
    with torch.no_grad():  # ETX wins wherever the favourite would
        model.lm_head.weight[3] = model.lm_head.weight[favourite] * 1.05
    model.save_pretrained(tmp_path / "src")
    assert invoke("import", tmp_path / "src", tmp_path / "run").exit_code == 0
    return tmp_path / "run"


def ours(run, prompt: str, *extra: str) -> dict:
    result = invoke(
        "generate", run, "-p", prompt, "--temperature", "0", "--max-new-tokens", NEW,
        "--tokenizer", "byte", "--format", "json", *extra,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout.splitlines()[0])


def test_transformers_stops_where_speedtronic_generate_does(etx_run, tmp_path):
    out = tmp_path / "hf"
    assert invoke("export", etx_run, out, "--tokenizer", "byte").exit_code == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.generation_config.eos_token_id == 3  # from the run's separator
    stopped = 0
    for prompt in PROMPTS:
        mine = ours(etx_run, prompt)
        assert greedy(model, prompt) == mine["tokens"], prompt  # the export's own eos
        ended = mine["tokens"][-1] == 3
        stopped += ended
        assert mine["stop"] == ("eos" if ended else "max_tokens")
        assert "\x03" not in mine["completion"]  # the end token is not part of the text
    assert 5 <= stopped  # samples do end early: the comparison has teeth


def test_stop_texts_and_no_stop(etx_run):
    prompt, default = next(
        (p, d) for p in PROMPTS if (d := ours(etx_run, p))["stop"] == "eos"
    )  # a prompt whose sample ends at ETX
    free = ours(etx_run, prompt, "--no-stop")
    assert free["stop"] == "max_tokens" and len(free["tokens"]) == NEW
    assert free["tokens"][: len(default["tokens"])] == default["tokens"]
    text = free["completion"]
    stop = text[1:3]
    cut = ours(etx_run, prompt, "--no-stop", "--stop", stop, "--stop", "never in it")
    assert cut["stop"] == "stop_text" and cut["completion"] == text[: text.find(stop)]
    empty = invoke("generate", etx_run, "--tokenizer", "byte", "--stop", "")
    assert_one_line_error(empty, "--stop: an empty text")
