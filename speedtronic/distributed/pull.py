"""``speedtronic storage pull``: the run's newest global, fetched into a node's output directory.

A worker that ends before the master's final publish leaves the global holding its last delta
in ``<output_dir>/final_global``, and says so; once the master has ended, this fetches the run's
final global into the same place. The node's own output directory says everything needed: the
model (its ``final_global`` or newest checkpoint's config builds it, so the downloaded weights
are checked against its keys and shapes, I4), the repo (``distributed.repo_id``, unless given),
and the tokenizer record. The global is written as the node's end writes it
(``FinalGlobalWriter``: crash-safe, the fleet's optimizer steps and tokens in its meta.json).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from speedtronic.checkpoint.layout import META_FILE
from speedtronic.checkpoint.load import find_latest
from speedtronic.checkpoint.tokenizer import tokenizer_from_record
from speedtronic.distributed.codec import BadDelta, expected_delta_bytes
from speedtronic.distributed.final_global import FINAL_DIR, FinalGlobalWriter
from speedtronic.distributed.global_update import GlobalReader
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, fleet_totals, run_ended
from speedtronic.distributed.repos import open_transport
from speedtronic.distributed.worker.plugin import parameters_of, snapshot
from speedtronic.errors import ConfigError, TransportError


def pull_final_global(run_dir: str | Path, repo: str | None = None) -> dict[str, Any]:
    """Fetch the newest global of ``repo`` (default: the run's) into ``run_dir/final_global``;
    returns what it holds: path, outer_step, optimizer_steps, tokens, ended (the run has)."""
    from speedtronic.config import SpeedtronicConfig
    from speedtronic.registry import build_model

    run_dir = Path(run_dir)
    source, meta = _run_meta(run_dir)
    config = SpeedtronicConfig.from_dict(_without_token(meta["config"]))
    repo = repo or config.distributed.repo
    if not repo:
        raise ConfigError(f"{source}: the run names no repo (distributed.repo_id): pass --repo")
    settings = replace(config.distributed, node_id=config.distributed.resolved_node_id)
    model = build_model(config.model.name, config.model.params, config.model.imports)
    transport = open_transport(repo, settings)
    outer_step, weights, counted = _newest_global(transport, parameters_of(model))
    nodes = counted.get("nodes") or {}
    tokenizer = tokenizer_from_record(meta, source, str(source))
    about = {"node_id": settings.node_id, "role": "pulled", "repo": transport.describe()}
    writer = FinalGlobalWriter(model, run_dir, config.to_dict(redact=True), about, tokenizer)
    path = writer(weights, outer_step, {"pulled": True}, nodes)
    totals = fleet_totals(nodes)  # ended: the master said so, or (an older one's) every node
    totals["ended"] = run_ended(counted) or totals["ended"]
    return {"path": str(path), "outer_step": outer_step, **totals}


def _run_meta(run_dir: Path) -> tuple[Path, dict]:
    """The run's final global, else its newest checkpoint: (its directory, its meta.json)."""
    candidates = [run_dir / FINAL_DIR]
    newest = find_latest(run_dir / "checkpoints") if (run_dir / "checkpoints").is_dir() else None
    candidates += [newest] if newest is not None else []
    for folder in candidates:
        try:
            meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("config"), dict):
            return folder, meta
    raise ConfigError(
        f"{run_dir}: no final_global/ or checkpoint with a config here; give the output "
        "directory of a node of the run"
    )


def _without_token(config: dict) -> dict:
    """The stored config is redacted: the token comes from the environment, as for the run."""
    distributed = {k: v for k, v in (config.get("distributed") or {}).items() if k != "token"}
    return {**config, "distributed": distributed}


def _newest_global(transport: Any, params: dict) -> tuple[int, dict, dict]:
    """(outer step, weights checked against the model, step count) of the repo."""
    counted = transport.read_step_count()
    reader = GlobalReader(transport, snapshot(params, "cpu"))
    try:
        read = reader.read(expected_delta_bytes(params, "fp32") + (1 << 20))
        if counted is None or read is None:
            raise TransportError(f"{transport.describe()} holds no global yet")
        outer_step, weights = read.outer_step, read.weights
    except BadDelta as exc:
        where = f"{transport.describe()}: {GLOBAL_WEIGHTS}"
        raise TransportError(f"{where} is unusable: {exc}") from exc
    if outer_step != counted["outer_step"]:
        raise TransportError(
            f"{transport.describe()}: a publish is in flight (weights of outer step {outer_step}, "
            f"step count {counted['outer_step']}); run the command again"
        )
    return outer_step, weights, counted
