"""A Hub endpoint that accepts connections and never answers stalls no node (I5, issue 27's
defect 5 on the Hub): until the Hub has answered once, a request waits at most
``FIRST_ANSWER_TIMEOUT_S`` and a call ``FIRST_ANSWER_DEADLINE_S`` for all its attempts, so a
node's start-up check says so in one line within seconds and training starts; once it has
answered, the client's own timeout holds and no call retries past ``deadline_s``."""

from __future__ import annotations

import socket
import time

import proc_support
import pytest
from diloco.test_e2e import log_of, wait_until
from hub_emulator import HubEmulator

from hub.test_e2e import TOKEN, events, start
from speedtronic.hub import policy as hub_policy
from speedtronic.hub.client import HubClient
from speedtronic.hub.errors import HubError


@pytest.fixture
def silent_url():
    """A server that accepts every connection (the kernel's backlog) and never answers one."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def client_of(url: str, tmp_path, **options) -> HubClient:
    return HubClient("alice/run", token=TOKEN, endpoint=url, cache_dir=tmp_path, **options)


def test_before_the_hub_has_answered_a_call_gives_up_by_its_deadline(
    silent_url, tmp_path, monkeypatch
):
    """On main: 8 attempts of the 60 s timeout, plus backoff (about 10 minutes), in silence."""
    monkeypatch.setattr(hub_policy, "FIRST_ANSWER_TIMEOUT_S", 0.3)
    monkeypatch.setattr(hub_policy, "FIRST_ANSWER_DEADLINE_S", 1.0)
    client = client_of(silent_url, tmp_path, max_backoff_s=0.2)
    began = time.monotonic()
    with pytest.raises(HubError, match=r"gave up after \d attempts in \d+ s\)") as info:
        client.visibility()
    # attempts stop at the deadline (plus one attempt's timeout): far below even one 60 s wait
    assert time.monotonic() - began < 30 and "\n" not in str(info.value)
    assert not client.policy.answered
    with pytest.raises(HubError, match=r"gave up after 1 attempt in"):
        client.head()  # the next call, while the Hub is still silent: one attempt


def test_once_the_hub_has_answered_the_clients_own_timeout_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(hub_policy, "FIRST_ANSWER_TIMEOUT_S", 0.3)
    with HubEmulator({TOKEN: "alice"}) as emulator:
        client = client_of(emulator.url, tmp_path)
        assert client.policy.request_timeout_s() == 0.3
        client.whoami()
        assert client.policy.answered and client.policy.request_timeout_s() == client.timeout_s


def test_a_call_never_retries_past_its_deadline(silent_url, tmp_path, monkeypatch):
    monkeypatch.setattr(hub_policy, "FIRST_ANSWER_TIMEOUT_S", 0.3)
    client = client_of(silent_url, tmp_path, max_backoff_s=0.1, timeout_s=0.3, max_attempts=50)
    client.policy.answered, client.policy.deadline_s = True, 1.5  # heard before, silent now
    with pytest.raises(HubError, match=r"gave up after (\d+) attempts in") as info:
        client.head()
    tries = int(str(info.value).split("gave up after ")[1].split()[0])
    assert 2 <= tries < 50


@pytest.mark.slow
def test_I5_a_worker_on_a_hub_that_never_answers_trains_at_once(tmp_path, silent_url):
    """On main: nothing printed and no training step after 4 minutes (the start-up check in
    the training thread, retrying a 60 s read timeout 8 times)."""
    began = time.monotonic()
    worker = start(tmp_path, silent_url, "worker", "worker-1", 20, upload_timeout_s=1.0)
    said = wait_until(lambda: "could not check" in log_of(tmp_path, "worker-1"), watch=worker)
    first_line_s = time.monotonic() - began
    assert said, log_of(tmp_path, "worker-1")
    assert proc_support.wait(worker) == 1, log_of(tmp_path, "worker-1")
    # it trained, but nothing of it reached the run: exit 1 with the line (issue 55 item 8)
    assert "never reached" in log_of(tmp_path, "worker-1"), log_of(tmp_path, "worker-1")
    wall_s = time.monotonic() - began
    text = (tmp_path / "worker-1.log").read_text()
    assert "Traceback" not in text, text[-3000:]
    steps = [e["step"] for e in events(tmp_path, "worker-1", "train_step")]
    assert steps and max(steps) == 20, text[-3000:]
    # the interpreter's start plus the 12 s deadline: bounds that hold on a loaded machine too
    assert first_line_s < 180 and wall_s < 400, (first_line_s, wall_s)
    print(f"\nsilent Hub: first line after {first_line_s:.1f} s, 20 steps in {wall_s:.1f} s")
