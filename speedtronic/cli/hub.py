"""``speedtronic hub init | grant | status``: set up, share and watch a Hub run repo.

The logic lives in ``speedtronic.distributed.hub.admin`` (over ``HubClient``); this module
parses options, builds the client (token from ``HF_TOKEN`` or the standard login, endpoint
from ``HF_ENDPOINT``) and renders results as text, Rich tables or JSON. The Hub modules are
imported inside the commands so ``speedtronic --help`` loads neither huggingface_hub nor torch.
Hub failures become one line naming the repo and the HTTP status; never the token. Rich, too,
is imported by the code that draws: ``--help`` and shell completion load this module.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.jsonout import json_text
from speedtronic.cli.options import (
    JSON_SCHEMA_VERSION,
    OutputFormat,
    count_text,
    format_option,
    size_text,
)
from speedtronic.errors import ConfigError, TransportError

if TYPE_CHECKING:
    from rich.console import Console

hub_app = typer.Typer(
    help="Set up, share and watch a Hugging Face Hub repo for DumbDiLoCo (docs/hub.md).",
    short_help="Set up, share and watch a Hub repo for DumbDiLoCo.",
    no_args_is_help=True,
)
RepoArg = typer.Argument(..., help="The run's Hub repo id, owner/name (e.g. my-org/my-run).")
_sleep = time.sleep  # tests replace it to end a --watch


def _client(repo: str) -> Any:
    from speedtronic.distributed.hub.admin import check_repo_id
    from speedtronic.hub.client import HubClient

    # HF_ENDPOINT passed explicitly: huggingface_hub reads it only once, at import
    return HubClient(check_repo_id(repo), endpoint=os.environ.get("HF_ENDPOINT") or None)


@contextlib.contextmanager
def _explained(repo: str, need: str) -> Iterator[None]:
    """Hub failures as one line (no hint line): the repo, the status, what to do.

    ``need`` is what the command needs the token to do: ``read``, or ``write`` (init, which
    creates the repo, so a missing repo is no advice to run init).
    """
    try:
        yield
    except TransportError as exc:
        status = getattr(exc, "status", None)
        missing = status == 404 or type(exc).__name__ == "RepoNotFound"
        if missing and need == "read":
            message = f"{repo} not found: create it with speedtronic hub init {repo}"
        elif status in (401, 403):
            message = (
                f"{repo}: the Hub refused the token ({status}): use a token that can {need} it "
                "(HF_TOKEN or `hf auth login`; tokens at https://huggingface.co/settings/tokens)"
            )
        else:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TransportError(message) from None


def init(
    repo: str = RepoArg,
    public: bool = typer.Option(
        False, "--public", help="Create the repo public (default private)."
    ),
    allow_public: bool = typer.Option(
        False, "--allow-public", help="Accept an existing public repo instead of refusing it."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Show what would be done; only read-only calls."
    ),
    output_format: OutputFormat = format_option("actions, then the commands to run"),
) -> None:
    """Create the run repo (private) and its README; print the worker command and config.

    Idempotent: a second run makes no commit. An existing public repo is refused.

    Exit codes: 0 done, 1 Hub error or public repo refused, 2 bad usage.
    """
    from speedtronic.distributed.hub.admin import init_repo

    client = _client(repo)
    with _explained(repo, "write"):
        result = init_repo(client, public=public, allow_public=allow_public, dry_run=dry_run)
    report = result.to_dict()
    if output_format is OutputFormat.json:
        print(json_text(_versioned(report)))
        return
    for line in result.actions + [f"note: {n}" for n in result.notes]:
        print(line)
    print("\nStart each worker with (a distinct --node-id per machine):")
    print(f"  {report['worker_command']}")
    print(f"and the master with:\n  {report['master_command']}")
    print("\nworker.yaml needs (the rest of the file is your model, data, optimizer):\n")
    print(report["config_snippet"], end="")
    print(f"\nThen: speedtronic hub grant {repo} USER... and speedtronic hub status {repo}")


def grant(
    repo: str = RepoArg,
    users: list[str] = typer.Argument(..., help="Hugging Face user names to give write access."),
    output_format: OutputFormat = format_option("one line per user, then instructions"),
) -> None:
    """Check who can write to the repo; print the exact manual steps for the others.

    The Hub has no API to add a writer: this reads org roles and checks users, nothing else.

    Exit codes: 0 all can write, 3 a manual step remains (printed), 1 error, 2 bad usage.
    """
    from speedtronic.distributed.hub.admin import grant as grant_access

    client = _client(repo)
    with _explained(repo, "read"):
        result = grant_access(client, users)
    if output_format is OutputFormat.json:
        print(json_text(_versioned(result.to_dict())))
    else:
        for access in result.users:
            print(f"{access.user}: {access.status.replace('_', ' ')}: {access.detail}")
        for line in result.instructions:
            print(line)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def status(
    repo: str = RepoArg,
    output_format: OutputFormat = format_option("a table"),
    watch: float | None = typer.Option(
        None,
        "--watch",
        min=5.0,
        help="Refresh every SECONDS (>= 5) until Ctrl-C; with --format json, one JSON object "
        "per line. Each refresh costs 1 API call when nothing changed, about 6 otherwise.",
    ),
) -> None:
    """The run at a glance: global outer step and its age, per-node deltas, size, budgets.

    Exit codes: 0 shown (Ctrl-C ends --watch with 0), 1 Hub error, 2 bad usage.
    """
    from speedtronic.distributed.hub.admin import RepoWatcher
    from speedtronic.distributed.repos import is_local_repo

    if is_local_repo(repo):
        raise ConfigError(
            f"REPO: {repo} is a shared directory, not a Hub repo",
            hint=f"speedtronic storage status {repo} shows a directory run",
        )
    watcher = RepoWatcher(_client(repo))
    as_json = output_format is OutputFormat.json
    with _explained(repo, "read"):
        if watch is None:
            report = watcher.status()
            if as_json:
                print(json_text(_versioned(report)))
            else:
                _console().print(_view(report))
            return
        try:
            _watch(watcher, watch, as_json)
        except KeyboardInterrupt:  # Ctrl-C is how a watch ends
            return


def _watch(watcher: Any, every: float, as_json: bool) -> None:
    if as_json:
        while True:
            print(json_text(_versioned(_attempt(watcher)), indent=None), flush=True)
            _sleep(every)
    console = _console()
    if not sys.stdout.isatty():  # a pipe gets one table per refresh
        while True:
            console.print(_view(_attempt(watcher)))
            _sleep(every)
    from rich.live import Live

    with Live(_view(_attempt(watcher)), console=console, auto_refresh=False) as live:
        while True:
            _sleep(every)
            live.update(_view(_attempt(watcher)), refresh=True)


def _attempt(watcher: Any) -> dict[str, Any]:
    """A snapshot; a transient failure (retries exhausted) is shown, not fatal, in a watch."""
    try:
        return watcher.status()
    except TransportError as exc:
        if getattr(exc, "permanent", False) or getattr(exc, "status", None) in (401, 403, 404):
            raise
        return {"repo_id": watcher.client.repo_id, "error": str(exc).splitlines()[0]}


def _versioned(report: dict[str, Any]) -> dict[str, Any]:
    """A --format json document: ``schema_version`` first, then the report."""
    return {"schema_version": JSON_SCHEMA_VERSION, **report}


def _console() -> Console:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160)  # pipes: don't squeeze to 80


def _view(report: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table

    if "error" in report:
        return f"[red]{report['repo_id']}: {report['error']}[/] (retrying)"
    step = "-" if report["outer_step"] is None else str(report["outer_step"])
    published = (
        "nothing published yet"
        if report["age_s"] is None
        else (f"published {_ago(report['age_s'])} ago ({report['updated_at']})")
    )
    lines = [
        f"[bold]{report['repo_id']}[/]  outer step {step}"
        + (" (the run has ended: its final global)" if report.get("ended") else "")
        + f", {published}",
        f"size {size_text(report['size_bytes'])}; commits in the last hour "
        f"{report['commits_1h']}/{report['commits_limit_1h']}; API calls by this command "
        f"{report['api_calls_5min']} in 5 min (account limit {report['api_calls_limit_5min']})",
        _round_bytes(report),
    ]
    table = Table(title_justify="left")
    columns = ("node", "pending", "delta size", "newest pending", "last delta", "base step")
    columns = (*columns, "staleness")
    for column in (*columns, "tokens"):
        table.add_column(column, justify="left" if column == "node" else "right")
    for n in report["nodes"]:
        table.add_row(
            n["node_id"],
            str(n["pending_deltas"]),
            "-" if n["delta_bytes"] is None else size_text(n["delta_bytes"]),
            _ago(n["newest_pending_age_s"]),
            _ago(n["last_delta_age_s"]),
            count_text(n["base_outer_step"]),
            count_text(n["staleness_steps"]),
            count_text(n["tokens"]),
        )
    notes = [f"[yellow]{p}[/]" for p in report["problems"]]
    body = table if report["nodes"] else "no node has uploaded a delta yet"
    return Group(*lines, body, *notes)


def _round_bytes(report: dict[str, Any]) -> str:
    """A round's bytes: the global each node downloads, the keyframe of an update once."""
    if report["global_bytes"] is None:
        return "per round: no global yet; each node uploads its delta (delta size)"
    once = report["keyframe_bytes"]
    kind = "full weights" if once is None else f"an update; its keyframe {size_text(once)} once"
    return (
        f"per round: each node downloads the global, {size_text(report['global_bytes'])} "
        f"({kind}), and uploads its delta (delta size)"
    )


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours >= 48:
        return f"{hours // 24}d"
    return (
        f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
    )


def register(app: typer.Typer) -> None:
    # short_help: the line in `speedtronic hub --help`, where the docstring's would be cut short
    shorts = {
        init: "Create the run repo (private); print the worker command.",
        grant: "Check who can write to the repo; say how to add the others.",
        status: "The run at a glance: outer step, per-node deltas, budgets.",
    }
    for command, short in shorts.items():
        hub_app.command(short_help=short)(handle_errors(command))
    app.add_typer(hub_app, name="hub")
