"""What ``export`` does to an OUT that already holds something (issue 35): a README edited by hand
after an earlier export is refused by name and kept, an OUT that is a link is the directory it
points at (the link stays, no ``.tmp-*`` is left), a full disk is one line naming OUT, exit 1,
and every file it writes gets the user's umask (safetensors alone would write 0600).
"""

from __future__ import annotations

import errno
import os

import pytest
from modelout_support import assert_one_line_error, invoke, train_text
from safetensors import SafetensorError

from speedtronic.modelout import export as exporting


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    return train_text(tmp_path_factory.mktemp("export-out"))


def test_a_hand_edited_readme_of_an_earlier_export_is_kept_and_named(byte_run, tmp_path):
    out = tmp_path / "model"
    assert invoke("export", byte_run, out).exit_code == 0
    assert invoke("export", byte_run, out).exit_code == 0  # an untouched export is replaced
    card = out / "README.md"
    edited = card.read_text() + "\nMy own notes on this model.\n"
    card.write_text(edited)
    assert_one_line_error(invoke("export", byte_run, out), f"{card} is not the file", "edited")
    assert card.read_text() == edited
    card.unlink()  # what the message says to do: then the export is replaced again
    assert invoke("export", byte_run, out).exit_code == 0 and card.is_file()


def test_an_out_that_is_a_link_is_the_directory_it_points_at(byte_run, tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    for _ in range(2):  # a new export, then one replacing it, both through the link
        result = invoke("export", byte_run, link)
        assert result.exit_code == 0, result.stderr
        assert link.is_symlink() and (real / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no .tmp-*-old


@pytest.mark.parametrize("where", ["weights", "small files"])
def test_a_full_disk_is_one_line_naming_out(byte_run, tmp_path, monkeypatch, where):
    def full(*args, **kwargs):
        if where == "weights":  # what safetensors raises on ENOSPC
            raise SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(exporting, "save_file" if where == "weights" else "fsync_dir", full)
    out = tmp_path / "model"
    line = assert_one_line_error(invoke("export", byte_run, out), code=1)
    assert f"OUT: could not write {out}" in line and "No space left on device" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind


def test_every_exported_file_gets_the_users_umask(byte_run, tmp_path):
    out = tmp_path / "model"
    old = os.umask(0o027)  # not the usual 022, so a hard-coded 0644 fails too
    try:
        assert invoke("export", byte_run, out).exit_code == 0
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
    assert modes["model.safetensors"] == "0o640"  # safetensors alone wrote 0600
    assert set(modes.values()) == {"0o640"}, modes
