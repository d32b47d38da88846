"""``speedtronic export --push`` (issue 29): a Hub model repo with the export, in one commit.

Against the Hub emulator answering as the Hub does (the real huggingface_hub client, LFS for
``*.safetensors`` on a second storage origin with faults of its own): the repo is created
private unless asked, every file of the export lands in one commit (the weights on the LFS
path, read from disk), a storage or API fault is retried by the one Hub client's policy and the
commit lands once, a refused token is one line and the export stays whole.
"""

# The environment must be set before huggingface_hub is imported, hence:
# ruff: noqa: E402
from __future__ import annotations

import json
import os
import tempfile

os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf_home_"))

import pytest
from modelout_support import assert_one_line_error, invoke, train_text

from speedtronic.hub.client import HubClient
from speedtronic.hub.models import push_folder
from speedtronic.modelout.export import export_files

pytestmark = pytest.mark.hub
EXPORTED = {
    "config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
    "tokenizer_config.json", "README.md", "speedtronic_export.json",
}  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_text(tmp_path_factory.mktemp("push"))


def env_for(emu, token: str | None = None) -> dict[str, str]:
    return {"HF_ENDPOINT": emu.url, "HF_TOKEN": token or emu.token}


def test_push_creates_a_private_model_repo_with_the_export_in_one_commit(
    run, tmp_path, hub_emulator
):
    emu, out = hub_emulator, tmp_path / "hf"
    result = invoke(
        "export", run, out, "--push", "alice/tiny-model", "--format", "json", env=env_for(emu)
    )
    assert result.exit_code == 0, result.stderr
    pushed = json.loads(result.stdout)["pushed"]
    assert pushed["created"] is True and pushed["private"] is True
    repo = emu.repo("alice/tiny-model")
    assert repo.private and [c.title for c in repo.commits][1:] == [
        "Upload model (speedtronic export)"
    ]
    assert set(repo.files) == EXPORTED | {".gitattributes"}
    for name in EXPORTED:
        assert repo.files[name] == (out / name).read_bytes(), name
    assert repo.head.lfs == {"model.safetensors"}  # the weights took the LFS path
    assert pushed["commit"] == repo.head.sha
    card = repo.files["README.md"].decode()
    assert "from_pretrained('alice/tiny-model')" in card  # the card names the repo


def test_public_and_an_existing_repo_keeps_its_visibility(run, tmp_path, hub_emulator):
    emu = hub_emulator
    result = invoke(
        "export", run, tmp_path / "a", "--push", "alice/pub", "--public", env=env_for(emu)
    )
    assert result.exit_code == 0, result.stderr
    assert "pushed to" in result.stdout and "public" in result.stdout
    assert emu.repo("alice/pub").private is False
    emu.create_repo("alice/kept", private=True, files={"notes.md": b"mine"})
    again = invoke(
        "export", run, tmp_path / "b", "--push", "alice/kept", "--public", env=env_for(emu)
    )
    assert again.exit_code == 0, again.stderr
    repo = emu.repo("alice/kept")
    assert repo.private is True and repo.files["notes.md"] == b"mine"  # left alone
    assert EXPORTED <= set(repo.files)


@pytest.mark.parametrize("kind", [500, 503, "timeout", "truncate"])
@pytest.mark.parametrize(
    ("origin", "method", "path_re"),
    [("storage", "PUT", None), ("api", "POST", "/commit/"), ("api", "POST", r"lfs/objects/batch")],
    ids=["storage-put", "commit", "lfs-batch"],
)
def test_a_fault_on_the_way_is_retried_and_the_export_lands_once(
    run, tmp_path, hub_emulator, origin, method, path_re, kind
):
    emu = hub_emulator
    out = tmp_path / "hf"
    assert invoke("export", run, out).exit_code == 0
    plan = emu.storage.faults if origin == "storage" else emu.faults
    plan.add(kind, method=method, path_re=path_re)
    sleeps: list[float] = []
    client = HubClient("alice/faulty", token=emu.token, endpoint=emu.url, sleep=sleeps.append)
    pushed = push_folder(out, export_files(out), "alice/faulty", client=client)
    repo = emu.repo("alice/faulty")
    assert plan.pending() == 0 and len(sleeps) == 1  # the client's policy retried it, once
    assert len(repo.commits) == 2 and pushed.commit == repo.head.sha  # one commit, exactly
    assert repo.files["model.safetensors"] == (out / "model.safetensors").read_bytes()
    assert client.budget.commits(60) == 1


def test_a_refused_token_is_one_line_and_the_export_stays(run, tmp_path, hub_emulator):
    emu = hub_emulator
    emu.add_user("bob", "hf_bob_reads")
    emu.readonly("hf_bob_reads")
    out = tmp_path / "hf"
    result = invoke("export", run, out, "--push", "bob/model", env=env_for(emu, "hf_bob_reads"))
    message = assert_one_line_error(result, "--push", code=1)
    assert "hf_bob_reads" not in result.stderr + result.stdout  # never the token
    assert "403" in message and "the export in" in result.stderr
    assert set(os.listdir(out)) == EXPORTED
    other = invoke("export", run, tmp_path / "o2", "--push", "carol/model", env=env_for(emu))
    assert_one_line_error(other, "--push", code=1)
