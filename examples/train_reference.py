"""Train from Python: the default smoke run, then your own model through the same engine.

Run: python examples/train_reference.py
"""

from torch import nn

from speedtronic import SpeedtronicConfig, register_model
from speedtronic.runtime import train_from_config

# 1. The same run as `speedtronic train`: the embedded smoke config. In a directory of its own
#    (runs/smoke may hold your `speedtronic train`), replaced each time this example runs: a
#    directory holds one run, and a fresh run refuses one that holds another unless told.
ONE_RUN_EACH_TIME = ["checkpoint.overwrite=true"]
config = SpeedtronicConfig.load(
    SpeedtronicConfig.default(), ["run.output_dir=runs/example-smoke", *ONE_RUN_EACH_TIME]
)
result = train_from_config(config)
print(f"reference model: {result.steps} steps, final loss {result.final_loss:.4f}")


# 2. Your own model. Any nn.Module whose forward maps a batch to a loss works; dict batches
#    arrive as keyword arguments. Registering it makes it usable from YAML too
#    (model.name: tiny_mlp_lm, plus model.imports: [your_module] on the command line).
@register_model("tiny_mlp_lm")
class TinyMLPLM(nn.Module):
    def __init__(self, vocab_size: int = 256, width: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.head = nn.Linear(width, vocab_size)

    def forward(self, input_ids, labels):
        hidden = self.embed(input_ids)  # (B, T, C)
        logits = self.head(hidden + self.mlp(hidden))  # (B, T, vocab): a bigram-style model
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


custom = SpeedtronicConfig.from_dict(
    {
        "run": {"name": "custom", "max_steps": 60, "device": "auto"},
        "model": {"name": "tiny_mlp_lm", "vocab_size": 256, "width": 128},
        "data": {"micro_batch_size": 16, "target_batch_size": 32, "seq_len": 64},
        "optimizer": {"lr": 3e-3},
        "logging": {"every_steps": 20},
    },
    ONE_RUN_EACH_TIME,
)
result = train_from_config(custom)
print(f"custom model: {result.steps} steps, final loss {result.final_loss:.4f}")
