"""Every checkpoint records its run's tokenizer (issue 29), so generate and export use the ids
the model learned: the meta.json record, the tokenizer.json copy beside the weights (atomic with
the save, listed with its size and hash, checked by ``ckpt inspect --verify`` and by resume), the
``Runtime.tokenizer`` seam for each data source, and the fallback for older checkpoints."""

from __future__ import annotations

import json
import os

import pytest
from modelout_support import config_of, invoke, latest, train, train_text, write_bpe

from speedtronic.checkpoint.layout import TOKENIZER_FILE, verify_checkpoint
from speedtronic.checkpoint.save import save_checkpoint
from speedtronic.checkpoint.tokenizer import tokenizer_from_record, tokenizer_record
from speedtronic.data.tokenizer import ByteTokenizer, HFTokenizer
from speedtronic.errors import CheckpointError


def meta_of(checkpoint) -> dict:
    return json.loads((checkpoint / "meta.json").read_text())


def test_a_byte_level_text_run_records_byte_and_keeps_no_file(tmp_path):
    checkpoint = latest(train_text(tmp_path))
    meta = meta_of(checkpoint)
    assert meta["tokenizer"] == {"kind": "byte", "vocab_size": 256}
    assert not (checkpoint / TOKENIZER_FILE).exists() and TOKENIZER_FILE not in meta["files"]
    assert isinstance(tokenizer_from_record(meta, checkpoint, "x"), ByteTokenizer)


def test_a_tokenizers_file_travels_with_every_checkpoint(tmp_path):
    bpe = write_bpe(tmp_path)
    run = train_text(tmp_path, str(bpe), checkpoint={"interval": 3})
    for checkpoint in sorted((run / "checkpoints").glob("step_*")):
        meta = meta_of(checkpoint)
        assert (checkpoint / TOKENIZER_FILE).read_bytes() == bpe.read_bytes()
        assert meta["tokenizer"]["kind"] == "tokenizers" and meta["tokenizer"]["vocab_size"] > 256
        assert meta["files"][TOKENIZER_FILE]["bytes"] == bpe.stat().st_size
        assert verify_checkpoint(checkpoint) == ("ok", None)
    bpe.write_text("{}")  # the original changing later changes nothing the checkpoint holds
    again = tokenizer_from_record(meta, checkpoint, "x")
    assert isinstance(again, HFTokenizer) and again("it was the age") == HFTokenizer(
        checkpoint / TOKENIZER_FILE
    )("it was the age")


def damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x20
    else:
        data = data[:-10]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("how", "says"), [("flip", "sha256 mismatch"), ("cut", "bytes on disk")])
def test_inspect_verify_and_resume_account_for_the_tokenizer_file(tmp_path, how, says):
    run = train_text(tmp_path, str(write_bpe(tmp_path)), checkpoint={"interval": 3})
    newest = latest(run)
    damage(newest / TOKENIZER_FILE, how)
    status, problem = verify_checkpoint(newest)
    assert status == "damaged" and problem.startswith(TOKENIZER_FILE) and says in problem
    report = json.loads(invoke("ckpt", "inspect", run, "--verify", "--format", "json").stdout)
    entry = next(c for c in report["checkpoints"] if c["name"] == newest.name)
    assert entry["status"] == "damaged" and TOKENIZER_FILE in entry["problem"]
    from speedtronic.checkpoint.load import load_latest

    with pytest.warns(UserWarning, match=TOKENIZER_FILE):
        resumed = load_latest(run / "checkpoints")  # the damaged one is skipped, as any other
    assert resumed.path != newest


def test_a_synthetic_run_records_byte_ids(tmp_path):
    meta = meta_of(latest(train(tmp_path)))
    assert meta["tokenizer"] == {"kind": "byte", "vocab_size": 256}


def test_the_runtime_tokenizer_seam(tmp_path):
    """What each source gives ``Runtime.tokenizer``: a dataset's own ``tokenizer`` wins (how
    token shards with a manifest supply theirs), a user's dataset or callable is unknown."""
    import torch

    from speedtronic.runtime import build_runtime

    class Blocks(torch.utils.data.Dataset):
        def __init__(self, tokenizer=None):
            self.tokenizer = tokenizer

        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.arange(17) % 64
            return {"input_ids": ids[:-1], "labels": ids[1:]}

    config = config_of(tmp_path)
    bpe = HFTokenizer(write_bpe(tmp_path))
    assert build_runtime(config, console=False).tokenizer.__class__ is ByteTokenizer
    assert build_runtime(config, dataset=Blocks(), console=False).tokenizer is None
    assert build_runtime(config, dataset=Blocks(bpe), console=False).tokenizer is bpe
    text = config_of(
        tmp_path, model={"vocab_size": 256}, data={"text_path": str(write_text(tmp_path))}
    )
    assert build_runtime(text, console=False).tokenizer.__class__ is ByteTokenizer
    custom = build_runtime(text, tokenizer=lambda s: list(s.encode()), console=False)
    assert custom.tokenizer is not None and tokenizer_record(custom.tokenizer) == (None, None)
    tokens = config_of(tmp_path, data={"token_path": str(write_tokens(tmp_path))})
    assert build_runtime(tokens, console=False).tokenizer is None


def write_text(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abc def ghi\n" * 400)
    return path


def write_tokens(tmp_path):
    import numpy as np

    path = tmp_path / "t.bin"
    (np.arange(4096) % 64).astype(np.uint16).tofile(path)
    return path


def test_an_unknown_tokenizer_is_recorded_as_null(tmp_path):
    from speedtronic.runtime import train_from_config

    config = config_of(tmp_path, data={"text_path": str(write_text(tmp_path))})
    train_from_config(config, tokenizer=lambda s: [b % 64 for b in s.encode()], console=False)
    checkpoint = latest(tmp_path / "run")
    assert meta_of(checkpoint)["tokenizer"] is None
    assert tokenizer_from_record(meta_of(checkpoint), checkpoint, "x") is None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"tokenizer": "byte"}, ByteTokenizer),
        ({"tokenizer": "byte", "text_path": "x.txt"}, ByteTokenizer),
        ({"tokenizer": "byte", "token_path": "x.bin"}, type(None)),
        ({"tokenizer": "tok.json", "text_path": "x.txt"}, type(None)),
    ],
)
def test_a_checkpoint_from_before_the_record_falls_back_on_its_config(tmp_path, data, expected):
    meta = {"config": {"data": data}}  # no "tokenizer" key at all
    assert type(tokenizer_from_record(meta, tmp_path, "x")) is expected


def test_a_record_whose_file_is_missing_or_other_is_refused(tmp_path):
    record, data = tokenizer_record(HFTokenizer(write_bpe(tmp_path)))
    with pytest.raises(CheckpointError, match="cannot be read"):
        tokenizer_from_record({"tokenizer": record}, tmp_path, "RUN")
    (tmp_path / TOKENIZER_FILE).write_bytes(data.replace(b"<bos>", b"<BOS>"))
    with pytest.raises(CheckpointError, match="not the tokenizer meta.json records"):
        tokenizer_from_record({"tokenizer": record}, tmp_path, "RUN")
    with pytest.raises(CheckpointError, match="of a kind unknown here"):
        tokenizer_from_record({"tokenizer": {"kind": "sentencepiece"}}, tmp_path, "RUN")


def test_save_keeps_only_known_extra_files_and_writes_them_inside_the_atomic_rename(tmp_path):
    import torch

    state = {"w": torch.zeros(2)}
    with pytest.raises(CheckpointError, match="only tokenizer.json"):
        save_checkpoint(tmp_path, 1, state, {}, {"run_id": "r"}, extra_files={"x.py": b"1"})
    real_rename, seen = os.rename, []

    def rename(src, dst):
        seen.append(sorted(os.listdir(src)) if os.path.isdir(src) else None)
        return real_rename(src, dst)

    os.rename = rename
    try:
        path = save_checkpoint(
            tmp_path, 2, state, {}, {"run_id": "r"}, extra_files={TOKENIZER_FILE: b"{}"}
        )
    finally:
        os.rename = real_rename
    assert ["meta.json", "model.safetensors", TOKENIZER_FILE, "trainer_state.pt"] in seen
    assert verify_checkpoint(path) == ("ok", None)
