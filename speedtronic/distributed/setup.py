"""From a ``distributed`` config section to running DumbDiLoCo parts.

``coordinator_plugins`` returns the Trainer plug-ins for a node (the master's loop first, so
its initial global exists before the local worker looks for one; then the worker), and
``coordinate_only`` runs a master that does not train (``train_locally: false``) until the
run ends (``master/plugin.serve``) or a signal. Every node gets a ``FinalGlobalWriter`` for its
output directory and a spill directory there for its in-flight deltas. Nothing here is read
from the shared repo: the run's configuration comes only from the local config (the repo is
data, never config).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from speedtronic.data.loader import run_tokenizer
from speedtronic.distributed.final_global import FinalGlobalWriter
from speedtronic.distributed.frozen_base import base_sha256
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.master.plugin import MasterPlugin, serve
from speedtronic.distributed.repos import no_directory_note, open_transport
from speedtronic.distributed.stopping import Signals
from speedtronic.distributed.transport import Transport
from speedtronic.distributed.worker.inflight import SPILL_DIR
from speedtronic.distributed.worker.plugin import WorkerPlugin, parameters_of, snapshot


def state_dir(config: Any) -> Path:
    """Where the master keeps its state: ``distributed.state_dir`` or the run's output dir."""
    chosen = config.distributed.state_dir
    return Path(chosen).expanduser() if chosen else config.output_dir / "diloco_master"


def node_settings(config: Any) -> Any:
    """The distributed section with node_id resolved (from the environment if unset)."""
    settings = config.distributed
    if settings.node_id is None:
        settings = replace(settings, node_id=settings.resolved_node_id)
    return settings


def node_transport(settings: Any, logger: Any) -> Transport:
    """The node's one transport (its threads share it, and so the Hub budget), prepared."""
    transport = open_transport(settings.repo, settings)
    transport.prepare(settings, logger)
    for message in transport.cadence_warnings(settings, None):
        logger.warn(f"diloco: {message}")
    return transport


def node_base(model: nn.Module, adapters: Any = None) -> str | None:
    """The frozen base's sha256 (``frozen_base``): a LoRA run's ``adapters`` named it when they
    loaded it, so a large base is hashed once; None when every parameter trains."""
    return adapters.record["base"]["sha256"] if adapters is not None else base_sha256(model)


def master_loop(
    config: Any, model: nn.Module, logger: Any, transport: Transport, base: str | None
) -> MasterLoop:
    """The master's loop on ``model``'s trainable parameters; ``base``: its frozen base
    (``node_base``), recorded with every publish for every node to check."""
    weights = snapshot(parameters_of(model))
    settings = node_settings(config)
    loop = MasterLoop(settings, weights, transport, logger, state_dir(config))
    loop.guard.base_sha256 = base
    return loop


def final_writer(
    config: Any, model: nn.Module, transport: Transport, tokenizer: Any = None, adapters: Any = None
) -> FinalGlobalWriter:
    """Where this node leaves the run's final global: ``<output_dir>/final_global``, recording
    ``tokenizer`` (the run's) as its checkpoints do, and holding only ``adapters`` (a LoRA
    run's ``train.lora.Adapters``) as they do."""
    settings = node_settings(config)
    about = {"node_id": settings.node_id, "role": settings.role, "repo": transport.describe()}
    redacted = config.to_dict(redact=True)
    writer = FinalGlobalWriter(model, config.output_dir, redacted, about, tokenizer)
    writer.adapters = adapters
    return writer


def coordinator_plugins(
    config: Any, model: nn.Module, logger: Any, tokenizer: Any = None, adapters: Any = None
) -> list[Any]:
    """The node's plug-ins; ``tokenizer``: the run's (``Runtime.tokenizer``), for the final
    global's record; ``adapters``: a LoRA run's (``Runtime.adapters``)."""
    settings = node_settings(config)
    transport = node_transport(settings, logger)
    writer = final_writer(config, model, transport, tokenizer, adapters)
    base = node_base(model, adapters)
    plugins: list[Any] = []
    if settings.train_locally:
        spill = config.output_dir / SPILL_DIR
        worker = WorkerPlugin(settings, model, transport, logger, spill_dir=spill, base=base)
        worker.end.final_writer = writer
        worker.end.repo_note = no_directory_note(settings.repo)  # said if never reached
        plugins.append(worker)
    if settings.role == "master":  # first: its initial global exists before the worker looks
        local_worker = plugins[0] if plugins else None
        loop = master_loop(config, model, logger, transport, base)
        plugins.insert(0, MasterPlugin(loop, local_worker))
        plugins[0].final_writer = writer
    logger.notice(
        f"diloco: {settings.role} {settings.node_id} on {settings.repo}, "
        f"syncing every {settings.inner_steps} steps"
    )
    return plugins


def coordinate_only(
    config: Any, model: nn.Module, logger: Any, adapters: Any = None
) -> dict[str, Any]:
    """Run the master without local training; returns the final outer step and status.
    ``model``: as every worker starts (its --init-from weights, a LoRA run's ``adapters``)."""
    transport = node_transport(node_settings(config), logger)
    loop = master_loop(config, model, logger, transport, node_base(model, adapters))
    loop.start()
    stop, caught = threading.Event(), Signals()

    def on_signal(signum: int, frame: Any) -> None:
        caught.record(signum)  # a second one ends the final round's retries at once
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    start = time.perf_counter()
    try:
        writer = final_writer(config, model, transport, run_tokenizer(config, None), adapters)
        path = serve(loop, config.distributed.outer_steps, stop, writer, caught)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return {
        "outer_step": loop.master.outer_step,
        "final_global": path,
        "elapsed_s": time.perf_counter() - start,
        "signal": caught.stop_signal,
    }
