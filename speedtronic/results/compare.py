"""What ``speedtronic runs compare`` shows of several runs: the config keys that differ, and
their loss curves on one x axis (steps, tokens or training seconds). Stdlib only.

A run's curves come from its summary.json, else from its metrics JSONL (read bounded, as
``read_history`` does). Loss per token means nothing across tokenizers (a token is not the
same amount of text), so runs with different tokenizers are compared by the bits per byte of
their eval sets, and the document says so (``note``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from speedtronic.checkpoint.inspection import metrics_file_for
from speedtronic.checkpoint.tokenizer import same_tokenizer
from speedtronic.errors import ConfigError, DataError
from speedtronic.observe.history import finite, read_lines
from speedtronic.readlimit import read_json
from speedtronic.results.listing import FILE_LIMIT, RUN_MARKS, read_run

COMPARE_SCHEMA_VERSION = 1
X_AXES = {"steps": 0, "tokens": 1, "time": 2}  # index in a curve point
X_LABELS = {"steps": "steps", "tokens": "tokens", "time": "training seconds"}
MAX_POINTS = 256  # per series, as in summary.json's curve
DATA_SET = "val"  # summary.json's name for data.eval_every's held-out split
GRID = 50  # x values every series is interpolated at ("grid" of the JSON document)


def compare_runs(paths: list[Path], x: str = "tokens") -> dict[str, Any]:
    """The JSON-ready comparison of the runs in ``paths`` (at least two run directories).

    Its series hold every point each run logged (``thin_series`` for a shorter document);
    ``warnings`` name what is missing (a run with no curve, no bits per byte), and ``finals``
    the final global of each DumbDiLoCo fleet among the runs."""
    if len(paths) < 2:
        raise ConfigError("runs compare: name at least two runs (their output directories)")
    if len(paths) > len(MARKS):
        raise ConfigError(
            f"runs compare: at most {len(MARKS)} runs at once (got {len(paths)}); compare "
            "fewer, or rank them all with `speedtronic runs --sort loss`"
        )
    if x not in X_AXES:
        raise ConfigError(f"--x: must be one of {', '.join(X_AXES)} (got {x!r})")
    records = [_load(p) for p in paths]
    differ = _tokenizers_differ(records)
    metric = "bits_per_byte" if differ else "loss"
    series = [s for i, r in enumerate(records) for s in _series(i, r, x, metric)]
    note = None
    if differ:
        note = "the runs use different tokenizers: comparing bits per byte, not loss"
        if not series:  # bits per byte needs eval sets: the train loss, said to be unfit
            metric = "loss"
            series = [s for i, r in enumerate(records) for s in _series(i, r, x, metric)]
            note = (
                "the runs use different tokenizers and none scored bits per byte (that needs "
                "eval sets: eval.sets); showing train loss, which does not compare across "
                "tokenizers"
            )
    grid = _grid(series)
    return {
        "schema_version": COMPARE_SCHEMA_VERSION,
        "runs": [_run_fields(r) for r in records],
        "differing_keys": differing_keys([r["config"] for r in records]),
        "x": x,
        "metric": metric,
        "note": note,
        "warnings": _missing(records, series, metric),
        "series": series,
        "finals": final_globals(paths, records, x),
        "grid": grid,
        "aligned": [_interpolate(s["points"], grid) for s in series],
    }


_RUN_FIELDS = ("name", "path", "status", "source", "steps", "tokens", "final_loss", "problem")
_RUN_FIELDS += ("role", "node_id")


def _run_fields(record: dict[str, Any]) -> dict[str, Any]:
    """A run's entry: its row's figures, and the fleet (repo) a DumbDiLoCo node belongs to."""
    fields = {k: record["row"][k] for k in _RUN_FIELDS}
    return dict(fields, fleet=_fleet(record["config"]))


def _fleet(config: dict[str, Any]) -> str | None:
    section = config.get("distributed") if isinstance(config, dict) else None
    if not isinstance(section, dict) or section.get("enabled") is not True:
        return None
    repo = section.get("repo_id") or section.get("path")
    return repo if isinstance(repo, str) and repo else None


def _missing(records: list[dict[str, Any]], series: list[dict], metric: str) -> list[str]:
    """One line per run that draws nothing: what it lacks, and where it would come from."""
    drawn = {s["index"] for s in series}
    lines = []
    for i, record in enumerate(records):
        row = record["row"]
        if i in drawn:
            continue
        if metric == "bits_per_byte" and record["curve"].get("train"):
            lines.append(f"{row['path']}: no bits per byte (score eval sets with eval.sets)")
        elif row["role"] == "master" and not row["steps"]:
            lines.append(f"{row['path']}: no curve: a DumbDiLoCo master that trains nothing")
        else:
            why = row["problem"] or "it logged no losses (summary.json or logging.json_file)"
            lines.append(f"{row['path']}: no curve: {why}")
    return lines


def thin_series(doc: dict[str, Any], most: int = MAX_POINTS) -> dict[str, Any]:
    """``doc`` with each series thinned to ``most`` evenly spaced points (first and last
    kept): the JSON and text forms; ``aligned`` was computed from every point."""
    return dict(doc, series=[dict(s, points=_thin(s["points"], most)) for s in doc["series"]])


def _load(path: Path) -> dict[str, Any]:
    if not path.is_dir() or not any((path / m).exists() for m in RUN_MARKS):
        raise ConfigError(
            f"{path} is not a run directory (no summary.json, checkpoints/, diloco_master/ "
            "or .running)",
            hint="pass run output directories, as `speedtronic runs` lists them",
        )
    record = read_run(path, str(path))
    kept = record["curve"]  # summary.json's: 256 points at most
    log = record["metrics"] if kept is None else metrics_file_for(path, record["config"])
    logged = curve_from_metrics(log, record["row"]) if log is not None else None
    # the run's own log holds every point; without it, its summary's curve
    if logged is not None and (kept is None or len(logged["train"]) >= len(kept.get("train", []))):
        record["curve"] = logged
    elif kept is None:
        record["curve"] = {"train": [], "eval": []}
    return record


FINAL_DIR = "final_global"  # = distributed.final_global.FINAL_DIR (that module needs torch)


def final_globals(paths: list[Path], records: list[dict], x: str) -> list[dict[str, Any]]:
    """Each fleet's final global among the runs (a node's ``final_global/meta.json``; the
    newest outer step when several nodes hold one): its outer step, its ``x`` (the fleet's
    tokens or optimizer steps; None against time: it has no training seconds) and its loss
    (None: not measured during the run)."""
    found: dict[str, dict[str, Any]] = {}
    for path, record in zip(paths, records, strict=True):
        meta = _final_meta(path / FINAL_DIR / "meta.json")
        if type(meta.get("step")) is not int:
            continue
        diloco = meta.get("diloco") if isinstance(meta.get("diloco"), dict) else {}
        fleet = _fleet(record["config"]) or _fleet(meta.get("config")) or diloco.get("repo")
        fleet = fleet if isinstance(fleet, str) and fleet else str(path)
        at = {"tokens": meta.get("tokens"), "steps": meta.get("optimizer_steps")}.get(x)
        final = {
            "fleet": str(fleet),
            "run": record["row"]["name"],
            "path": str(path / FINAL_DIR),
            "outer_step": meta["step"],
            "x": finite(at),
            "loss": finite(meta.get("loss")),
        }
        if fleet not in found or final["outer_step"] > found[fleet]["outer_step"]:
            found[fleet] = final
    return list(found.values())


def _final_meta(path: Path) -> dict[str, Any]:
    """A final global's meta.json, bounded; {} when there is none or it does not read (a
    fleet's picture goes on without its marker)."""
    try:
        meta = read_json(path, FILE_LIMIT, error=DataError) if path.is_file() else None
    except ConfigError:
        return {}
    return meta if isinstance(meta, dict) else {}


def flatten(config: object, prefix: str = "") -> dict[str, Any]:
    """``{"optimizer.lr": 0.001, ...}``: nested dicts to dotted keys (lists stay values)."""
    if not isinstance(config, dict):
        return {prefix: config} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        flat.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {})
        if not isinstance(value, dict) or not value:
            flat[f"{prefix}{key}"] = value
    return flat


def differing_keys(configs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Each dotted key whose value is not the same in every config -> its value per config
    (None where a config lacks it), sorted by key."""
    flats = [flatten(c) for c in configs]
    keys = sorted(set().union(*flats))
    missing = object()
    found = {}
    for key in keys:
        values = [f.get(key, missing) for f in flats]
        texts = {json.dumps(v, sort_keys=True, default=str) for v in values if v is not missing}
        if len(texts) > 1 or missing in values:
            found[key] = [None if v is missing else v for v in values]
    return found


def _tokenizers_differ(records: list[dict[str, Any]]) -> bool:
    """Whether the runs' tokens differ: their tokenizers (by identity, as everywhere:
    ``same_tokenizer``; summary.json and meta.json record one tokenizer differently) or their
    vocab sizes."""
    known = [r["tokenizer"] for r in records if isinstance(r["tokenizer"], dict)]
    differ = any(not same_tokenizer(known[0], other) for other in known[1:])
    vocab = {flatten(r["config"]).get("model.vocab_size") for r in records}
    return differ or len(vocab - {None}) > 1


def _series(index: int, record: dict[str, Any], x: str, metric: str) -> list[dict[str, Any]]:
    """The run's train series (loss only) and one eval series per set, as ``[x, y]`` points."""
    at, name, curve = X_AXES[x], record["row"]["name"], record["curve"]
    found = []
    if metric == "loss":
        train = [[p[at], p[3]] for p in curve.get("train", []) if _point(p, 4, at, 3)]
        found.append({"run": name, "index": index, "kind": "train", "set": None, "points": train})
    sets: dict[str, list] = {}
    y = 4 if metric == "loss" else 5
    for p in curve.get("eval", []):
        if _point(p, 6, at, y) and isinstance(p[3], str):
            sets.setdefault(p[3], []).append([p[at], p[y]])
    found += [
        {"run": name, "index": index, "kind": "eval", "set": s, "points": pts}
        for s, pts in sets.items()
    ]
    return [s for s in found if s["points"]]


def _point(p: object, width: int, at: int, y: int) -> bool:
    ok = isinstance(p, list) and len(p) == width
    return ok and finite(p[at]) is not None and finite(p[y]) is not None


def _thin(points: list[list[float]], most: int) -> list[list[float]]:
    if len(points) <= most:
        return points
    last = len(points) - 1
    return [points[round(i * last / (most - 1))] for i in range(most)]


def _grid(series: list[dict[str, Any]]) -> list[float]:
    xs = [p[0] for s in series for p in s["points"]]
    if not xs:
        return []
    low, high = min(xs), max(xs)
    return [low + (high - low) * i / (GRID - 1) for i in range(GRID)]


def _interpolate(points: list[list[float]], grid: list[float]) -> list[float | None]:
    """``points``' y at each grid x (linear between neighbours; None outside its span)."""
    out: list[float | None] = []
    j = 0
    for gx in grid:
        while j + 1 < len(points) and points[j + 1][0] < gx:
            j += 1
        if not points or gx < points[0][0] or gx > points[-1][0]:
            out.append(None)
        elif j + 1 == len(points) or points[j][0] >= gx:
            out.append(points[j][1])
        else:
            (x0, y0), (x1, y1) = points[j], points[j + 1]
            out.append(y0 + (y1 - y0) * (gx - x0) / (x1 - x0))
    return out


def curve_from_metrics(path: Path | None, row: dict[str, Any]) -> dict[str, list]:
    """A summary-shaped curve from a metrics JSONL: train ``[step, tokens, seconds, loss]``,
    eval ``[step, tokens, seconds, set, loss, bpb]`` (data.eval_every's held-out split named
    ``val``, as in summary.json). Seconds add up each logged interval's steps over its
    steps_per_s, so start-up, evaluation and the time between a kill and a resume do not count.
    """
    train: list[list] = []
    evals: list[list] = []
    if path is None or not path.is_file():
        return {"train": train, "eval": evals}
    try:
        lines, _cut = read_lines(path)
    except OSError as exc:
        row["problem"] = f"cannot read {path}: {exc.strerror or exc}"
        return {"train": train, "eval": evals}
    seconds = 0.0
    for line in lines:
        record = _record(line)
        step = record.get("step") if record else None
        if type(step) is not int:
            continue
        event = record.get("event")
        if event == "train_step":
            if train and step <= train[-1][0]:  # a resume redoing steps: its history wins
                train = [p for p in train if p[0] < step]
                evals = [p for p in evals if p[0] < step]
            rate, done = finite(record.get("steps_per_s")), train[-1][0] if train else 0
            seconds += (step - done) / rate if rate and step > done else 0.0
            train.append([step, record.get("tokens"), seconds, finite(record.get("loss"))])
        elif event in ("eval", "eval_set"):
            tokens = train[-1][1] if train else None
            name, loss_key = (
                (DATA_SET, "eval_loss") if event == "eval" else (record.get("set"), "loss")
            )
            bpb = finite(record.get("bits_per_byte"))
            evals.append([step, tokens, seconds, name, finite(record.get(loss_key)), bpb])
    return {"train": train, "eval": evals}


def _record(line: str) -> dict[str, Any] | None:
    if '"train_step"' not in line and '"eval' not in line:
        return None  # cheap: most other records are never parsed
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def smooth(ys: list[float], weight: float) -> list[float]:
    """W&B's "exponential moving average" (TensorBoard's formula): each point the running
    average with ``weight`` on the past, debiased so the first points are not pulled towards
    zero; ``weight`` 0 leaves the points as they are."""
    out, last = [], 0.0
    for n, y in enumerate(ys, 1):
        last = last * weight + (1 - weight) * y
        out.append(last / (1 - weight**n))
    return out


# ---- the terminal picture --------------------------------------------------------------------

# run i draws with MARKS[i] ("*": several meet); as many runs as marks can be compared
MARKS = "123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def char_plot(series: list[dict[str, Any]], width: int = 60, height: int = 10) -> list[str]:
    """``series`` (each drawn with its run's mark) on one character canvas, y labelled at its
    top and bottom, x at its ends; [] when no series has a point."""
    ys = [p[1] for s in series for p in s["points"]]
    xs = [p[0] for s in series for p in s["points"]]
    if not ys:
        return []
    (x0, x1), (y0, y1) = (min(xs), max(xs)), (min(ys), max(ys))
    canvas = [[" "] * width for _ in range(height)]
    grid = [x0 + (x1 - x0) * (c + 0.5) / width for c in range(width)]
    for s in series:
        mark = MARKS[s["index"] % len(MARKS)]
        for c, y in enumerate(_interpolate(s["points"], grid)):
            if y is None:
                continue
            r = 0 if y1 == y0 else round((y1 - y) / (y1 - y0) * (height - 1))
            canvas[r][c] = mark if canvas[r][c] in (" ", mark) else "*"
    labels = [f"{y1:.4g}"] + [""] * (height - 2) + [f"{y0:.4g}"]
    pad = max(map(len, labels))
    rows = zip(labels, canvas, strict=True)
    lines = [f"{label:>{pad}} |{''.join(row)}".rstrip() for label, row in rows]
    left, right = short(x0), short(x1)
    lines.append(f"{'':>{pad}} +{'-' * width}")
    lines.append(f"{'':>{pad}}  {left}{right:>{width - len(left)}}")
    return lines


def short(value: float) -> str:
    """1234567 -> 1.23M: an axis label."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.4g}"
