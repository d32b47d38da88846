"""``speedtronic import``: a pretrained transformers model (a directory or a Hub model repo) as a
run directory at step 0. The work is ``speedtronic.modelout.importer``'s; it and torch load in
the command body, so ``--help`` imports only this module's option declarations.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.jsonout import json_text
from speedtronic.cli.model import verification_json
from speedtronic.cli.options import JSON_SCHEMA_VERSION, OutputFormat, format_option


def import_model(
    src: str = typer.Argument(
        ...,
        help="A transformers model directory (config.json + safetensors weights, sharded or "
        "not) or a Hub model, hf://OWNER/NAME[@REVISION]. Pickled weights are never read.",
    ),
    out: Path = typer.Argument(..., help="The run directory to write; new or empty."),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Load SRC with transformers and check the imported model's float32 logits "
        "(max |difference| <= 1e-5) and greedy tokens against it before writing OUT (needs "
        "transformers).",
    ),
    output_format: OutputFormat = format_option("a summary"),
) -> None:
    """Import a Llama-shaped transformers model as a run at step 0.

    OUT is read by generate, export, ckpt inspect and train --init-from OUT.
    """
    from speedtronic.modelout.importer import import_model as run_import

    check = None
    if verify:
        from speedtronic.modelout.verify import load_transformers, verify_import

        load_transformers()  # refuse at once when it is missing, before any work

        def check(run_dir: Path, source: Any) -> Any:
            return verify_import(run_dir, source.folder)

    done = run_import(src, out, verify=check, log=_note)
    for note in done.notes:
        _note(f"note: {note}")
    if output_format is OutputFormat.json:
        print(json_text(_as_json(done)))
        return
    p = done.params
    print(
        f"imported {done.origin} into {done.out}: {done.param_count:,} parameters "
        f"({p['n_layer']} layers, d_model {p['d_model']}, {p['n_head']}/{p['n_kv_head']} heads, "
        f"vocab {p['vocab_size']}, tied {'yes' if p['tie_embeddings'] else 'no'}); "
        f"checkpoint {done.checkpoint}"
    )
    if done.verified is not None:
        v = done.verified
        print(
            f"verified with transformers {v.transformers_version}: max |logit difference| "
            f"{v.max_diff:.3g} over {v.positions} positions, {len(v.greedy)} greedy tokens equal"
        )
    print(f"continue training it: speedtronic train --init-from {done.out} --config YOURS.yaml")


def _as_json(done: Any) -> dict:
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "source": done.origin,
        "out": str(done.out),
        "checkpoint": str(done.checkpoint),
        "model": {"name": "reference_transformer", **done.params},
        "param_count": done.param_count,
        "tokenizer_files": done.tokenizer_files,
        "verified": verification_json(done.verified),
    }


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def register(app: typer.Typer) -> None:
    short = "Import a Llama-shaped transformers model (directory or hf://) as a run at step 0."
    app.command("import", short_help=short)(handle_errors(import_model))
