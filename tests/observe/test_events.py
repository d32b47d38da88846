"""`train --log-format json` (docs/events.md), the event record, and the loss sparklines.

The record and the sparkline are pure functions, tested on known inputs. Then a real
``speedtronic train --log-format json`` process (checkpoints and eval on) is parsed line by
line, and a one-process DumbDiLoCo run (a master that also trains, on a shared directory)
gives the outer-step events.
"""

from __future__ import annotations

import io
import json
import math
import sys

import proc_support
import pytest
import yaml
from proc_support import quiet_env
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.observe.history import BLOCKS, LossSeries, downsample, sparkline
from speedtronic.observe.metrics import (
    EVENT_SCHEMA_VERSION,
    MetricLogger,
    event_record,
    record_line,
)

runner = CliRunner()
ENVELOPE = ["event", "schema_version", "time"]
TEXT = "".join(f"line {i}: the quick brown fox {'x' * (i % 7)} jumps\n" for i in range(300))


# ---- the sparkline ----------------------------------------------------------------------


def test_sparkline_maps_lowest_to_highest_block():
    assert sparkline([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]) == BLOCKS
    assert sparkline([8.0, 1.0]) == "█▁"
    assert sparkline([]) == ""
    assert sparkline([3.0]) == sparkline([2.0, 2.0, 2.0])[:1] == "▄"  # flat: mid height


def test_sparkline_is_nan_safe():
    assert sparkline([1.0, math.nan, 3.0]) == "▁ █"
    assert sparkline([math.inf, 2.0, -math.inf, 1.0]) == " █ ▁"
    assert sparkline([math.nan, math.nan]) == "  "
    assert sparkline([None, "x", True, 1.0, 2.0]) == "   ▁█"  # not numbers: gaps too


def test_sparkline_downsamples_to_its_width():
    values = [10.0 - i / 100 for i in range(1000)]
    line = sparkline(values, width=20)
    assert len(line) == 20 and line[0] == "█" and line[-1] == "▁"
    assert list(line) == sorted(line, reverse=True)  # falling loss, falling blocks
    assert downsample([1.0, 3.0, math.nan, math.nan], 2) == [2.0, None]
    assert len(sparkline(values)) == 40 and sparkline(values, width=0) == ""


def test_loss_series_stays_bounded_with_exact_first_last_min():
    series = LossSeries(cap=16)
    for step in range(1, 1001):
        series.add(step, math.nan if step == 500 else 100.0 / step)
    assert len(series.points) <= 16 and series.count == 1000
    assert series.first == (1, 100.0) and series.last == (1000, 0.1)
    assert series.min == (1000, 0.1)
    steps = [s for s, _ in series.points]
    gaps = {b - a for a, b in zip(steps, steps[1:], strict=False)}
    assert len(gaps) == 1  # even resolution, whatever the merging
    line = series.sparkline()
    assert line[0] == "█" and line[-1] == "▁"
    assert series.describe().endswith("100.0000 -> 0.1000 (min 0.1000 at step 1000)")
    assert LossSeries().describe() == ""


# ---- the record -------------------------------------------------------------------------


class Scalar:  # what a tensor offers the record: .item()
    def __init__(self, value):
        self.value = value

    def item(self):
        return self.value


def test_record_has_the_envelope_and_conventional_names():
    record = event_record(
        "train_step",
        {"step": 3, "loss": math.nan, "memory_gb": 1.234567891, "grad_norm": Scalar(0.5)},
    )
    assert list(record)[:3] == ENVELOPE
    assert record["event"] == "train_step" and record["schema_version"] == EVENT_SCHEMA_VERSION
    assert abs(record["time"] - __import__("time").time()) < 5
    assert record["loss"] is None and record["grad_norm"] == 0.5
    assert record["memory_bytes"] == 1234567891 and "memory_gb" not in record
    renamed = event_record("diloco_publish", {"bytes": 10, "seconds": 0.5, "bytes_up": 1})
    assert renamed["size_bytes"] == 10 and renamed["elapsed_s"] == 0.5
    assert renamed["uploaded_bytes"] == 1
    spoofed = event_record("x", {"event": "y", "time": 0, "nested": {"a": [math.inf]}})
    assert spoofed["event"] == "x" and spoofed["time"] > 0 and spoofed["nested"] == {"a": [None]}
    line = record_line("eval", {"step": 1, "eval_loss": math.inf})
    assert "\n" not in line and json.loads(line)["eval_loss"] is None


def test_jsonl_file_holds_the_same_records(tmp_path):
    logger = MetricLogger(console=False, json_file=tmp_path / "m.jsonl")
    logger.log("checkpoint", {"step": 2, "path": "p"})
    logger.warn("careful")
    logger.close()
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["checkpoint", "warning"]
    assert all(list(r)[:3] == ENVELOPE for r in records) and records[1]["message"] == "careful"


def test_logging_level_filters_the_plain_lines_not_the_records(tmp_path):
    text, records = tmp_path / "log.txt", tmp_path / "m.jsonl"
    logger = MetricLogger(console=False, file=text, json_file=records, level="warning")
    logger.log("checkpoint", {"step": 2, "path": "p", "seconds": 0.1})
    logger.warn("careful")
    logger.close()
    assert text.read_text().splitlines() == ["warning: careful"]
    assert [json.loads(r)["event"] for r in records.open()] == ["checkpoint", "warning"]


def test_cli_at_logging_level_warning_prints_no_step_lines_but_the_summary(tiny, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    args = ["train", "-c", str(config), "--max-steps", "2"]
    quiet = CliRunner().invoke(app, [*args, "--set", "logging.level=warning"])
    loud = CliRunner().invoke(app, [*args, "--set", "run.output_dir=" + str(tmp_path / "b")])
    assert quiet.exit_code == 0 and loud.exit_code == 0, quiet.output + loud.output
    assert "step 2/2" in loud.stderr and "step 2/2" not in quiet.stderr
    assert "done: 2 steps" in quiet.stdout


# ---- a real run ---------------------------------------------------------------------------


def parse_stream(stdout: str) -> list[dict]:
    """Every stdout line is one JSON object with the envelope; nothing else is there."""
    lines = stdout.splitlines()
    assert lines, "no events on stdout"
    records = [json.loads(line) for line in lines]  # any other text fails here
    for record in records:
        assert isinstance(record, dict) and list(record)[:3] == ENVELOPE, record
        assert record["schema_version"] == EVENT_SCHEMA_VERSION
    assert records[0]["event"] == "run_start" and records[-1]["event"] == "run_end"
    assert [r["event"] for r in records].count("run_end") == 1
    steps = [r["step"] for r in records if r["event"] == "train_step"]
    assert steps == sorted(set(steps))
    times = [r["time"] for r in records]
    assert times == sorted(times)
    return records


def of(records: list[dict], event: str) -> list[dict]:
    return [r for r in records if r["event"] == event]


def test_train_log_format_json_process(tiny, tmp_path):
    """A real process: stdout is events only, eval and checkpoint events where configured."""
    (tmp_path / "corpus.txt").write_text(TEXT)
    tiny["model"]["vocab_size"] = 256
    tiny["data"].update(text_path=str(tmp_path / "corpus.txt"), eval_fraction=0.1, eval_every=2)
    tiny["checkpoint"] = {"interval": 2}
    tiny["logging"]["json_file"] = "metrics.jsonl"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    command = [sys.executable, "-m", "speedtronic", "train", "-c", str(config)]
    command += ["--max-steps", "4", "--log-format", "json"]
    done = proc_support.run(command, env=quiet_env())  # waited for by progress, not a clock
    assert done.returncode == 0, done.stderr
    records = parse_stream(done.stdout)
    assert [r["step"] for r in of(records, "train_step")] == [1, 2, 4]
    assert [r["step"] for r in of(records, "checkpoint")] == [2, 4]
    assert [r["step"] for r in of(records, "eval")] == [2, 4]
    assert all(r["eval_loss"] > 0 and r["eval_tokens"] > 0 for r in of(records, "eval"))
    assert all(r["eval_s"] > 0 for r in of(records, "eval"))
    start, step, end = records[0], of(records, "train_step")[-1], records[-1]
    assert start["max_steps"] == 4 and start["tokens_per_step"] == 128 and start["params"] > 0
    assert step["memory_bytes"] > 0 and step["tokens"] == 4 * 128 and "memory_gb" not in step
    assert end["status"] == "completed" and end["steps"] == 4 and end["final_loss"] > 0
    assert end["checkpoint"].endswith("step_0000000004") and end["elapsed_s"] > 0
    # people's text is on stderr: the summary with its sparklines, nothing as JSON
    assert "done: 4 steps" in done.stderr and "\nloss: " in done.stderr
    assert "eval loss: " in done.stderr and '{"event"' not in done.stderr
    # the JSONL file holds the same records (plus any warnings and notices)
    saved = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    structured = [r for r in saved if r["event"] not in ("warning", "notice")]
    assert [r["event"] for r in structured] == [r["event"] for r in records]


def test_json_mode_errors_stay_one_line_on_stderr(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"optimizer": {"lr": -1}}))
    result = runner.invoke(app, ["train", "-c", str(bad), "--log-format", "json"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("speedtronic: error: optimizer.lr")
    result = runner.invoke(app, ["train", "--log-format", "yaml"])
    assert result.exit_code == 2 and "--log-format" in result.stderr


def test_diloco_outer_step_events_in_json(tiny, tmp_path):
    """One process: a master that also trains, on a shared directory, every 2 steps."""
    shared = tmp_path / "shared"
    shared.mkdir()
    tiny["distributed"] = {
        "inner_steps": 2,
        "poll_interval": 0.05,
        "min_deltas": 1,
        "max_wait_s": 0.0,
        "sync_wait_s": 5.0,  # each boundary waits for its own round: a fixed order
        "drain_timeout_s": 0.0,  # a master alone: no wait at the end for a fleet to show up
    }
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    args = ["train", "-c", str(config), "--role", "master", "--node-id", "a"]
    result = runner.invoke(app, [*args, "--repo", str(shared), "--log-format", "json"])
    assert result.exit_code == 0, result.stderr
    records = parse_stream(result.stdout)
    boundaries, uploads = of(records, "diloco_boundary"), of(records, "diloco_upload")
    rounds, publishes = of(records, "diloco_round"), of(records, "diloco_publish")
    assert [b["step"] for b in boundaries] == [2, 4, 6]
    assert [b["outer_step"] for b in boundaries] == [1, 2, 3]
    assert boundaries[-1]["uploaded_bytes"] > 0 and boundaries[-1]["stall_s"] >= 0
    assert [u["seq"] for u in uploads] == [1, 2, 3] and uploads[0]["size_bytes"] > 0
    assert [r["outer_step"] for r in rounds] == [1, 2, 3] and rounds[0]["included"] == 1
    # the last round landed before the end: it goes out once more, saying the run has ended
    assert [p["outer_step"] for p in publishes] in ([0, 1, 2, 3], [0, 1, 2, 3, 3])
    assert json.loads((shared / "global" / "step_count.json").read_text())["ended"] is True
    assert all(p["elapsed_s"] >= 0 and p["size_bytes"] > 0 for p in publishes)
    assert "diloco: master a" in result.stderr  # notices: text on stderr


def test_coordinating_master_stream_starts_with_run_start(tiny, tmp_path, monkeypatch):
    """A master that only coordinates builds no trainer; it logs run_start itself."""
    from speedtronic.distributed import setup

    def fake_coordinate(config, model, logger, adapters=None):
        logger.log("diloco_publish", {"outer_step": 0, "bytes": 8, "seconds": 0.1})
        return {"outer_step": 0, "elapsed_s": 0.5, "signal": None}

    monkeypatch.setattr(setup, "coordinate_only", fake_coordinate)
    tiny["distributed"] = {"train_locally": False, "outer_steps": 3}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    args = ["train", "-c", str(config), "--role", "master", "--repo", str(tmp_path)]
    result = runner.invoke(app, [*args, "--log-format", "json"])
    assert result.exit_code == 0, result.stderr
    records = parse_stream(result.stdout)
    assert [r["event"] for r in records] == ["run_start", "diloco_publish", "run_end"]
    assert records[0]["role"] == "master" and records[0]["train_locally"] is False


# ---- the sparkline in text mode -----------------------------------------------------------


def test_text_summary_and_live_table_show_the_sparkline(monkeypatch):
    from rich.console import Console

    from speedtronic.cli.display import LiveTable, PlainLines

    steps = [
        {
            "step": s,
            "max_steps": 8,
            "loss": 5.0 - s / 2,
            "lr": 1e-3,
            "grad_norm": 1.0,
            "tokens_per_s": 100.0,
            "steps_per_s": 1.0,
            "data_wait_share": 0.0,
        }
        for s in range(1, 9)
    ]
    end = {"steps": 8, "final_loss": 1.0, "tokens": 64, "elapsed_s": 1.0}
    end |= {"tokens_per_s": 64.0, "status": "completed"}
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    plain = PlainLines()
    for payload in steps:
        plain.on_event("train_step", payload)
    plain.on_event("eval", {"step": 8, "eval_loss": 1.5, "eval_ppl": 4.5, "eval_tokens": 64})
    plain.on_event("run_end", end)
    summary = out.getvalue().splitlines()
    assert summary[0].startswith("done: 8 steps")
    assert summary[1].startswith("loss: █▇▆▅▄▃▂▁ 4.5000 -> 1.0000 (min 1.0000 at step 8)")
    assert summary[2].startswith("eval loss: ▄ 1.5000 -> 1.5000")
    table = LiveTable()
    for payload in steps:
        table.rows.append(payload)
        table.losses.record("train_step", payload)
    rendered = io.StringIO()
    Console(file=rendered, width=120).print(table._render())
    assert "loss: █▇▆▅▄▃▂▁ 4.5000 -> 1.0000" in rendered.getvalue()


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_summary_survives_a_stream_without_the_blocks(encoding):
    from speedtronic.cli.display import Losses, print_summary

    losses = Losses()
    losses.record("train_step", {"step": 1, "loss": 2.0})
    losses.record("train_step", {"step": 2, "loss": 1.0})
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding)
    end = {"steps": 2, "final_loss": 1.0, "tokens": 8, "elapsed_s": 1.0}
    print_summary({**end, "tokens_per_s": 8.0, "status": "completed"}, losses, stream)
    stream.flush()
    assert raw.getvalue().decode(encoding).splitlines()[1] == "loss: ?? 2.0000 -> 1.0000 " + (
        "(min 1.0000 at step 2)"
    )


def test_output_below_python_never_reaches_the_event_stream(tiny, tmp_path):
    """A hook (or a C extension, a child process) writing to descriptor 1 itself."""
    (tmp_path / "noisy_hook.py").write_text(
        "import os\n\ndef hook(event, payload):\n    os.write(1, b'not json\\n')\n"
    )
    tiny["logging"]["hooks"] = ["noisy_hook:hook"]
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    command = [sys.executable, "-m", "speedtronic", "train", "-c", str(config)]
    command += ["--max-steps", "2", "--log-format", "json"]
    done = proc_support.run(command, env=quiet_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [r["event"] for r in parse_stream(done.stdout)][-1] == "run_end"
    assert "not json" in done.stderr


def test_a_reader_closing_the_stream_stops_the_run_cleanly(tiny, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny))
    script = (
        f"{sys.executable} -m speedtronic train -c {config} --max-steps 100000 "
        f"--log-format json --output-dir {tmp_path / 'out'} | head -n 1"
    )
    done = proc_support.run(["bash", "-c", script], env=quiet_env())
    assert json.loads(done.stdout)["event"] == "run_start"
    assert "the event stream's reader closed it; stopping" in done.stderr
    assert list((tmp_path / "out").glob("*/step_*")), done.stderr  # stopped with a checkpoint


def test_the_summary_sparkline_ends_at_the_runs_last_loss():
    """Issue 53: a run that ended between log lines (a time budget at step 9, a line every 10
    steps) read ``5.5902 -> 5.5902`` while ``done:`` said 4.8563."""
    from speedtronic.cli.display import Losses

    losses = Losses()
    losses.record("train_step", {"step": 1, "loss": 5.5902})
    losses.record("run_end", {"steps": 9, "final_loss": 4.8563, "status": "completed"})
    assert losses.lines()[0].startswith("loss: █▁ 5.5902 -> 4.8563 (min 4.8563 at step 9)")
    losses.record("run_end", {"steps": 9, "final_loss": 4.8563})  # logged already: not twice
    assert losses.train.count == 2
