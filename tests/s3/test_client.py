"""S3Client against moto's S3 server through the fault proxy: every operation, what it costs in
requests, each fault (500, 503 SlowDown, dropped connections, a PUT applied with its answer lost,
a hung server), the permanent failures (403, no bucket, no credentials) in one line, and the
credentials kept out of every message. Back-off sleeps are skipped, so nothing waits for real.
"""

from __future__ import annotations

import time

import boto3
import pytest
from s3_proxy import DROP, LOST, STALL
from s3_support import ACCESS_KEY, SECRET_KEY, fresh_bucket, running_store

from speedtronic.distributed.s3.client import S3Client, resolve_endpoint
from speedtronic.distributed.s3.errors import NOT_MODIFIED, PreconditionFailed, S3Error
from speedtronic.errors import ConfigError, TransportError

PATH = "nodes/a/delta_00000001.safetensors"


@pytest.fixture(scope="module")
def s3_store():
    yield from running_store()


@pytest.fixture
def bucket(s3_store):
    yield from fresh_bucket(s3_store)


def test_each_operation_is_one_request_and_paths_stay_under_the_prefix(s3_store, bucket):
    client = s3_store.client(bucket, "team/run-1")
    etag = client.put(PATH, b"delta")
    assert s3_store.keys(bucket) == {f"team/run-1/{PATH}": b"delta"}
    got = client.get(PATH, 100)
    assert (got.data, got.etag) == (b"delta", etag)
    assert client.get("nodes/a/missing", 100) is None
    [listed] = client.list("nodes")
    assert (listed.path, listed.size, listed.etag) == (PATH, 5, etag)
    assert client.delete([PATH, "nodes/never-there"]) == []
    assert client.list("nodes") == []
    counts = client.counter.snapshot()
    assert counts["s3_put"] == 1 and counts["s3_get"] == 2
    assert counts["s3_list"] == 2 and counts["s3_delete"] == 1
    assert counts["s3_requests"] == 6 and counts["s3_retries"] == 0
    assert counts["s3_bytes_up"] == 5 and counts["s3_bytes_down"] == 5


def test_a_listing_reads_every_page(s3_store, bucket, monkeypatch):
    client = s3_store.client(bucket)
    for i in range(5):
        client.put(f"nodes/a/delta_{i}.safetensors", b"x")
    monkeypatch.setattr(client, "LIST_PAGE", 2)
    assert [x.path.rsplit("/", 1)[1] for x in client.list("nodes")] == [
        f"delta_{i}.safetensors" for i in range(5)
    ]
    assert client.counter.requests("list") == 3


def test_conditional_requests(s3_store, bucket):
    client = s3_store.client(bucket)
    first = client.put("global/step_count.json", b"1", if_none_match="*")
    with pytest.raises(PreconditionFailed):
        client.put("global/step_count.json", b"2", if_none_match="*")
    with pytest.raises(PreconditionFailed):
        client.put("global/step_count.json", b"2", if_match='"0123"')
    second = client.put("global/step_count.json", b"2", if_match=first)
    assert client.get("global/step_count.json", 10, if_none_match=second) is NOT_MODIFIED
    with pytest.raises(PreconditionFailed):
        client.get("global/step_count.json", 10, if_match=first)


@pytest.mark.parametrize("kind", [500, 503, DROP, LOST])
def test_transient_faults_are_retried_and_every_attempt_counted(s3_store, bucket, kind):
    client = s3_store.client(bucket)
    s3_store.proxy.plan.add(kind, method="PUT", times=2)
    client.put(PATH, b"delta")
    assert s3_store.keys(bucket) == {f"run/{PATH}": b"delta"}
    counts = client.counter.snapshot()
    assert counts["s3_put"] == 3 and counts["s3_retries"] == 2


def test_reads_and_listings_survive_faults_too(s3_store, bucket):
    client = s3_store.client(bucket)
    client.put(PATH, b"delta")
    s3_store.proxy.plan.add(503, method="GET", times=1)
    s3_store.proxy.plan.add(DROP, method="GET", times=1)
    assert client.get(PATH, 100).data == b"delta"
    assert [x.path for x in client.list("nodes")] == [PATH]
    assert client.counter.requests("get") + client.counter.requests("list") == 4


def test_a_put_whose_every_answer_is_lost_may_have_landed(s3_store, bucket):
    client = s3_store.client(bucket, max_attempts=3)
    s3_store.proxy.plan.add(LOST, method="PUT", times=3)
    with pytest.raises(S3Error) as info:
        client.put(PATH, b"delta")
    assert info.value.maybe_landed and not info.value.permanent
    assert s3_store.keys(bucket) == {f"run/{PATH}": b"delta"}  # it did land, once
    assert "gave up after 3 attempts" in str(info.value)


def test_a_put_refused_every_time_did_not_land(s3_store, bucket):
    client = s3_store.client(bucket, max_attempts=2)
    s3_store.proxy.plan.add(503, method="PUT", times=2)
    with pytest.raises(S3Error) as info:
        client.put(PATH, b"delta")
    assert not info.value.maybe_landed  # SlowDown: refused before doing anything
    assert s3_store.keys(bucket) == {}


def test_a_conditional_put_that_meets_its_own_lost_write_says_so(s3_store, bucket):
    client = s3_store.client(bucket)
    s3_store.proxy.plan.add(LOST, method="PUT", times=1)
    with pytest.raises(PreconditionFailed) as info:
        client.put("global/step_count.json", b"1", if_none_match="*")
    assert info.value.after_lost  # the caller looks: the object there is its own write


def test_403_is_permanent_one_line_and_not_retried(s3_store, bucket):
    client = s3_store.client(bucket, node_id="worker-1")
    s3_store.proxy.plan.add(403, method="PUT")
    with pytest.raises(S3Error) as info:
        client.put(PATH, b"delta")
    message = str(info.value)
    assert info.value.permanent and info.value.status == 403
    assert message.startswith(f"worker-1: cannot write s3://{bucket}/run/{PATH} (403): ")
    assert "AccessDenied" in message and "\n" not in message
    assert client.counter.requests("put") == 1


def test_a_missing_bucket_is_permanent(s3_store):
    client = s3_store.client("no-such-bucket")
    assert client.bucket_exists() is False
    with pytest.raises(S3Error) as info:
        client.put(PATH, b"x")
    assert info.value.permanent and "no such bucket at http://127.0.0.1:" in str(info.value)


def test_an_oversize_object_is_refused_before_its_body_is_read(s3_store, bucket):
    client = s3_store.client(bucket)
    client.put(PATH, b"x" * 5000)
    with pytest.raises(S3Error, match="5000 bytes, over the 100 byte cap") as info:
        client.get(PATH, 100)
    assert not info.value.permanent  # a bad file, not a bad node
    assert client.counter.snapshot()["s3_bytes_down"] == 0


def test_a_hung_server_raises_within_the_timeouts(s3_store, bucket):
    client = s3_store.client(bucket, timeout_s=0.5, max_attempts=2)
    s3_store.proxy.plan.add(STALL, method="GET", times=2, delay_s=30)
    began = time.monotonic()
    with pytest.raises(S3Error, match=r"\(no answer\): the store has answered no request since"):
        client.get(PATH, 100)
    assert time.monotonic() - began < 5


def test_I5_issue27_5_a_silent_store_is_not_asked_again_until_a_probe_hears_it(s3_store, bucket):
    """A store that accepts and never answers cost each attempt its read timeout: 8 of 60 s
    before a worker's training started. Once silent, requests fail at once (no request sent)
    until the cool-down, then one HEAD asks whether it answers again."""
    client = s3_store.client(bucket, timeout_s=0.5, max_attempts=8)
    s3_store.proxy.plan.add(STALL, method="GET", times=1, delay_s=30)
    began = time.monotonic()
    with pytest.raises(S3Error, match="has answered no request since") as info:
        client.get(PATH, 100)  # one read timeout, not eight
    assert not info.value.permanent and time.monotonic() - began < 5
    sent = s3_store.proxy.count()
    with pytest.raises(S3Error, match="has answered no request since"):
        client.list("nodes")
    assert s3_store.proxy.count() == sent  # refused here, nothing sent
    client.silence.clock = lambda: time.monotonic() + 60  # the cool-down is over
    assert client.get(PATH, 100) is None  # a HEAD heard the store: the request goes
    assert s3_store.proxy.count("HEAD") == 1 and client.silence.since is None


def test_no_credentials_is_permanent_with_the_fix(s3_store, bucket, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    client = s3_store.client(bucket, session=boto3.session.Session())  # finds none
    with pytest.raises(S3Error) as info:
        client.list("nodes")
    assert info.value.permanent and "set AWS_ACCESS_KEY_ID" in str(info.value)
    assert s3_store.proxy.count() == 0  # refused before sending anything


def test_credentials_are_scrubbed_from_every_message(s3_store, bucket):
    client = s3_store.client(bucket)
    leak = f"key {ACCESS_KEY} secret {SECRET_KEY}"
    s3_store.proxy.plan.add(403, method="PUT", message=leak)
    with pytest.raises(TransportError) as info:
        client.put(PATH, b"x")
    assert SECRET_KEY not in str(info.value) and ACCESS_KEY not in str(info.value)
    assert "<secret>" in str(info.value)
    assert SECRET_KEY not in repr(client)


def test_the_endpoint_comes_from_the_config_then_the_environment(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio.lan:9000")
    assert resolve_endpoint(None) == "http://minio.lan:9000"
    assert resolve_endpoint("https://s3.hf.co/my-org") == "https://s3.hf.co/my-org"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://user:pw@minio.lan")
    with pytest.raises(ConfigError, match=r"^\$AWS_ENDPOINT_URL: must not hold a user"):
        resolve_endpoint(None)


def test_a_client_is_built_without_a_request(s3_store, bucket):
    S3Client(bucket, "run", endpoint_url=s3_store.url)
    assert s3_store.proxy.count() == 0
