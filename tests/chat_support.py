"""Shared by the chat tests (issue 56): a tiny Llama whose tokenizer has a ChatML-style chat
template, saved by transformers and imported, and a few conversations as JSON Lines."""

from __future__ import annotations

import json
from pathlib import Path

from modelout_support import invoke, write_bpe

SPECIALS = ("<bos>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>")
# ChatML as Qwen's templates write it; an unknown role is refused through raise_exception
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + m['role']) }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATIONS = [
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "it was the best of times?"},
        {"role": "assistant", "content": "it was the worst of times."},
    ],
    [
        {"role": "user", "content": "the age of wisdom"},
        {"role": "assistant", "content": "the age of foolishness"},
        {"role": "user", "content": "naïve café"},
        {"role": "assistant", "content": "Ünïcode, too 🙂"},
    ],
    [
        {"role": "user", "content": "it was"},
        {"role": "assistant", "content": "the best"},
    ],
]


def tokenizer_dir(
    tmp: Path, template: str | None = TEMPLATE, name: str = "tok", extra: tuple = ()
) -> Path:
    """A tokenizers file with the chat specials (and ``extra`` ones: another tokenizer),
    saved by transformers with ``template``."""
    import transformers

    folder = tmp / name
    folder.mkdir()
    bpe = write_bpe(tmp, specials=SPECIALS + extra)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(bpe), bos_token="<bos>", eos_token="</s>", pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )  # fmt: skip
    if template is not None:
        tok.chat_template = template
    tok.save_pretrained(folder)
    return folder


def chat_llama(tmp: Path) -> tuple[Path, Path]:
    """A tiny random LlamaForCausalLM with the chat tokenizer (``src``) and its import."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )  # fmt: skip
    src = tokenizer_dir(tmp, name="src")
    transformers.LlamaForCausalLM(config).save_pretrained(src)
    result = invoke("import", src, tmp / "imported")
    assert result.exit_code == 0, result.stderr
    return src, tmp / "imported"


def write_jsonl(path: Path, rows: list, key: str = "messages") -> Path:
    path.write_text("".join(json.dumps({key: r}) + "\n" for r in rows), encoding="utf-8")
    return path
