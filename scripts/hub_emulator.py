"""A local Hugging Face Hub to try ``hf://`` sources and ``--push`` offline (docs/hub.md).

Starts the test suite's Hub emulator (tests/hub_emulator.py: the API huggingface_hub speaks,
Git LFS included) on 127.0.0.1 at a free port, with one user and a write token, and prints the
two lines to paste into another shell:

    export HF_ENDPOINT=http://127.0.0.1:PORT
    export HF_TOKEN=hf_local_...

Everything lives in memory and is gone when it stops (Ctrl-C). ``--dataset OWNER/NAME=DIR``
(repeatable) seeds a dataset repo with a folder's files, for ``data tokenize
hf://datasets/OWNER/NAME``; ``--env-file F`` also writes the lines to F (atomically) for a
script to ``source`` once it appears. The token is a random local one, valid only here.

    python scripts/hub_emulator.py --user your-name --dataset your-name/notes=notes/
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--user", default="your-name", help="the account the token writes as")
    parser.add_argument(
        "--dataset", action="append", default=[], help="OWNER/NAME=DIR: a dataset repo of DIR"
    )
    parser.add_argument("--env-file", help="also write the export lines here")
    return parser.parse_args(argv)


def seed_files(spec: str) -> tuple[str, dict[str, bytes]]:
    """``OWNER/NAME=DIR`` as the repo id and DIR's files by their path inside it."""
    repo_id, sep, folder = spec.partition("=")
    if not sep or repo_id.count("/") != 1 or not Path(folder).is_dir():
        raise SystemExit(f"hub_emulator: error: --dataset {spec!r}: expected OWNER/NAME=DIR")
    root = Path(folder)
    files = {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }
    return repo_id, files


def export_lines(url: str, token: str) -> str:
    return f"export HF_ENDPOINT={url}\nexport HF_TOKEN={token}\n"


def write_env(path: str, text: str) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, 0o600)
    tmp.replace(path)  # atomic: a script waiting for it never reads half


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    datasets = [seed_files(spec) for spec in args.dataset]
    sys.path.insert(0, str(ROOT / "tests"))
    from hub_emulator import HubEmulator

    token = f"hf_local_{secrets.token_hex(12)}"
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    with HubEmulator({token: args.user}) as emu:
        for repo_id, files in datasets:
            emu.add_user(repo_id.split("/")[0])
            emu.create_repo(f"datasets/{repo_id}", files=files)
        lines = export_lines(emu.url, token)
        print(lines, end="", flush=True)
        if args.env_file:
            write_env(args.env_file, lines)
        print("hub emulator: serving (in memory) until Ctrl-C", file=sys.stderr, flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
