"""The run's final global as a checkpoint in a node's output directory (I6).

Every DumbDiLoCo node ends by writing the newest global it has (on a worker: the one holding its
last delta, when it came in time; on the master: the final round's) to
``<output_dir>/final_global/``: one standard checkpoint directory, as
``checkpoint.save_checkpoint`` writes them (``model.safetensors`` with the whole model state:
the global's parameters and the model's own buffers, tied weights once; ``trainer_state.pt``;
``meta.json`` last, with the run's redacted config, its tokenizer record (and its
``tokenizer.json``, as every checkpoint of the run), ``step`` = the global's outer step,
``optimizer_steps`` and ``tokens`` = the fleet's, added up from the step count's ``nodes``, and
a ``diloco`` entry saying what the global holds). A LoRA fleet's is a LoRA checkpoint, as its
run's own are: the adapters alone, and ``meta.json``'s ``lora`` naming the base. Every tool that
takes a checkpoint directory reads it (``ckpt inspect``, ``load_checkpoint``, ``generate``,
``export``). It lives beside the node's own checkpoints, never among them, so ``--resume`` is
unchanged. Written crash-safely: a temporary sibling, renamed over the previous one.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import nn

from speedtronic.checkpoint.files import install_dir
from speedtronic.checkpoint.layout import TMP_PREFIX, TOKENIZER_FILE
from speedtronic.checkpoint.save import save_checkpoint
from speedtronic.checkpoint.tokenizer import tokenizer_record
from speedtronic.distributed.protocol import fleet_totals
from speedtronic.errors import CheckpointError

FINAL_DIR = "final_global"


class FinalGlobalWriter:
    """Writes the final global into ``output_dir``; called with (weights, outer step, facts)."""

    def __init__(
        self,
        model: nn.Module,
        output_dir: str | Path,
        config: dict,
        about: dict,
        tokenizer: Any = None,
    ):
        """``config``: the run's redacted config; ``about``: node id, role and repo, for meta;
        ``tokenizer``: the run's (``Runtime.tokenizer``), recorded as a checkpoint records it."""
        self.model, self.output_dir = model, Path(output_dir)
        self.config, self.about = config, about
        record, data = tokenizer_record(tokenizer)
        self.tokenizer_meta = record
        self.extra_files = {TOKENIZER_FILE: data} if data is not None else {}
        # a LoRA run's (``train.lora.Adapters``): the final global holds the adapters and
        # names the base, as the run's own checkpoints do
        self.adapters: Any = None

    @property
    def path(self) -> Path:
        return self.output_dir / FINAL_DIR

    def __call__(
        self,
        weights: dict[str, torch.Tensor],
        outer_step: int,
        facts: dict,
        nodes: dict | None = None,
    ) -> Path:
        """``nodes``: the global's step count summary, whose sums are the fleet's optimizer
        steps and tokens in the global (``fleet_totals``)."""
        state = model_state(self.model, weights)
        if self.adapters is not None:
            from speedtronic.train.lora import adapters_of

            state = adapters_of(state)
        totals = fleet_totals(nodes)
        diloco = {**self.about, "outer_step": outer_step, **facts}
        diloco["fleet_optimizer_steps"] = totals["optimizer_steps"]
        diloco["run_ended"] = totals["ended"]
        meta = {
            "run_id": uuid.uuid4().hex[:12],
            "tokens": totals["tokens"],
            "optimizer_steps": totals["optimizer_steps"],
            "param_count": sum(p.numel() for p in self.model.parameters()),
            "config": self.config,
            "tokenizer": self.tokenizer_meta,
            "diloco": diloco,
            **({"lora": self.adapters.record} if self.adapters is not None else {}),
        }
        scratch = self.output_dir / f"{TMP_PREFIX}{FINAL_DIR}-{uuid.uuid4().hex[:8]}"
        try:
            written = save_checkpoint(
                scratch,
                outer_step,
                state,
                {"diloco_final": diloco},
                meta,
                extra_files=self.extra_files,
            )
            install_dir(written, self.path)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            message = f"could not write the final global to {self.path}: {reason}"
            raise CheckpointError(message) from exc
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return self.path


def model_state(model: nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with the global's parameters in place of the node's, in the
    model's dtypes; tied parameters stay one tensor, buffers are the model's own."""
    names = {id(p): name for name, p in model.named_parameters() if name in weights}
    converted: dict[str, torch.Tensor] = {}
    state = {}
    for key, value in model.state_dict(keep_vars=True).items():
        name = names.get(id(value))
        if name is None:
            state[key] = value.detach()
            continue
        if name not in converted:
            converted[name] = weights[name].detach().to("cpu", value.dtype)
        state[key] = converted[name]
    return state
