"""``runs compare --plot FILE``: the comparison drawn as a PNG or SVG with matplotlib, read as
a W&B chart reads.

Every logged point, against a log-scaled x by default (a short run and a long one, or a
fleet's node and one machine, both readable; ``--linear-x`` for a linear one), an optional log
y, and W&B's smoothing (``compare.smooth``; the logged points stay, faint). A DumbDiLoCo
fleet's nodes are dashed and named by role and node id; its final global is a star at its
loss, or a dotted line at the fleet's tokens when no loss of it was measured.

matplotlib is an optional extra (``speedtronic[plot]``): nothing else needs it, and it is
imported here only when a picture is asked for. Without it the command says which extra to
install in one line (exit 2) rather than failing on an import.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtronic.errors import ConfigError, DataError, OutputError
from speedtronic.results.compare import X_LABELS, short, smooth

SUFFIXES = (".png", ".svg")


@dataclass
class PlotOptions:
    """How the picture is drawn: ``smooth`` in [0, 1), W&B's smoothing weight."""

    smooth: float = 0.0
    log_x: bool = True
    log_y: bool = False

    def check(self) -> None:
        if not 0.0 <= self.smooth < 1.0:
            raise ConfigError(
                f"--smooth: must be at least 0 and below 1, as W&B's smoothing (got {self.smooth})"
            )


def write_plot(path: Path, doc: dict[str, Any], options: PlotOptions | None = None) -> None:
    """Draw ``compare_runs``' document into ``path``: train curves left, eval curves right."""
    if path.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"--plot: {path} must end in .png or .svg")
    if not doc["series"] and not any(f["x"] for f in doc["finals"]):
        raise DataError(f"--plot: nothing to draw into {path}: no run has a curve (see above)")
    figure = draw(doc, options or PlotOptions())
    from matplotlib import pyplot

    try:
        figure.savefig(path, dpi=90)
    except OSError as exc:
        raise OutputError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
    finally:
        pyplot.close(figure)


def draw(doc: dict[str, Any], options: PlotOptions) -> Any:
    """The matplotlib figure of ``doc`` (the caller closes it)."""
    options.check()
    try:
        import matplotlib
        import matplotlib.ticker  # noqa: F401 (FuncFormatter, for a log y)
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib: pip install 'speedtronic[plot]'", hint=None
        ) from None
    matplotlib.use("Agg")  # no display: write a file, never open a window
    from matplotlib import pyplot

    kinds = [k for k in ("train", "eval") if any(s["kind"] == k for s in doc["series"])]
    many = len(doc["runs"]) > 12  # legends beside the panels: a wider picture
    size = (10 + 5 * max(1, len(kinds)) * many, 4.2 + 1.8 * many)
    figure, axes = pyplot.subplots(1, max(1, len(kinds)), figsize=size, squeeze=False)
    ylabel = "bits per byte" if doc["metric"] == "bits_per_byte" else "loss"
    colors = _colors(matplotlib, len(doc["runs"]))
    for n, (ax, kind) in enumerate(zip(axes[0], kinds, strict=False)):
        for s in (s for s in doc["series"] if s["kind"] == kind):
            _curve(ax, s, doc["runs"][s["index"]], colors[s["index"]], options)
        if n == 0:
            _finals(ax, doc)
        title = f"{kind} {ylabel}" + (f", smoothed {options.smooth:g}" if options.smooth else "")
        ax.set_title(title)
        ax.set_xlabel(X_LABELS[doc["x"]] + (" (log scale)" if options.log_x else ""))
        ax.set_xscale("log" if options.log_x else "linear")
        if options.log_y:  # losses span less than a decade: plain numbers, not 3x10^0
            ax.set_yscale("log")
            plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        ax.grid(alpha=0.3, which="both")
        _legend(ax)
    if doc["note"]:
        figure.suptitle(doc["note"], fontsize=8)
    figure.tight_layout()
    return figure


def _legend(ax: Any) -> None:
    """In the panel for a few curves; beside it, in columns, for many (36 runs)."""
    shown = [h for h in ax.get_lines() if not h.get_label().startswith("_")]
    if len(shown) <= 12:
        ax.legend(fontsize=7)
    else:
        ax.legend(fontsize=6, ncol=1 + len(shown) // 25, loc="upper left", bbox_to_anchor=(1, 1))


def _colors(matplotlib: Any, count: int) -> list[Any]:
    """One colour per run: tab10's, tab20's, then evenly around a wide map (36 runs and up)."""
    name = "tab10" if count <= 10 else "tab20" if count <= 20 else "turbo"
    cmap = matplotlib.colormaps[name]
    if name != "turbo":
        return [cmap(i) for i in range(count)]
    return [cmap(0.05 + 0.9 * i / max(1, count - 1)) for i in range(count)]


def _curve(ax: Any, s: dict[str, Any], run: dict[str, Any], color: Any, options: PlotOptions):
    """One series: every point (x > 0 on a log x), smoothed over its faint raw line."""
    points = [p for p in s["points"] if p[0] > 0 or not options.log_x]
    if not points:
        return
    xs, ys = (list(v) for v in zip(*points, strict=True))
    label = _label(run) + (f" ({s['set']})" if s["kind"] == "eval" and s["set"] else "")
    style = "--" if run.get("fleet") else "-"
    marker = "o" if s["kind"] == "eval" else None
    if options.smooth:
        ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8, label=f"_raw {label}")
        ys = smooth(ys, options.smooth)
    ax.plot(xs, ys, color=color, linestyle=style, marker=marker, markersize=3, label=label)


def _label(run: dict[str, Any]) -> str:
    """A run's name; a fleet node's with its role and node id: ``w1 (worker w1)``."""
    if not run.get("fleet"):
        return run["name"]
    what = " ".join(str(v) for v in (run.get("role") or "node", run.get("node_id")) if v)
    return f"{run['name']} ({what})"


def _finals(ax: Any, doc: dict[str, Any]) -> None:
    """Each fleet's final global: a star at its loss, else a dotted line at its x."""
    for final in doc["finals"]:
        if final["x"] is None or final["x"] <= 0:
            continue  # against training seconds it has no place
        label = f"final global, outer step {final['outer_step']} ({final['fleet']})"
        if final["loss"] is not None:
            ax.plot([final["x"]], [final["loss"]], "k*", markersize=12, label=label)
        else:
            where = f"{short(final['x'])} fleet {X_LABELS[doc['x']]}"
            label += f": {where}, loss not measured"
            ax.axvline(final["x"], color="black", linestyle=":", linewidth=1.2, label=label)
