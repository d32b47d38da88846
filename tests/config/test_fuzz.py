"""Seeded fuzz: whatever it is given, ``SpeedtronicConfig.load`` raises only ConfigError.

Valid configs are mutated at random (wrong types, NaN/inf, huge integers, odd strings,
unknown keys, deep nesting, YAML tags, anchors, broken syntax) and fed in as a dict, as
YAML text, as a file and through ``--set`` overrides. Any exception other than ConfigError
fails the test with the case number; the seed makes every failure reproducible.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from speedtronic.config import SECTIONS, SpeedtronicConfig
from speedtronic.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SEED = 20240610
CASES = 400

ODD_VALUES: list[Any] = [
    float("nan"),
    float("inf"),
    -float("inf"),
    10**400,
    -(10**400),
    10**5000,
    2**64,
    2**63,
    -1,
    0,
    1e308,
    -0.0,
    5e-324,
    "",
    " ",
    "\x00",
    "a\x00b",
    "cpu\n",
    "..",
    "/",
    "a/b",
    "x" * 5000,
    "é" * 300,
    "\ud800",
    "2024-01-01",
    "${HOME}",
    "pkg.mod:attr\n",
    True,
    False,
    None,
    [],
    {},
    [1, "a", None],
    {"a": {"b": {"c": 1}}},
    (1, 2),
    b"bytes",
    {1, 2},
    3 + 4j,
    object(),
]
ODD_YAML = [
    "[",
    "{a: 1",
    "]",
    ".nan",
    "-.inf",
    "1e999",
    "9" * 400,
    "1" * 5000,
    "2024-01-01",
    "2024-13-45",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!python/name:os.system",
    "!!python/object/apply:os.system ['true']",
    "!!float abc",
    "!!int x",
    "!!bool maybe",
    "!!timestamp 2020-01-01",
    "!custom x",
    "*undefined",
    "&a [*a]",
    "'a\\x00'",
    '"a\\0b"',
    '"cpu\\n"',
    "~",
    "yes",
    "0x1F",
    "1:30",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    "{a: 1, a: 2}",
    "\t",
    "%YAML 1.1",
    "--- 1\n--- 2",
]
TAGS = ["!!timestamp ", "!!binary ", "!!set ", "!!omap ", "!!python/object:os.system ", "!x "]
TAGS += ["!!float ", "!!int ", "!!bool ", "!!str ", "!!null ", "!!map ", "!!seq ", "&a ", "*a "]
SNIPPETS = ["{", "}", "[", "]", ": ", "- ", "\t", "\x00", "\ufeff", "#", "&x ", "*x", "<<: *x"]
SNIPPETS += ["\n---\n", "\n...\n", "'", '"', "\\", "\x85", "\u2028", "\n  ", "\nrun:\n", "?"]
TINY = {
    "run": {"name": "tiny", "seed": 0, "device": "cpu", "max_steps": 6},
    "model": {"name": "reference_transformer", "vocab_size": 64, "seq_len": 16, "d_model": 32},
    "data": {"micro_batch_size": 4, "target_batch_size": 8},
    "optimizer": {"lr": 1e-2, "betas": [0.9, 0.95]},
    "logging": {"every_steps": 2, "hooks": ["tensorboard"]},
    "distributed": {"node_id": "a", "outer_lr": 0.7, "max_wait_s": 10.0},
}


def valid_configs() -> list[dict[str, Any]]:
    default = SpeedtronicConfig.default().to_dict(redact=False)
    gpt2 = yaml.safe_load((ROOT / "configs" / "gpt2_small.yaml").read_text())
    return [default, gpt2, copy.deepcopy(TINY), {}, {"run": {"max_steps": 3}}]


# ---- mutations of plain data --------------------------------------------------------------


def random_path(rng: random.Random) -> tuple[str, str]:
    section = rng.choice([*SECTIONS, "compile", "name", "seed"])
    fields = list(getattr(SECTIONS.get(section), "__dataclass_fields__", {})) or ["x"]
    if section == "model":
        fields = ["name", "imports", "seq_len", "max_seq_len", "vocab_size", "rope_theta"]
    return section, rng.choice(fields)


def nested(rng: random.Random, depth: int) -> Any:
    value: Any = rng.choice([1, "x", None])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def mutate(rng: random.Random, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg = copy.deepcopy(cfg)
    for _ in range(rng.randint(1, 3)):
        section, key = random_path(rng)
        kind = rng.randrange(6)
        if kind == 0 or section not in SECTIONS:
            value = rng.choice(ODD_VALUES)
            if section in SECTIONS and isinstance(cfg.get(section), dict):
                cfg[section][key] = value
            else:
                cfg[section] = value
        elif kind == 1:
            target = cfg[section] if isinstance(cfg.get(section), dict) else cfg
            target[rng.choice(["bogus", key + "s", "", "a.b", "x" * 300])] = 1
        elif kind == 2:
            cfg[section] = rng.choice(ODD_VALUES)
        elif kind == 3:
            cfg.setdefault("model", {})
            if isinstance(cfg["model"], dict):
                cfg["model"][rng.choice(["x", "seq_len"])] = nested(rng, rng.randint(1, 120))
        elif kind == 4:
            shared = ["lol"] * 10
            for _ in range(rng.randint(1, 5)):  # up to a million strings once expanded
                shared = [shared] * 10  # shared references: an alias bomb in a dict
            cfg["model"] = {"x": shared}
        else:
            cfg.pop(section, None)
    return cfg


# ---- mutations of text --------------------------------------------------------------------


def to_text(rng: random.Random, cfg: dict[str, Any]) -> str | None:
    dump = json.dumps if rng.random() < 0.3 else yaml.safe_dump
    try:
        text = dump(cfg)
    except (TypeError, ValueError, yaml.YAMLError):  # objects YAML/JSON cannot write
        return None
    # JSON writes shared lists out in full; YAML keeps them small, as anchors and aliases
    return text if len(text) < 100_000 else None


def mutate_text(rng: random.Random, text: str) -> str:
    lines = text.splitlines(keepends=True) or ["\n"]
    i = rng.randrange(len(lines))
    kind = rng.randrange(6)
    if kind == 0 and ": " in lines[i]:
        head, _, tail = lines[i].partition(": ")
        lines[i] = f"{head}: {rng.choice(TAGS)}{tail}"
    elif kind == 1:
        lines.insert(i, lines[i])  # a duplicate key, or a duplicate list item
    elif kind == 2:
        at = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:at] + rng.choice(SNIPPETS) + lines[i][at:]
    elif kind == 3:
        return text[: rng.randrange(len(text) + 1)]
    elif kind == 4 and ": " in lines[i]:
        head, _, _ = lines[i].partition(": ")
        lines[i] = f"{head}: {rng.choice(ODD_YAML)}\n"
    else:
        lines.insert(0, f"x{i}: {rng.choice(ODD_YAML)}\n")
    return "".join(lines)


def random_override(rng: random.Random) -> str:
    section, key = random_path(rng)
    return rng.choice(
        [
            f"{section}.{key}={rng.choice(ODD_YAML)}",
            f"{section}.{key}=",
            f"{section}={rng.choice(ODD_YAML)}",
            rng.choice(["", "=", "a", ".", "a.=1", "a..b=1", "=1", " = ", "run.name.x=1"]),
        ]
    )


# ---- the fuzz -----------------------------------------------------------------------------


def attempt(case: int, what: str, load: Any) -> bool:
    """True if it loaded, False on ConfigError; anything else fails the test."""
    try:
        config = load()
    except ConfigError as exc:
        assert str(exc), f"case {case} ({what}): empty ConfigError"
        return False
    except Exception as exc:  # the point of the test: nothing else may escape
        pytest.fail(f"case {case} ({what}): {type(exc).__name__}: {str(exc)[:300]}")
    again = SpeedtronicConfig.from_dict(config.to_dict(redact=False))
    assert again.to_dict(redact=False).keys() == config.to_dict(redact=False).keys()
    return True


def run_case(rng: random.Random, case: int, bases: list[dict], tmp_path: Path) -> bool | None:
    """Load one mutated config by a random route; None when the route could not be built."""
    cfg = mutate(rng, rng.choice(bases))
    route = rng.randrange(4)
    if route == 0:
        return attempt(case, "dict", lambda: SpeedtronicConfig.load(cfg))
    if route == 1:
        base, overrides = rng.choice(bases), [random_override(rng) for _ in range(3)]
        return attempt(case, f"--set {overrides}", lambda: SpeedtronicConfig.load(base, overrides))
    text = to_text(rng, cfg)
    if text is None:
        return None
    for _ in range(rng.randint(0, 3)):
        text = mutate_text(rng, text)
    if route == 2:
        return attempt(case, f"text {text[:200]!r}", lambda: SpeedtronicConfig.load(text))
    path = tmp_path / f"case{case}.{rng.choice(['yaml', 'json', 'yml'])}"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))  # a lone surrogate: bad UTF-8
    return attempt(case, f"file {text[:200]!r}", lambda: SpeedtronicConfig.load(path))


def test_load_raises_only_config_error(tmp_path):
    rng = random.Random(SEED)
    bases = valid_configs()
    counts = {True: 0, False: 0, None: 0}
    for case in range(CASES):
        counts[run_case(rng, case, bases, tmp_path)] += 1
    assert counts[False] > CASES // 3, counts  # the mutations do bite
    assert counts[True] > 10, counts  # and some still load: the checks are not too strict


def test_valid_variations_still_load(tmp_path):
    rng = random.Random(SEED + 1)
    bases = valid_configs()
    for case in range(40):
        cfg = copy.deepcopy(rng.choice(bases))
        run = cfg.setdefault("run", {})
        run["seed"] = rng.choice([0, 1, 2**32 - 1, rng.randrange(2**32)])
        run["max_steps"] = rng.randint(1, 10**6)
        run["device"] = rng.choice(["auto", "cpu", "cuda", "cuda:3", "mps"])
        run["name"] = rng.choice(["a", "run 1", "é" * 100, "x" * 255, "v1.2-final_b"])
        cfg.setdefault("optimizer", {})["lr"] = rng.uniform(1e-6, 1.0)
        cfg["optimizer"]["grad_clip"] = rng.choice([None, 0, 0.5, 1e6])
        cfg.setdefault("distributed", {})["outer_momentum"] = rng.uniform(0, 0.999)
        path = tmp_path / f"valid{case}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        for source in (cfg, yaml.safe_dump(cfg), json.dumps(cfg), path):
            config = SpeedtronicConfig.load(source)
            assert config.run.seed == run["seed"] and config.run.name == run["name"]
            assert SpeedtronicConfig.from_dict(config.to_dict(redact=False)) == config
