"""The ``--init-from`` source's tokenizer against the data's: a model and its tokenizer are one.

Issue 48: a token folder tokenized as bytes, or with another tokenizer of the same size, trained
from an imported model without a word (first-step loss 10.15 and 8.18 against 6.15 with the
model's own), and the checkpoints then recorded the data's tokenizer, so ``generate``, ``eval``
and ``export`` used the wrong one. ``check_tokenizer`` compares the source's tokenizer record
(``InitSource.record``) with what the data was tokenized with: a token folder's manifest, or
the text's ``data.tokenizer``. Another tokenizer is one exit-2 line naming both, unless
``checkpoint.allow_tokenizer_mismatch`` (``--allow-tokenizer-mismatch``) says it is meant: then
a warning, and the run records the data's tokenizer. Tokenizers are compared by identity
(``checkpoint.tokenizer.same_tokenizer``): the source's tokenizer saved compactly is the same
one (issue 53 item 9). Where either side is unknown (synthetic data, a source that recorded
none) there is nothing to compare; a flat token file names no tokenizer, which one warning line
says (issue 55 item 6: it trained without a word).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from speedtronic.checkpoint.tokenizer import describe, same_tokenizer, tokenizer_record
from speedtronic.errors import ConfigError

if TYPE_CHECKING:
    from speedtronic.config import SpeedtronicConfig


def check_tokenizer(
    config: SpeedtronicConfig, source: Any, warn: Callable[[str], None]
) -> dict | None:
    """Refuse (or with the switch, ``warn`` about) data of another tokenizer than
    ``source``'s (an ``init_source.InitSource``, whose module imports this one); the source's
    special tokens for the run to record when the data's tokenizer is its own."""
    data = data_record(config)
    if source.record is None:
        return None
    if data is None:
        if config.data.resolved_source == "tokens":  # a flat file: a folder names its own
            warn(
                f"checkpoint.init_from: data.token_path {config.data.token_path} is a flat token "
                f"file, which does not say its tokenizer: it cannot be checked against "
                f"{source.where}'s {describe(source.record)}; tokenize with that one (speedtronic "
                "data tokenize) to have it checked"
            )
        return None
    where, record = data
    if same_tokenizer(record, source.record):
        specials = source.record.get("specials")
        check_template(config, source, specials, warn)
        return specials if isinstance(specials, dict) else None
    theirs, ours = describe(source.record), describe(record)
    if config.checkpoint.allow_tokenizer_mismatch:
        warn(
            f"checkpoint.init_from: {where} is tokenized with {ours}, not {source.where}'s "
            f"{theirs}; training on it as --allow-tokenizer-mismatch says, and the checkpoints "
            "record the data's tokenizer"
        )
        return None
    own = "byte" if source.record.get("kind") == "byte" else source.tokenizer or "its tokenizer"
    raise ConfigError(
        f"checkpoint.init_from: {where} is tokenized with {ours}, but {source.where} was "
        f"trained with {theirs}: its weights would read other tokens than they learned",
        hint=f"tokenize the data with --tokenizer {own}, or pass --allow-tokenizer-mismatch "
        "(checkpoint.allow_tokenizer_mismatch) to train on it anyway",
    )


def check_template(config: SpeedtronicConfig, source: Any, specials: Any, warn) -> None:
    """A chat folder (``data tokenize --chat``) rendered with another chat template than the
    one ``source`` came with is refused like another tokenizer: the model would learn turns it
    is never prompted with (``generate`` and ``export`` use the source's)."""
    import hashlib

    from speedtronic.data.manifest import is_shard_dir, read_manifest

    data = config.data
    if data.resolved_source != "tokens" or not is_shard_dir(data.token_path or ""):
        return
    chat = read_manifest(data.token_path, "data.token_path").get("chat")
    if not isinstance(chat, dict):
        return
    template = specials.get("chat_template") if isinstance(specials, dict) else None
    if isinstance(template, str):
        if hashlib.sha256(template.encode("utf-8")).hexdigest() == chat.get("template_sha256"):
            return
        theirs = (
            f"another chat template (sha256 {hashlib.sha256(template.encode()).hexdigest()[:12]})"
        )
    else:
        theirs = "no chat template"
    where = f"data.token_path {data.token_path}"
    digest = str(chat.get("template_sha256"))[:12]
    ours = f"the chat template of {chat.get('template_from')} (sha256 {digest})"
    if config.checkpoint.allow_tokenizer_mismatch:
        warn(f"checkpoint.init_from: {where} is rendered with {ours}, but {source.where} has "
             f"{theirs}; training on it as --allow-tokenizer-mismatch says")  # fmt: skip
        return
    raise ConfigError(
        f"checkpoint.init_from: {where} is rendered with {ours}, but {source.where} has {theirs}",
        hint=f"tokenize the conversations with --tokenizer {source.where} (its own template), "
        "or pass --allow-tokenizer-mismatch to train on them anyway",
    )


def data_record(config: SpeedtronicConfig) -> tuple[str, dict] | None:
    """Where the data names its tokenizer and that tokenizer's record; None when it does not
    (a flat token file, synthetic data)."""
    from speedtronic.data.manifest import is_shard_dir, read_manifest, tokenizer_of

    data = config.data
    source = data.resolved_source
    if source == "tokens" and data.token_path and is_shard_dir(data.token_path):
        manifest = read_manifest(data.token_path, "data.token_path")
        if not isinstance(manifest.get("tokenizer"), dict):
            return None
        # its record, with the identity of the folder's copy of the file (checked against it)
        record = tokenizer_record(tokenizer_of(data.token_path, manifest))[0]
        return (f"data.token_path {data.token_path}", record) if record is not None else None
    if source == "text":
        from speedtronic.data.tokenizer import load_tokenizer

        record = tokenizer_record(load_tokenizer(data.tokenizer))[0]
        return (f"data.tokenizer {data.tokenizer}", record) if record is not None else None
    return None
