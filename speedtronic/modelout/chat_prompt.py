"""``generate --chat``: a prompt as a user's turn in the run's own chat template, and the end of
the assistant's turn as where a sample stops (issue 56).

The template is the one the run's tokenizer record keeps (``specials.chat_template``: what
``speedtronic import`` read beside the model's ``tokenizer.json``, and what a fine-tune from it
inherits), rendered exactly as ``data tokenize --chat`` renders training conversations
(``data.ingest.chat.compile_template``: transformers' ``apply_chat_template`` environment), so
the model is prompted with the turns it was trained on. The end of a turn is read from the
template itself: what it writes after an assistant's answer (``<|im_end|>`` in ChatML,
``<|eot_id|>`` in Llama 3), stripped of whitespace.
"""

from __future__ import annotations

from typing import Any

from speedtronic.errors import ConfigError

_ANSWER = "\x1fspeedtronic-answer\x1f"  # a text no template writes by itself


def chat_prompt(tokenizer: Any, text: str) -> tuple[str, str | None]:
    """``(the prompt to continue, the end-of-turn text or None)`` for the user message ``text``."""
    from speedtronic.data.ingest.chat import SPECIAL_KEYS, compile_template

    specials = getattr(tokenizer, "specials", None) or {}
    template = specials.get("chat_template")
    if not isinstance(template, str) or not template:
        raise ConfigError(
            "--chat: this run's tokenizer records no chat template (a model imported without "
            "one, or a run trained from scratch); leave --chat out and write the prompt as text"
        )
    compiled = compile_template(template, "the run's tokenizer record")
    values = {key: specials[key] for key in SPECIAL_KEYS if isinstance(specials.get(key), str)}

    def render(messages: list[dict], generation: bool) -> str:
        try:
            return compiled.render(messages=messages, add_generation_prompt=generation, **values)
        except Exception as exc:  # the template's own raise_exception, or its bug
            raise ConfigError(
                f"--chat: the run's chat template failed ({type(exc).__name__}: {exc})"
            ) from None

    prompt = render([{"role": "user", "content": text}], True)
    whole = render(
        [{"role": "user", "content": text}, {"role": "assistant", "content": _ANSWER}], False
    )
    end = whole.partition(_ANSWER)[2].strip() if _ANSWER in whole else ""
    return prompt, end or None
