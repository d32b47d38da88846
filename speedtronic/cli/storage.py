"""``speedtronic storage init``: set up a bucket for a DumbDiLoCo run, as ``hub init`` does a repo;
``storage status``: the run in a bucket or a shared directory at a glance, bytes per round
included; ``storage pull``: a run's newest global into a node's output directory (any repo kind).

The bucket side lives in ``speedtronic.distributed.s3.admin`` and is imported inside the
command, so ``speedtronic --help`` never loads boto3 (an optional extra: ``[s3]``). Store
failures become one line naming the bucket and the store's answer; never a credential.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.jsonout import json_text
from speedtronic.cli.options import JSON_SCHEMA_VERSION, OutputFormat, format_option
from speedtronic.errors import ConfigError

storage_app = typer.Typer(
    name="storage",
    help="Set up a bucket for DumbDiLoCo: Hugging Face Storage Buckets, AWS S3, R2 or MinIO, "
    "over the S3 API (docs/storage.md).",
    short_help="Set up a bucket (S3 API) for DumbDiLoCo.",
    no_args_is_help=True,
)

RepoArg = typer.Argument(..., help="The run's bucket and prefix: s3://bucket/prefix.")
EndpointOpt = typer.Option(
    None,
    "--endpoint-url",
    help="The store's URL: MinIO or R2, or https://s3.hf.co/NAMESPACE for a Hugging Face "
    "bucket; default $AWS_ENDPOINT_URL, else AWS S3.",
)


def _client(repo: str, endpoint_url: str | None) -> Any:
    from speedtronic.config.storage import endpoint_url_problem, parse_s3_url

    try:
        bucket, prefix = parse_s3_url(repo)
    except ValueError as exc:
        raise ConfigError(f"{repo[:80]!r}: {exc}") from None
    if endpoint_url is not None and (problem := endpoint_url_problem(endpoint_url)):
        raise ConfigError(f"--endpoint-url: {problem}")
    try:
        from speedtronic.distributed.s3.client import S3Client
    except ImportError as exc:
        message = f"the S3 client is not installed ({exc.name} is missing)"
        raise ConfigError(message, hint="pip install 'speedtronic[s3]'") from None
    return S3Client(bucket, prefix, endpoint_url=endpoint_url)


def init(
    repo: str = RepoArg,
    endpoint_url: str | None = EndpointOpt,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Only look: create nothing, write nothing (one HeadBucket)."
    ),
    output_format: OutputFormat = format_option("a report and the config snippet"),
) -> None:
    """Create the bucket if it is missing; check that these credentials can write under the
    prefix and that the store honours conditional writes; print the config snippet.

    Idempotent: run it again and it creates nothing. Credentials come from the environment
    (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE), never from the command line.

    Exit codes: 0 ready, 1 the store refused or failed, 2 bad usage.
    """
    from speedtronic.distributed.s3.admin import config_snippet, init_store

    client = _client(repo, endpoint_url)
    report = init_store(client, dry_run=dry_run)
    snippet = config_snippet(client.url(), endpoint_url)
    if output_format is OutputFormat.json:
        doc = {"schema_version": JSON_SCHEMA_VERSION, **vars(report), "config": snippet}
        print(json_text(doc))
        return
    state = "exists" if report.existed else "created" if report.created else "missing"
    print(f"{report.url} at {report.endpoint}: bucket {state}")
    if report.conditional is not None:
        yes = "yes" if report.conditional else "no (see docs/storage.md)"
        print(f"  writable: {'yes' if report.writable else 'no'}; conditional writes: {yes}")
    for note in report.notes:
        print(f"  {note}")
    print(f"\nThe config (every node runs the same file):\n\n{snippet}\n")
    print("Then, on each machine, with the store's keys in its environment:")
    print("  speedtronic train -c run.yaml --role master --node-id node-a")
    print("  speedtronic train -c run.yaml --role worker --node-id node-b")


def pull(
    run_dir: Path = typer.Argument(
        ..., help="A node's output directory (its final_global/ or checkpoints/ name the model)."
    ),
    repo: str | None = typer.Option(
        None,
        "--repo",
        help="The run's shared repo (directory, s3://bucket/prefix or Hub repo id); default: "
        "the run's distributed.repo_id.",
    ),
    output_format: OutputFormat = format_option("what the fetched global holds"),
) -> None:
    """Fetch the run's newest global into RUN_DIR/final_global: what a worker that ended before
    the master's final publish runs once the master has ended.

    The weights are checked against the run's model (keys, shapes, finiteness) and written as
    the node's end writes them, with the fleet's optimizer steps and tokens in meta.json.

    Exit codes: 0 written, 1 the repo failed or holds no global, 2 bad usage.
    """
    from speedtronic.distributed.pull import pull_final_global

    got = pull_final_global(run_dir, repo)
    if output_format is OutputFormat.json:
        print(json_text({"schema_version": JSON_SCHEMA_VERSION, **got}))
        return
    ended = "the run's final global" if got["ended"] else "the newest global (the run goes on)"
    steps = got["optimizer_steps"]
    fleet = f"; {steps:,} optimizer steps, {got['tokens']:,} tokens" if steps is not None else ""
    print(f"{ended}: outer step {got['outer_step']}{fleet}; written to {got['path']}")


def status(
    repo: str = typer.Argument(
        ...,
        help="The run's bucket and prefix (s3://bucket/prefix) or its shared directory "
        "(a path or file:// URL).",
    ),
    endpoint_url: str | None = EndpointOpt,
    output_format: OutputFormat = format_option("a table"),
) -> None:
    """The run at a glance: the global outer step and its age, a round's bytes (the global each
    node downloads, the keyframe of an update once, each node's newest delta), per-node deltas.

    Exit codes: 0 shown, 1 the store failed, 2 bad usage.
    """
    from speedtronic.config.storage import is_s3_url

    if not is_s3_url(repo):  # a bucket, else a shared directory (a Hub repo: hub status)
        report = _directory_status(repo, endpoint_url)
    else:
        from speedtronic.distributed.s3.status import bucket_status

        report = bucket_status(_client(repo, endpoint_url))
    if output_format is OutputFormat.json:
        print(json_text({"schema_version": JSON_SCHEMA_VERSION, **report}))
        return
    _print_status(report)


def _directory_status(repo: str, endpoint_url: str | None) -> dict[str, Any]:
    from speedtronic.distributed.repo_status import directory_status
    from speedtronic.distributed.transport import LocalTransport

    if endpoint_url is not None:
        raise ConfigError(f"--endpoint-url: a bucket's option; {repo} is a shared directory")
    path = Path(repo.removeprefix("file://")).expanduser()
    if not path.exists():
        raise ConfigError(
            f"REPO: {repo}: no such directory (a run's shared directory, or "
            "s3://bucket/prefix for a bucket; a Hub repo: speedtronic hub status)"
        )
    if not path.is_dir():
        raise ConfigError(f"REPO: {repo} is not a directory (a run's shared directory or s3://)")
    return directory_status(LocalTransport(path))


def _print_status(report: dict[str, Any]) -> None:
    from speedtronic.data.describe import size_text

    step = "-" if report["outer_step"] is None else report["outer_step"]
    ended = " (the run has ended: its final global)" if report.get("ended") else ""
    print(f"{report['repo']}  outer step {step}{ended}, updated {report['updated_at'] or '-'}")
    if report["global_bytes"] is not None:
        once = report["keyframe_bytes"]
        kind = "full weights" if once is None else f"an update; its keyframe {size_text(once)} once"
        print(f"per round: each node downloads {size_text(report['global_bytes'])} ({kind})")
    if report.get("base_sha256"):  # only the adapters travel; every node holds this base
        print(f"frozen base: sha256 {report['base_sha256']} (every node must start from it)")
    for n in report["nodes"]:
        delta = "-" if n["delta_bytes"] is None else size_text(n["delta_bytes"])
        base = "-" if n["base_outer_step"] is None else n["base_outer_step"]
        print(
            f"  {n['node_id']}: delta {delta}, {n['pending_deltas']} pending "
            f"({size_text(n['pending_bytes'])}), base outer step {base}"
        )
    for problem in report["problems"]:
        print(f"  {problem}")


def register(app: typer.Typer) -> None:
    # short_help: the line in `speedtronic storage --help`, where the docstring's is cut at 80
    short = "Create the bucket if missing; check these credentials can write."
    storage_app.command(short_help=short)(handle_errors(init))
    short = "A run in a bucket or directory at a glance: step, a round's bytes, nodes."
    storage_app.command(short_help=short)(handle_errors(status))
    short = "Fetch the run's newest global into a node's output dir (final_global/)."
    storage_app.command(short_help=short)(handle_errors(pull))
    app.add_typer(storage_app, name="storage")
