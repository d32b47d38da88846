"""The generated references stay true: completions, docs/config.md and docs/cli.md.

Each file must equal what ``scripts/generate_references.py`` renders from the code now, so a
new option, key or rule that is not regenerated fails here with the command that fixes it.
Also: every config key has a one-line meaning and appears in docs/config.md, every command
and option appears in docs/cli.md, and the completion scripts complete in the shells that
are installed (bash everywhere; zsh and fish where present).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import inspect
import shlex
import shutil
from pathlib import Path

import proc_support
import pytest

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "python scripts/generate_references.py"


def load_generator():
    spec = importlib.util.spec_from_file_location(
        "generate_references", ROOT / "scripts" / "generate_references.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load_generator()


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return gen.render_all()


@pytest.mark.parametrize("rel", [*gen.SHELLS.values(), "docs/config.md", "docs/cli.md"])
def test_generated_file_is_up_to_date(rel, rendered):
    path = ROOT / rel
    current = path.read_text(encoding="utf-8") if path.is_file() else ""
    if current != rendered[rel]:
        diff = difflib.unified_diff(
            current.splitlines(), rendered[rel].splitlines(), rel, "generated now", lineterm=""
        )
        pytest.fail(
            f"{rel} is out of date: run `{REGENERATE}` and commit the result.\n"
            + "\n".join(list(diff)[:40])
        )


def test_check_mode_names_stale_files_and_writing_fixes_them(tmp_path, capsys):
    assert gen.main(["--check"], root=tmp_path) == 1  # nothing there: every file is stale
    err = capsys.readouterr().err
    assert "stale: docs/config.md" in err and f"regenerate with: {REGENERATE}" in err
    assert gen.main([], root=tmp_path) == 0
    assert gen.main(["--check"], root=tmp_path) == 0
    (tmp_path / "docs" / "cli.md").write_text("edited by hand\n")
    assert gen.main(["--check"], root=tmp_path) == 1
    assert capsys.readouterr().err.count("stale: ") == 1


# ---- config.md --------------------------------------------------------------------------


def schema_keys() -> list[str]:
    """Every key a config file may set (model: only name and imports; its params are free)."""
    from speedtronic.config.sections import SCALARS, SECTIONS

    keys = [
        f"{section}.{f.name}"
        for section, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if (section, f.name) != ("model", "params")
    ]
    return keys + list(SCALARS)


def test_every_config_key_has_one_line_of_meaning():
    from speedtronic.config.key_docs import CHECKED, DOCS, REFERENCE_DOCS
    from speedtronic.model import ReferenceConfig

    keys = schema_keys()
    assert sorted(DOCS) == sorted(keys), (
        "speedtronic/config/sections.py DOCS must hold exactly one meaning per key: "
        f"missing {sorted(set(keys) - set(DOCS))}, unknown {sorted(set(DOCS) - set(keys))}"
    )
    assert set(CHECKED) <= set(keys), sorted(set(CHECKED) - set(keys))
    assert sorted(REFERENCE_DOCS) == sorted(f.name for f in dataclasses.fields(ReferenceConfig))
    texts = [
        *DOCS.values(),
        *CHECKED.values(),
        *(m for pair in REFERENCE_DOCS.values() for m in pair),
    ]
    assert all(t.strip() and "\n" not in t for t in texts)


def test_checked_rules_name_keys_a_check_really_looks_at():
    """A rule in CHECKED must belong to code that reads that key (a check, or the builder)."""
    from speedtronic.config import build
    from speedtronic.config.key_docs import CHECKED
    from speedtronic.config.sections import SECTIONS

    for key, rule in CHECKED.items():
        section, name = key.split(".")
        cls = SECTIONS[section]
        sources = [inspect.getsource(m) for n, m in vars(cls).items() if "check" in n]
        sources.append(inspect.getsource(build._check_context_length))
        assert any(name in source for source in sources), f"{key}: no check reads it ({rule})"


def test_every_config_key_is_in_config_md():
    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    missing = [key for key in schema_keys() if f"| `{key}` |" not in text]
    assert not missing, f"docs/config.md lacks {missing}: run `{REGENERATE}`"


# ---- cli.md -----------------------------------------------------------------------------


def test_every_command_and_option_is_in_cli_md():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    tree = gen.command_tree()
    assert len(tree) >= 12  # root, train, validate, bench, ckpt x3, data x2, hub x4
    for command, ctx in tree:
        assert f"## `{ctx.command_path}`" in text, f"{ctx.command_path}: run `{REGENERATE}`"
        for param in command.get_params(ctx):
            if param.name != "help" and not getattr(param, "hidden", False):
                names = param.get_help_record(ctx)[0]
                assert f"- `{names}`" in text, f"{ctx.command_path} {names}: run `{REGENERATE}`"


# ---- the completion scripts complete --------------------------------------------------------


def shell(program: str, script: str, shim: Path) -> str:
    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed")
    env = {"PATH": f"{shim}:/usr/bin:/bin", "HOME": str(shim), "TERM": "dumb"}
    done = proc_support.run([program, "-c", script], env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_bash_completion_completes_commands_options_and_choices(shim):
    script = (
        f"source {shlex.quote(str(ROOT / gen.SHELLS['bash']))}\n"
        "tab() { COMP_WORDS=($1); COMP_CWORD=$2; _speedtronic_completion speedtronic; "
        'printf "%s\\n" "${COMPREPLY[@]}"; echo ---; }\n'
        "tab 'speedtronic ck' 1; tab 'speedtronic ckpt inspect --f' 3\n"
        "tab 'speedtronic validate --format' 3\n"
    )
    commands, options, choices, _ = shell("bash", script, shim).split("---\n")
    assert commands.split() == ["ckpt"] and "--format" in options.split()
    assert choices.split() == ["text", "json"]


def test_fish_completion_completes_commands(shim):
    path = shlex.quote(str(ROOT / gen.SHELLS["fish"]))
    out = shell("fish", f"source {path}; complete -C 'speedtronic hub '", shim)
    assert {line.split("\t")[0] for line in out.splitlines()} == {"init", "grant", "status"}


def test_zsh_completion_defines_and_registers_its_function(shim):
    path = shlex.quote(str(ROOT / gen.SHELLS["zsh"]))
    stubs = 'compdef() { print "compdef $*"; }; _arguments() { print "$*"; }; '
    run = "words=(speedtronic da); CURRENT=2; _speedtronic_completion"
    out = shell("zsh", f"{stubs} source {path}; {run}", shim)
    assert "compdef _speedtronic_completion speedtronic" in out and '"data"' in out
    assert (ROOT / gen.SHELLS["zsh"]).read_text().startswith("#compdef speedtronic\n")
