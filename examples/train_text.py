"""Train the reference model on real text: the Python standard library's own source code.

Run: python examples/train_text.py

The corpus is every top-level ``.py`` module of the running Python's standard library
(``sysconfig.get_paths()["stdlib"]``, ~4-5 MB) concatenated into one UTF-8 file, so it exists
on every machine with no download. A ~1.2M-parameter reference transformer learns it byte by
byte (``data.tokenizer: byte``, vocab 256). The last 5% of the file is held out
(``data.eval_fraction``) and evaluated every ``data.eval_every`` steps, plus once before the
first step; a hook collects the ``eval`` events and the script prints how the held-out loss
fell: from ln(256) = 5.55 (uniform guessing) to well under 3. About 6 minutes on a quiet 2-core
CPU (an AVX2 machine, issue 31), half an hour while other work shares the cores (measured at
load average 9-17: docs/benchmarks.md, "First contact"); everything is written to a temporary
directory and removed at the end.
"""

import sysconfig
import tempfile
import time
from pathlib import Path

from speedtronic import SpeedtronicConfig
from speedtronic.evaluate.loss_plugin import EvalPlugin
from speedtronic.runtime import train_from_config


def write_stdlib_corpus(path: Path) -> int:
    """Concatenate the stdlib's top-level modules (valid UTF-8 only) into ``path``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    with path.open("wb") as out:
        for module in sorted(stdlib.glob("*.py")):
            data = module.read_bytes()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            out.write(data if data.endswith(b"\n") else data + b"\n")
    return path.stat().st_size


class EvalAtStart:
    """A Trainer plug-in: run the configured evaluation once before the first step too."""

    name = "eval_at_start"

    def on_train_start(self, trainer):
        for plugin in trainer.plugins:
            if isinstance(plugin, EvalPlugin) and trainer.step == 0:
                plugin.evaluate(trainer)


def make_config(corpus: Path, output_dir: str) -> SpeedtronicConfig:
    return SpeedtronicConfig.from_dict(
        {
            "run": {"name": "stdlib-text", "max_steps": 300, "output_dir": output_dir},
            "model": {
                "name": "reference_transformer",
                "vocab_size": 256,
                "seq_len": 128,
                "n_layer": 4,
                "n_head": 4,
                "n_kv_head": 2,
                "d_model": 160,
            },
            "data": {
                "text_path": str(corpus),
                "tokenizer": "byte",
                "micro_batch_size": 16,
                "eval_fraction": 0.05,
                "eval_every": 50,
                "eval_batches": 16,
            },
            "optimizer": {"lr": 3.0e-3, "weight_decay": 0.1, "grad_clip": 1.0},
            "scheduler": {"name": "cosine", "warmup_steps": 20, "min_lr_ratio": 0.1},
            "logging": {"every_steps": 50},
        }
    )


def main() -> None:
    evals = []

    def on_event(event, payload):
        if event == "eval":
            evals.append((payload["step"], payload["eval_loss"]))

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="speedtronic-text-") as tmp:
        corpus = Path(tmp) / "stdlib.txt"
        size = write_stdlib_corpus(corpus)
        print(f"corpus: {size / 1e6:.1f} MB of Python stdlib source at {corpus}")
        config = make_config(corpus, str(Path(tmp) / "run"))
        result = train_from_config(config, hooks=[on_event], plugins=[EvalAtStart()])
    (first_step, first), (last_step, last) = evals[0], evals[-1]
    print(f"\n{result.steps} steps in {time.perf_counter() - start:.0f} s")
    print("eval loss by step: " + ", ".join(f"{step}: {loss:.3f}" for step, loss in evals))
    print(f"eval loss fell from {first:.3f} (step {first_step}) to {last:.3f} (step {last_step})")


if __name__ == "__main__":
    main()
