"""Hardening of model configs: configs are code, but none runs by surprise; bad params exit 2.

``validate`` builds only registered models unless ``--build``; an import path must name a
class or a Python function outside the standard library; wrong-typed or out-of-range model
parameters, and factories that raise TypeError/ValueError, are ConfigErrors naming the key.
"""

from __future__ import annotations

import re

import pytest
import yaml
from typer.testing import CliRunner

from speedtronic.cli.app import app
from speedtronic.errors import ConfigError
from speedtronic.registry import build_model

runner = CliRunner()


def write(tmp_path, config: dict) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def assert_one_line_error(result, *needles: str, code: int = 2):
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speedtronic: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_stdlib_callable_as_model_name_is_refused_not_run(tmp_path, command):
    marker = tmp_path / "ran"
    config = {"model": {"name": "os:system", "command": f"touch {marker}"}}
    args = [command, "-c", write(tmp_path, config)]
    result = runner.invoke(app, [*args, "--build"] if command == "validate" else args)
    assert_one_line_error(result, "model.name: 'os:system'", "standard library (os)")
    assert not marker.exists()


@pytest.mark.parametrize(
    "name", ["os:system", "subprocess:Popen", "os.path:join", "builtins:exec", "shutil:rmtree"]
)
def test_validate_refuses_a_stdlib_import_path_without_building_anything(tmp_path, name):
    # Issue 21: validate (no --build) accepted os:system with exit 0 while train refused it.
    # The rule needs only the text, so validate applies it, and without importing the module.
    config = {"model": {"name": name, "command": "true"}}
    result = runner.invoke(app, ["validate", "-c", write(tmp_path, config)])
    module = name.partition(":")[0]
    assert_one_line_error(result, f"model.name: '{name}' is in the standard library ({module})")


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("subprocess:Popen", "defined in the standard library (subprocess)"),
        ("shutil:rmtree", "defined in the standard library (shutil)"),
        ("builtins:exec", "not a class or a Python function"),
        ("builtins:object", "defined in the standard library (builtins)"),
    ],
)
def test_import_paths_must_name_a_model_factory(name, needle):
    with pytest.raises(ConfigError, match=rf"^model.name: '{name}' .*{re.escape(needle)}"):
        build_model(name, {"args": "true"})


def write_module(tmp_path, monkeypatch, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))


LM = (
    "import torch\n"
    "class MyLM(torch.nn.Module):\n"
    "    def __init__(self, vocab_size=64, width=8, seq_len=None):\n"
    "        super().__init__()\n"
    "        self.emb = torch.nn.Embedding(vocab_size, width)\n"
    "    def forward(self, input_ids, labels):\n"
    "        return self.emb(input_ids).sum()\n"
)


def test_validate_does_not_import_or_build_import_path_models_without_build(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    write_module(tmp_path, monkeypatch, "lm_side_effect", f"open({str(marker)!r}, 'w')\n" + LM)
    config = {"model": {"name": "lm_side_effect:MyLM", "width": 4}}
    result = runner.invoke(app, ["validate", "-c", write(tmp_path, config)])
    assert result.exit_code == 0, result.stderr
    assert "# parameters: not counted (import-path model; pass --build to build it)" in (
        result.stdout
    )
    assert not marker.exists()
    result = runner.invoke(app, ["validate", "-c", write(tmp_path, config), "--build"])
    assert result.exit_code == 0 and "# parameters: 256" in result.stdout
    assert marker.exists()


def test_validate_does_not_import_model_imports_without_build(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    write_module(tmp_path, monkeypatch, "lm_imports", f"open({str(marker)!r}, 'w')\n")
    config = {"model": {"name": "reference_transformer", "imports": ["lm_imports"]}}
    result = runner.invoke(app, ["validate", "-c", write(tmp_path, config)])
    assert result.exit_code == 0, result.stderr
    assert "# parameters: not counted (model.imports not imported" in result.stdout
    assert not marker.exists()


@pytest.mark.parametrize(
    ("model", "needles"),
    [
        ({"seq_len": "abc"}, ["model.seq_len: must be"]),
        ({"name": "tests_lm:MyLM", "seq_len": "abc"}, ["model.seq_len: must be a positive"]),
        ({"name": "tests_lm:MyLM", "seq_len": 12.5}, ["model.seq_len: must be a positive"]),
        ({"n_layer": -1}, ["model.n_layer: must be a positive integer (got -1)"]),
        ({"n_head": 3}, ["model.d_model: must be divisible by n_head=3"]),
        ({"name": "tests_lm:MyLM", "width": "wide"}, ["model.name: 'tests_lm:MyLM' failed"]),
        ({"name": "tests_lm:picky", "width": 7}, ["model.width: must be even (got 7)"]),
    ],
)
@pytest.mark.parametrize("command", ["validate", "train"])
def test_bad_model_params_exit_2_naming_the_key(tmp_path, monkeypatch, command, model, needles):
    picky = (
        "def picky(width=8):\n"
        "    if width % 2:\n"
        "        raise ValueError(f'width: must be even (got {width})')\n"
        "    return MyLM(width=width)\n"
    )
    write_module(tmp_path, monkeypatch, "tests_lm", LM + picky)
    config = {
        "run": {"device": "cpu", "max_steps": 1, "output_dir": str(tmp_path / "run")},
        "model": model,
    }
    args = [command, "-c", write(tmp_path, config)]
    result = runner.invoke(app, [*args, "--build"] if command == "validate" else args)
    assert_one_line_error(result, *needles)


def test_factory_type_errors_name_the_model_and_the_first_line():
    with pytest.raises(ConfigError) as caught:
        build_model("torch.nn:Linear", {"in_features": "x", "out_features": 2})
    message = str(caught.value)
    assert message.startswith("model.name: 'torch.nn:Linear' failed to build the model (TypeError")
    assert "\n" not in message
