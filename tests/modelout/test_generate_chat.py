"""``generate --chat`` (issue 56): the prompt is a user's turn in the run's own chat template,
rendered as transformers renders it, and the end of the assistant's turn stops a sample."""

from __future__ import annotations

import json
from types import SimpleNamespace

import transformers  # the oracle: a test dependency, never one of training
from chat_support import chat_llama
from modelout_support import assert_one_line_error, invoke, train_text

from speedtronic.modelout.chat_prompt import chat_prompt


def test_the_prompt_is_transformers_rendering_and_the_turn_end_stops(tmp_path):
    src, run = chat_llama(tmp_path)
    result = invoke(
        "generate", run, "--chat", "-p", "it was the best of times?", "--temperature", "0",
        "--max-new-tokens", "4", "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    messages = [{"role": "user", "content": "it was the best of times?"}]
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert record["prompt"] == expected
    assert record["prompt_tokens"] == len(tok(expected, add_special_tokens=False)["input_ids"])


def test_the_end_of_a_turn_is_read_from_the_template():
    template = (
        "{% for m in messages %}[{{ m['content'] }}]<eot>\n{% endfor %}"
        "{% if add_generation_prompt %}[{% endif %}"
    )
    prompt, end = chat_prompt(SimpleNamespace(specials={"chat_template": template}), "hi")
    assert (prompt, end) == ("[hi]<eot>\n[", "]<eot>")


def test_a_run_without_a_chat_template_is_refused_in_one_line(tmp_path):
    run = train_text(tmp_path)  # byte-level: no template recorded
    result = invoke("generate", run, "--chat", "-p", "hi")
    assert_one_line_error(result, "--chat: this run's tokenizer records no chat template")
