"""``speedtronic eval --window`` (issue 48): a run is scored on the blocks it trained on (its
``data.seq_len``), not its model's whole context; an imported model, which records no training
length, at its context; a window past the context is refused in one line."""

from __future__ import annotations

import json
from types import SimpleNamespace

from modelout_support import assert_one_line_error, invoke, train_text

from speedtronic.evaluate.runner import choose_window


def test_eval_reads_the_training_blocks_and_window_sets_another(tmp_path):
    run = train_text(tmp_path, model={"seq_len": 32}, data={"seq_len": 8})
    text = tmp_path / "held.txt"
    text.write_text("It was the best of times, it was the worst of times. " * 4)
    default = invoke("eval", run, "--text", text, "--format", "json")
    assert default.exit_code == 0, default.stderr
    report = json.loads(default.stdout)
    assert (report["window"], report["window_from"]) == (8, "training")
    assert report["texts"][0]["stride"] == 8
    assert "window 8: the run's training seq_len" in invoke("eval", run, "--text", text).stdout
    wide = json.loads(
        invoke("eval", run, "--text", text, "--window", 32, "--format", "json").stdout
    )
    assert (wide["window"], wide["window_from"]) == (32, "option")
    too_wide = invoke("eval", run, "--text", text, "--window", 33)
    assert_one_line_error(too_wide, "--window 33", "context of 32 tokens")


def fake_run(data_seq_len, imported: bool):
    model = SimpleNamespace(config=SimpleNamespace(seq_len=2048))
    meta = {"imported_from": {"source": "hf://org/model"}} if imported else {}
    config = {"data": {"seq_len": data_seq_len}, "model": {"seq_len": 2048}}
    return SimpleNamespace(model=model, meta=meta, config=config, context_len=data_seq_len or 2048)


def test_an_imported_model_is_read_at_its_context_and_a_run_at_its_training_length():
    assert choose_window(fake_run(None, imported=True), None) == (2048, "model")
    assert choose_window(fake_run(256, imported=False), None) == (256, "training")
    assert choose_window(fake_run(None, imported=False), None) == (2048, "training")
    assert choose_window(fake_run(256, imported=False), 1024) == (1024, "option")
