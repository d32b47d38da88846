"""``speedtronic storage init`` against moto's S3 server: it creates a missing bucket once, checks
writing and conditional writes, prints the config to paste, looks only with ``--dry-run``, and
fails in one line (exit 1 for the store, 2 for bad usage) without a credential in it."""

from __future__ import annotations

import json

import pytest
from cli.test_cli import assert_one_line_error, invoke
from s3_support import SECRET_KEY, fresh_bucket, running_store

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def s3_store():
    yield from running_store()


@pytest.fixture
def bucket(s3_store):
    yield from fresh_bucket(s3_store)


def buckets(store) -> list[str]:
    return [b["Name"] for b in store.raw.list_buckets()["Buckets"]]


def test_init_creates_the_bucket_once_and_prints_the_config(s3_store, bucket):
    s3_store.proxy.reset()
    first = invoke("storage", "init", "s3://made-by-init/run", "--endpoint-url", s3_store.url)
    assert first.exit_code == 0, first.stderr
    assert first.stdout.startswith(f"s3://made-by-init/run at {s3_store.url}: bucket created")
    assert "writable: yes; conditional writes: yes" in first.stdout
    assert "repo_id: s3://made-by-init/run" in first.stdout
    assert f"endpoint_url: {s3_store.url}" in first.stdout
    assert "made-by-init" in buckets(s3_store) and s3_store.keys("made-by-init") == {}
    again = invoke("storage", "init", "s3://made-by-init/run", "--endpoint-url", s3_store.url)
    assert again.exit_code == 0 and ": bucket exists" in again.stdout


def test_init_as_json(s3_store, bucket):
    result = invoke(
        "storage", "init", f"s3://{bucket}/run", "--endpoint-url", s3_store.url, "--format", "json"
    )
    doc = json.loads(result.stdout)
    assert (doc["existed"], doc["created"], doc["writable"], doc["conditional"]) == (
        True,
        False,
        True,
        True,
    )
    assert doc["config"].startswith("distributed:")


def test_a_dry_run_only_looks(s3_store, bucket):
    result = invoke(
        "storage", "init", "s3://not-made/run", "--endpoint-url", s3_store.url, "--dry-run"
    )
    assert result.exit_code == 0 and "bucket missing" in result.stdout
    assert "would create the bucket not-made" in result.stdout
    assert "not-made" not in buckets(s3_store)
    assert s3_store.proxy.count("PUT") == 0 and s3_store.proxy.count("HEAD") == 1


def test_refused_credentials_are_one_line_and_exit_1(s3_store, bucket):
    s3_store.proxy.plan.add(403, method="PUT", message=f"denied for {SECRET_KEY}")
    result = invoke("storage", "init", f"s3://{bucket}/run", "--endpoint-url", s3_store.url)
    assert_one_line_error(result, f"cannot write s3://{bucket}/run/probes/", "(403)", code=1)
    assert SECRET_KEY not in result.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["s3://x/run"], "the bucket 'x' is no bucket name"),
        (["my-org/run"], "must start with s3://"),
        (["s3://bucket/run", "--endpoint-url", "ftp://x"], "--endpoint-url: must start"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args, needle):
    assert_one_line_error(invoke("storage", "init", *args), needle)


def test_status_shows_a_rounds_bytes_and_the_nodes(s3_store, bucket):
    """Issue 38: the global each node downloads (an update, its keyframe once) and each node's
    newest delta, read from the bucket a master and a worker wrote."""
    from speedtronic.distributed.protocol import delta_path, keyframe_path
    from speedtronic.distributed.s3.transport import S3Transport

    master = S3Transport(s3_store.client(bucket, "run", node_id="master"))
    worker = S3Transport(s3_store.client(bucket, "run", node_id="worker-1"))
    master.read_step_count()
    master.upload(keyframe_path(0, "a" * 64), b"k" * 300)
    count = {"outer_step": 2, "updated_at": "2026-01-01T00:00:00Z", "format": 1}
    master.publish(b"u" * 80, count, [])
    worker.upload(delta_path("worker-1", 1), b"d" * 40)
    worker.upload(delta_path("worker-1", 2), b"e" * 30)
    args = ("storage", "status", f"s3://{bucket}/run", "--endpoint-url", s3_store.url)
    doc = json.loads(invoke(*args, "--format", "json").stdout)
    assert (doc["outer_step"], doc["global_bytes"], doc["keyframe_bytes"]) == (2, 80, 300)
    [node] = doc["nodes"]
    assert (node["node_id"], node["pending_deltas"], node["delta_bytes"]) == ("worker-1", 2, 30)
    text = invoke(*args)
    assert text.exit_code == 0, text.stderr
    assert "each node downloads 80 B (an update; its keyframe 300 B once)" in text.stdout
    assert "worker-1: delta 30 B, 2 pending (70 B)" in text.stdout
