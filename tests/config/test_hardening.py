"""Config loading under hostile or careless input: every case is a ConfigError naming the key.

Each test here failed before the hardening (issue 10): the value loaded and failed later,
the loader hung or ate memory, or another exception type escaped.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import typing
from pathlib import Path

import proc_support
import pytest

import speedtronic.config
from speedtronic.config import MAX_DEPTH, MAX_FILE_BYTES, SpeedtronicConfig
from speedtronic.errors import ConfigError, DataError, SpeedtronicError

PACKAGE = Path(speedtronic.config.__file__).parent


def yaml_error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        SpeedtronicConfig.from_yaml(text)
    return str(info.value)


def dict_problems(raw, overrides=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        SpeedtronicConfig.from_dict(raw, overrides)
    return info.value.problems


# ---- 1. floats: finite and in range -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("optimizer: {lr: .inf}", "optimizer.lr: must be finite and > 0 (got inf)"),
        ("optimizer: {lr: 1e999}", "optimizer.lr: must be finite and > 0 (got inf)"),
        ("optimizer: {weight_decay: .nan}", "optimizer.weight_decay: must be finite and >= 0"),
        ("optimizer: {grad_clip: .nan}", "optimizer.grad_clip: must be finite and >= 0 or null"),
        ("optimizer: {eps: -.inf}", "optimizer.eps: must be finite and > 0 (got -inf)"),
        ("optimizer: {betas: [.nan, 0.9]}", "optimizer.betas: must be finite (got [nan, 0.9])"),
        ("scheduler: {min_lr_ratio: .nan}", "scheduler.min_lr_ratio: must be finite and in [0, 1]"),
        ("data: {eval_fraction: .nan}", "data.eval_fraction: must be finite and in [0, 1)"),
        ("distributed: {outer_lr: .inf}", "distributed.outer_lr: must be finite and > 0"),
        ("distributed: {outer_momentum: .nan}", "distributed.outer_momentum: must be finite"),
        ("distributed: {max_wait_s: .inf}", "distributed.max_wait_s: must be finite and in [0,"),
    ],
)
def test_non_finite_floats_are_refused_with_the_rule(text, expected):
    assert yaml_error(text).startswith(expected)


def test_every_float_field_refuses_nan_generically():
    for name, cls in speedtronic.config.SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for key, hint in hints.items():
            if hint in (float, float | None):
                problems = dict_problems({name: {key: float("nan")}})
                assert problems[0].startswith(f"{name}.{key}: must be finite"), problems


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"distributed": {"outer_momentum": 1.0}}, "distributed.outer_momentum: must be in [0, 1)"),
        ({"distributed": {"max_wait_s": 1e9}}, "distributed.max_wait_s: must be in [0, 604800]"),
        (
            {"distributed": {"max_staleness": -1}},
            "distributed.max_staleness: must be in [0, 2**20]",
        ),
        ({"distributed": {"outer_lr": 0}}, "distributed.outer_lr: must be > 0 (got 0.0)"),
        ({"data": {"eval_fraction": 1.0}}, "data.eval_fraction: must be in [0, 1) (got 1.0)"),
        ({"data": {"num_workers": 10**6}}, "data.num_workers: must be in [0, 1024]"),
        ({"checkpoint": {"keep_last": 0}}, "checkpoint.keep_last: must be in [1, 2**20] or null"),
        ({"run": {"max_steps": 2**70}}, "run.max_steps: must be in [1, 2**40]"),
    ],
)
def test_ranges_per_key(raw, expected):
    assert dict_problems(raw)[0].startswith(expected)


def test_huge_integer_where_a_float_is_expected_is_a_config_error():
    assert yaml_error(f"optimizer: {{lr: {'9' * 400}}}").startswith(
        "optimizer.lr: must be finite and > 0 (got an integer of 400 digits)"
    )
    assert dict_problems({"optimizer": {"eps": -(10**400)}})[0].startswith("optimizer.eps")


def test_out_of_range_values_do_not_reach_the_cross_checks():
    # They were formatted into the accumulation message: str() of 5,000 digits raises
    problems = dict_problems({"data": {"micro_batch_size": 10**5000, "target_batch_size": 8}})
    assert problems == [
        "data.micro_batch_size: must be in [1, 2**20] (got an integer of about 5001 digits)"
    ]
    problems = dict_problems({"model": {"seq_len": 64}, "data": {"seq_len": 10**9}})
    assert problems == ["data.seq_len: must be in [1, 2**20] or null (got 1000000000)"]


# ---- 2. YAML that is valid but not plain data ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("run:\n  name: 2024-01-01\n", "run.name: must be plain data"),
        ("run:\n  name: !!binary aGVsbG8=\n", "run.name: must be plain data"),
        ("model:\n  tags: !!set {a, b}\n", "model.tags: must be plain data"),
        ("model:\n  x: !!omap [{a: 1}]\n", "model.x: must be plain data"),
        ("run: !!python/object:os.system {}\n", "run: must be plain data"),
        ("run:\n  name: !!python/name:os.system\n", "run.name: must be plain data"),
        ("run:\n  name: !custom x\n", "run.name: must be plain data"),
        ("optimizer:\n  lr: !!float abc\n", "optimizer.lr: must be a valid !!float value"),
        ("data:\n  shuffle: !!bool maybe\n", "data.shuffle: must be a valid !!bool value"),
        ("run:\n  seed: !!int x\n", "run.seed: must be a valid !!int value"),
        ("run:\n  name: 2024-13-45\n", "run.name: must be plain data"),  # used to be ValueError
    ],
)
def test_non_plain_yaml_is_refused_with_the_key_path(text, expected):
    message = yaml_error(text)
    assert message.startswith(expected) and "at config line" in message, message


def test_a_timestamp_says_how_to_mean_a_string():
    assert "quote it if you meant a string" in yaml_error("run: {name: 2024-01-01}")
    assert SpeedtronicConfig.from_yaml("run: {name: '2024-01-01'}").run.name == "2024-01-01"


def laughs(levels: int, width: int) -> str:
    """YAML whose aliases expand to ``width ** levels`` strings: "billion laughs"."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "model:\n" + "".join(f"  {line}\n" for line in lines)


def test_alias_expansion_is_bounded():
    message = yaml_error(laughs(6, 10))  # a million values: it loaded before, slowly
    assert message.startswith("model.l4: must hold at most 100000 values once aliases")


def test_billion_laughs_fails_fast(tmp_path):
    # 9**9 values from 1.2 KB took 8.8 s and gigabytes before: run it where a regression
    # can only fail this test, under a memory limit, not take the machine down
    text = laughs(9, 9)
    assert len(text) < 1500
    path = tmp_path / "laughs.yaml"
    path.write_text(text)
    code = (
        "import resource, sys, time\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from speedtronic.config import SpeedtronicConfig\n"
        "from speedtronic.errors import ConfigError\n"
        "start = time.process_time()\n"  # CPU time: a loaded machine must not fail it
        "try:\n"
        "    SpeedtronicConfig.from_file(sys.argv[1])\n"
        "except ConfigError as exc:\n"
        "    print(f'{time.process_time() - start:.3f} {exc}')\n"
    )
    pytest.importorskip("resource", reason="needs POSIX resource limits")
    out = proc_support.run([sys.executable, "-c", code, str(path)])
    assert out.returncode == 0 and out.stdout, out.stderr[-500:]
    seconds, message = out.stdout.split(" ", 1)
    assert float(seconds) < 2.0
    assert "must hold at most 100000 values once aliases are expanded" in message


def test_aliases_and_merge_keys_within_budget_still_work():
    text = "optimizer: &o {lr: 0.01, eps: 1.0e-6}\nscheduler: {warmup_steps: 3}\n"
    assert SpeedtronicConfig.from_yaml(text).optimizer.lr == 0.01
    merged = "model: &m {n_layer: 2}\nmodel2: {<<: *m, n_head: 2}\n"
    assert "model2: unknown key" in yaml_error(merged)  # parsed fine; the key is what is wrong
    shared = "model:\n  a: &a [1, 2, 3]\n  b: *a\n  c: {<<: {x: 1}, y: 2}\n"
    assert SpeedtronicConfig.from_yaml(shared).model.params == {
        "a": [1, 2, 3],
        "b": [1, 2, 3],
        "c": {"x": 1, "y": 2},
    }


def test_recursive_alias_is_refused():
    assert yaml_error("model:\n  x: &a [1, *a]\n").startswith("model.x[1]: must not contain itself")


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 600, 5000])
def test_deep_nesting_is_refused(depth):
    for text in (
        f"model:\n  x: {'[' * depth}{']' * depth}\n",
        f'{{"model": {{"x": {"[" * depth}1{"]" * depth}}}}}',
    ):
        assert f"must be nested at most {MAX_DEPTH} levels deep" in yaml_error(text)


def test_nesting_within_the_bound_loads():
    nested = "[" * 10 + "]" * 10
    assert SpeedtronicConfig.from_yaml(f"model: {{x: {nested}}}").model.params["x"]


def test_integers_too_long_for_python_are_refused():
    assert yaml_error(f"run: {{seed: {'1' * 5000}}}").startswith(
        "run.seed: must be an integer of at most 1000 digits"
    )


@pytest.mark.parametrize(
    "text",
    [
        "run: {name: a}\nrun: {name: b}\n",
        "run:\n  name: a\n  name: b\n",
        '{"run": {"name": "a"}, "run": {"name": "b"}}',
    ],
)
def test_duplicate_keys_are_refused(text):
    message = yaml_error(text)
    assert message.startswith(("run: must appear once", "run.name: must appear once")), message
    assert "silently replace" in message


def test_json_files_get_the_same_loader(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"optimizer": {"lr": 0.1}, "optimizer": {"lr": 0.2}}')
    with pytest.raises(ConfigError, match="optimizer: must appear once"):
        SpeedtronicConfig.load(path)
    path.write_text(json.dumps({"model": {"x": [[[[[[[[[[1]]]]]]]]]]}}))
    assert SpeedtronicConfig.load(path).model.params["x"]


def test_deep_and_recursive_python_dicts_are_refused():
    loop: dict = {}
    loop["x"] = loop
    assert "must be nested at most" in dict_problems({"model": loop})[0]
    nested: list = []
    for _ in range(5000):
        nested = [nested]
    assert "must be nested at most" in dict_problems({"model": {"x": nested}})[0]
    assert "keys must be strings" in dict_problems({"model": {1: 2}})[0]


# ---- 3. values that passed load and failed later ------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"run": {"device": "cpu\n"}}, "run.device: must be auto, cpu"),
        ({"run": {"device": "cuda:\u0661"}}, "run.device: must be auto, cpu"),  # Arabic-Indic 1
        ({"distributed": {"node_id": "abc\n"}}, "distributed.node_id: must be 1-64 characters"),
        ({"logging": {"hooks": ["pkg.mod:attr\n"]}}, "logging.hooks: 'pkg.mod:attr\\n' must be"),
        ({"run": {"seed": 2**64}}, "run.seed: must be in [0, 2**32)"),
        ({"run": {"seed": -1}}, "run.seed: must be in [0, 2**32)"),
        ({"data": {"seq_len": 1e11}}, "data.seq_len: must be an integer or null"),
        ({"data": {"seq_len": 10**11}}, "data.seq_len: must be in [1, 2**20] or null"),
        ({"model": {"seq_len": 10**11}}, "model.seq_len: must be in [1, 2**20]"),
        ({"model": {"max_seq_len": 64.0}}, "model.max_seq_len: must be an integer"),
        ({"run": {"output_dir": "runs/a\x00b"}}, "run.output_dir: must be free of NUL characters"),
        ({"data": {"text_path": "a\x00"}}, "data.text_path: must be free of NUL"),
        ({"data": {"tokenizer": "\x00"}}, "data.tokenizer: must be free of NUL"),
        ({"checkpoint": {"directory": "\x00"}}, "checkpoint.directory: must be free of NUL"),
        ({"logging": {"json_file": "\x00"}}, "logging.json_file: must be free of NUL"),
        ({"model": {"imports": ["a\x00"]}}, "model.imports: must be free of NUL"),
    ],
)
def test_values_that_used_to_fail_only_later(raw, expected):
    assert dict_problems(raw)[0].startswith(expected)


@pytest.mark.parametrize(
    "name", ["x" * 5000, "é" * 128, "..", ".", "a/b", "a\\b", "line\nbreak", "tab\there", "\x00"]
)
def test_run_name_must_be_a_safe_directory_name(name):
    problem = dict_problems({"run": {"name": name}})[0]
    assert problem.startswith("run.name: must be")
    assert len(problem) < 300  # a 5,000-character name is not echoed in full


@pytest.mark.parametrize("name", ["smoke", "gpt2 small", "é" * 127, "run-1.2_x", "x" * 255])
def test_reasonable_run_names_still_load(name):
    assert SpeedtronicConfig.from_dict({"run": {"name": name}}).run.name == name


def test_data_seq_len_cannot_exceed_the_reference_models_context():
    problem = dict_problems({"model": {"seq_len": 64}, "data": {"seq_len": 128}})[0]
    assert problem == (
        "data.seq_len: must be <= model.seq_len=64, the reference model's context length (got 128)"
    )


# ---- 4. --set overrides -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("optimizer.lr=[", "--set 'optimizer.lr=[': malformed YAML at line 1"),
        ("optimizer.lr={a: 1", "--set 'optimizer.lr={a: 1': malformed YAML"),
        ("optimizer.lr", "--set 'optimizer.lr': expected key.path=value"),
        ("=1", "--set '=1': expected key.path=value"),
        ("  =1", "--set '  =1': expected key.path=value"),
        ("optimizer..lr=1", "--set 'optimizer..lr=1': the key path 'optimizer..lr' has an empty"),
        ("optimizer.lr=.nan", "optimizer.lr: must be finite and > 0 (got nan)"),
        ("run.name=2024-01-01", "run.name: must be plain data"),
        ("run.name=!!python/name:os.system", "run.name: must be plain data"),
        ("optimizer.lr.x=1", "--set optimizer.lr.x: 'lr' is not a section"),
    ],
)
def test_bad_overrides_are_one_line_config_errors(override, expected):
    with pytest.raises(ConfigError) as info:
        SpeedtronicConfig.from_dict({"optimizer": {"lr": 0.1}}, [override])
    assert str(info.value).startswith(expected), str(info.value)
    assert "\n" not in str(info.value)


def test_overrides_still_parse_values_as_yaml():
    config = SpeedtronicConfig.from_dict({}, ["optimizer.betas=[0.8, 0.9]", "run.name=a=b"])
    assert config.optimizer.betas == (0.8, 0.9) and config.run.name == "a=b"


# ---- 5. config files ----------------------------------------------------------------------


def test_a_fifo_is_refused_at_once(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this OS")
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    outcome: list = []

    def load() -> None:
        try:
            SpeedtronicConfig.from_file(fifo)
        except Exception as exc:  # recorded for the assertion below
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout=5)
    if thread.is_alive():  # the old loader blocks in open(): give it an empty writer to end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=5)
    assert isinstance(outcome[0], ConfigError), outcome
    assert "must be a regular file" in str(outcome[0])


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_a_device_is_refused_before_reading():
    # /dev/zero never ends; /dev/null proves the same check without risking the memory
    with pytest.raises(ConfigError, match="config file /dev/null: must be a regular file"):
        SpeedtronicConfig.from_file("/dev/null")


def test_config_files_have_a_size_cap(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk use
    with pytest.raises(ConfigError, match=r"big.yaml: must be at most 4194304 bytes \(4 MiB\)"):
        SpeedtronicConfig.from_file(path)


def test_directories_and_odd_paths(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        SpeedtronicConfig.from_file(tmp_path)
    with pytest.raises(ConfigError, match="cannot read config file"):
        SpeedtronicConfig.from_file("bad\x00path.yaml")
    with pytest.raises(ConfigError, match="must be a mapping of sections"):
        SpeedtronicConfig.load("x" * 5000)  # once an OSError: file name too long


# ---- 6. the reference model's max_seq_len -------------------------------------------------


DEMO = {
    "run": {"name": "demo", "max_steps": 100, "device": "cpu"},
    "model": {
        "name": "reference_transformer",
        "vocab_size": 256,
        "max_seq_len": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_kv_head": 2,
        "d_model": 64,
    },
    "data": {"micro_batch_size": 2, "target_batch_size": 8},
    "precision": {"mode": "fp32"},
}


def test_max_seq_len_is_an_alias_of_seq_len():
    config = SpeedtronicConfig.from_dict(DEMO)
    assert config.seq_len == 64  # was 128: the alias was ignored here and refused at build
    model = config.to_dict()["model"]
    assert model["seq_len"] == 64 and "max_seq_len" not in model
    assert list(model)[3] == "seq_len"  # where the user wrote it
    assert SpeedtronicConfig.from_dict(config.to_dict()) == config


def test_seq_len_and_max_seq_len_must_agree():
    both = {"model": {"seq_len": 64, "max_seq_len": 128}}
    assert dict_problems(both)[0].startswith("model.max_seq_len: an alias of model.seq_len")
    same = SpeedtronicConfig.from_dict({"model": {"seq_len": 64, "max_seq_len": 64}})
    assert same.model.params == {"seq_len": 64}


def test_max_seq_len_is_left_alone_for_other_models():
    config = SpeedtronicConfig.from_dict({"model": {"name": "pkg.mod:make", "max_seq_len": 9}})
    assert config.model.params == {"max_seq_len": 9}


# ---- 7. ConfigError is a ValueError -------------------------------------------------------


def test_config_error_is_a_value_error_and_keeps_its_shape():
    with pytest.raises(ValueError):
        SpeedtronicConfig.from_dict({"optimizer": {"lr": -1}})
    assert issubclass(DataError, ConfigError) and issubclass(DataError, ValueError)
    error = ConfigError("x: bad", hint="do y", problems=["x: bad", "z: bad"])
    assert isinstance(error, SpeedtronicError) and error.exit_code == 2
    assert (str(error), error.hint, error.problems) == ("x: bad", "do y", ["x: bad", "z: bad"])


# ---- the package itself -------------------------------------------------------------------


def test_config_package_modules_are_small_and_say_what_they_own():
    for module in sorted(PACKAGE.glob("*.py")):
        text = module.read_text(encoding="utf-8")
        assert text.startswith('"""'), f"{module.name}: no opening docstring"
        assert text.count("\n") <= 500, f"{module.name}: over 500 lines"
