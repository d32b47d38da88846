"""The command line as users meet it: exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import subprocess
import sys

import proc_support
import pytest
import yaml
from proc_support import quiet_env
from typer.testing import CliRunner

from speedtronic.cli.app import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def write(tmp_path, config: dict | str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    return str(path)


def assert_one_line_error(result, *needles: str, code: int = 2):
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speedtronic: error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0]


def test_train_honours_overrides_and_prints_a_summary(tiny, tmp_path):
    out = tmp_path / "demo"
    result = invoke(
        "train",
        "-c",
        write(tmp_path, tiny),
        "--max-steps",
        "4",
        "--output-dir",
        str(out),
        "--set",
        "logging.json_file=m.jsonl",
    )
    assert result.exit_code == 0, result.stderr
    assert "done: 4 steps" in result.stdout
    assert "\nloss: " in result.stdout and " (min " in result.stdout  # the sparkline line
    assert "step 4/4" in result.stderr  # progress on stderr, data on stdout
    assert (out / "m.jsonl").exists()


@pytest.mark.parametrize(
    ("config", "needles"),
    [
        ("run: [1, 2\n", ["malformed YAML at line"]),
        ({"optimzer": {"lr": 1}}, ["optimzer: unknown key", "did you mean 'optimizer'"]),
        ({"data": {"shuffle": "false"}}, ["data.shuffle: must be true or false"]),
        ({"optimizer": {"lr": -1}}, ["optimizer.lr: must be > 0"]),
        (
            {"data": {"micro_batch_size": 3, "target_batch_size": 8}},
            ["data.target_batch_size: must be a multiple"],
        ),
        ({"model": {"name": "gpt_99"}}, ["model.name: unknown model 'gpt_99'"]),
        ({"model": {"n_layers": 2}}, ["model.n_layers: unknown parameter", "'n_layer'"]),
        ({"model": {"n_head": 4, "n_kv_head": 3}}, ["n_kv_head: must divide n_head"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, config, needles):
    for command in ("train", "validate"):
        assert_one_line_error(invoke(command, "-c", write(tmp_path, config)), *needles)


def test_missing_config_file(tmp_path):
    missing = str(tmp_path / "missing.yaml")
    assert_one_line_error(invoke("train", "-c", missing), "config file not found", missing)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs no CUDA")
def test_unavailable_device(tiny, tmp_path):
    result = invoke("train", "-c", write(tmp_path, tiny), "--device", "cuda")
    assert_one_line_error(result, "run.device: 'cuda' is not available")
    result = invoke("validate", "-c", write(tmp_path, tiny), "--set", "device=cuda")
    assert_one_line_error(result, "run.device")


def test_validate_prints_resolved_redacted_config_and_facts(tiny, tmp_path):
    tiny["distributed"] = {"token": "hf_topsecret"}
    result = invoke("validate", "-c", write(tmp_path, tiny))
    assert result.exit_code == 0, result.stderr
    assert "hf_topsecret" not in result.stdout and "<redacted>" in result.stdout
    assert "# accumulation_steps: 2" in result.stdout
    assert "# tokens_per_optimizer_step: 128" in result.stdout
    assert "# parameters: " in result.stdout


def test_validate_lists_every_problem(tmp_path):
    config = {"optimizer": {"lr": 0, "eps": "tiny"}, "bogus": True}
    result = invoke("validate", "-c", write(tmp_path, config))
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 3


def test_custom_model_by_import_path_from_yaml(tiny, tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(
        "import torch\n"
        "from speedtronic import register_model\n"
        "@register_model('my_lm')\n"
        "class MyLM(torch.nn.Module):\n"
        "    def __init__(self, vocab_size=64, width=8):\n"
        "        super().__init__()\n"
        "        self.emb = torch.nn.Embedding(vocab_size, width)\n"
        "        self.out = torch.nn.Linear(width, vocab_size)\n"
        "    def forward(self, input_ids, labels):\n"
        "        logits = self.out(self.emb(input_ids))\n"
        "        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    tiny["model"] = {"name": "my_lm", "imports": ["mymodels"], "width": 4, "vocab_size": 64}
    assert invoke("train", "-c", write(tmp_path, tiny)).exit_code == 0
    tiny["model"] = {"name": "mymodels:MyLM", "width": 4}
    result = invoke("validate", "-c", write(tmp_path, tiny))  # runs no config code by default
    assert result.exit_code == 0 and "# parameters: not counted" in result.stdout
    result = invoke("validate", "-c", write(tmp_path, tiny), "--build")
    assert result.exit_code == 0 and "# parameters: 576" in result.stdout


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # waited for by its progress, not a clock: on a loaded machine a run takes minutes
    return proc_support.run([sys.executable, "-m", "speedtronic", *args], env=quiet_env(env))


def test_help_lists_only_implemented_commands_and_skips_torch():
    # Nor what only a command's body needs: the config loader and YAML, Rich (issue 21: --help
    # and every TAB of shell completion pay for whatever the app imports)
    heavy = ("torch", "safetensors", "huggingface_hub", "speedtronic.config", "yaml", "rich")
    code = (
        "import sys; from speedtronic.cli.app import app; from typer.testing import CliRunner;"
        "r = CliRunner().invoke(app, ['--help']); print(r.stdout);"
        f"print('HEAVY', [m for m in {heavy!r} if m in sys.modules])"
    )
    out = proc_support.run([sys.executable, "-c", code]).stdout
    assert "HEAVY []" in out
    commands = out.split("Commands")[-1]
    for command in ("train", "validate", "ckpt", "data", "hub"):
        assert command in commands


def test_real_process_exit_code_and_debug_traceback(tmp_path):
    bad = write(tmp_path, {"optimizer": {"lr": "x"}})
    plain = run_cli("train", "-c", bad)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.startswith("speedtronic: error: optimizer.lr: must be a number")
    debug = run_cli("train", "-c", bad, env={"SPEEDTRONIC_DEBUG": "1"})
    assert debug.returncode != 0 and "Traceback" in debug.stderr


@pytest.mark.slow
def test_default_run_learns(tmp_path):
    # its own directory: two suites running at once shared /tmp/speedtronic-default
    result = run_cli("train", "--max-steps", "40", "--output-dir", str(tmp_path / "default"))
    assert result.returncode == 0, result.stderr
    losses = [
        float(line.split("loss ")[1].split()[0])
        for line in result.stderr.splitlines()
        if line.startswith("step ")
    ]
    assert losses[-1] < losses[0] - 1.5
