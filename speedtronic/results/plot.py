"""``runs compare --plot FILE``: the comparison drawn as a PNG or SVG with matplotlib.

matplotlib is an optional extra (``speedtronic[plot]``): nothing else needs it, and it is
imported here only when a picture is asked for. Without it the command says which extra to
install in one line (exit 2) rather than failing on an import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speedtronic.errors import ConfigError, OutputError
from speedtronic.results.compare import X_LABELS

SUFFIXES = (".png", ".svg")


def write_plot(path: Path, doc: dict[str, Any]) -> None:
    """Draw ``compare_runs``' document into ``path``: train curves left, eval curves right."""
    if path.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"--plot: {path} must end in .png or .svg")
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib: pip install 'speedtronic[plot]'", hint=None
        ) from None
    matplotlib.use("Agg")  # no display: write a file, never open a window
    from matplotlib import pyplot

    kinds = [k for k in ("train", "eval") if any(s["kind"] == k for s in doc["series"])]
    figure, axes = pyplot.subplots(1, max(1, len(kinds)), figsize=(9, 3.6), squeeze=False)
    ylabel = "bits per byte" if doc["metric"] == "bits_per_byte" else "loss"
    for ax, kind in zip(axes[0], kinds, strict=False):
        for s in (s for s in doc["series"] if s["kind"] == kind):
            label = s["run"] if kind == "train" or not s["set"] else f"{s['run']} ({s['set']})"
            xs, ys = zip(*s["points"], strict=True)
            ax.plot(xs, ys, label=label, marker="o" if kind == "eval" else None, markersize=3)
        ax.set_title(f"{kind} {ylabel}")
        ax.set_xlabel(X_LABELS[doc["x"]])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if doc["note"]:
        figure.suptitle(doc["note"], fontsize=9)
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=90)
    except OSError as exc:
        raise OutputError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
    finally:
        pyplot.close(figure)
