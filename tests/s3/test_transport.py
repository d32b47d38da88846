"""S3Transport against moto's S3 server through the fault proxy: what the contract suite cannot
say through the interface. What an idle poll and a publish cost in requests; the layout (weights
under their own key, the pointer, superseded weights and consumed deltas deleted); a lost answer
on the pointer write; a store that ignores conditional writes; the start-up checks (a missing
bucket, refused credentials, a store down at start); and the composition root's ``s3://``.
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys

import diloco_support
import pytest
from s3_proxy import LOST
from s3_support import fresh_bucket, running_store

from speedtronic.config import SpeedtronicConfig
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, STEP_COUNT, delta_path
from speedtronic.distributed.repos import open_transport
from speedtronic.distributed.s3.transport import S3Transport
from speedtronic.errors import ConfigError, TransportError

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def s3_store():
    yield from running_store()


@pytest.fixture
def bucket(s3_store):
    yield from fresh_bucket(s3_store)


def node(store, bucket: str, name: str, **options) -> S3Transport:
    return S3Transport(store.client(bucket, node_id=name, **options))


class Log(diloco_support.Log):
    """The test logger, keeping notices too (a master says when it created the bucket)."""

    def __init__(self):
        super().__init__()
        self.notices = []

    def notice(self, message):
        self.notices.append(message)


class Settings:
    def __init__(self, role: str):
        self.role = role


def step(n: int) -> dict:
    return {"outer_step": n, "format": 1, "updated_at": f"2026-01-01T00:00:{n:02d}Z"}


def requests(transport: S3Transport) -> dict[str, int]:
    operations = ("put", "get", "list", "delete", "head_bucket", "create_bucket")
    counts = transport.client.counter.snapshot()
    return {op: counts[f"s3_{op}"] for op in operations if counts[f"s3_{op}"]}


# ---------------------------------------------------------------------- what polls cost


def test_an_idle_master_poll_is_one_list_and_an_idle_worker_poll_one_get_without_a_body(
    s3_store, bucket
):
    master, worker = node(s3_store, bucket, "master"), node(s3_store, bucket, "worker-1")
    master.read_step_count()
    master.publish(b"weights 0", step(0), [])
    worker.upload(delta_path("worker-1", 1), b"delta")
    assert worker.read_step_count()["outer_step"] == 0
    before_master, before_worker = requests(master), requests(worker)
    bytes_down = worker.stats()["s3_bytes_down"]
    for _ in range(3):
        master.list_deltas()
        assert worker.read_step_count()["outer_step"] == 0  # 304: the cached value
    assert requests(master)["list"] - before_master.get("list", 0) == 3
    assert requests(worker)["get"] - before_worker["get"] == 3
    assert worker.stats()["s3_bytes_down"] == bytes_down  # no body came


def test_a_publish_is_three_requests_and_keeps_two_globals(s3_store, bucket):
    master = node(s3_store, bucket, "master")
    worker = node(s3_store, bucket, "worker-1")
    master.read_step_count()
    master.publish(b"weights 0", step(0), [])  # + one LIST of global/weights/: once
    assert requests(master) == {"get": 1, "list": 1, "put": 2}
    for n in range(1, 4):
        worker.upload(delta_path("worker-1", n), b"delta %d" % n)
        before = requests(master)
        master.publish(b"weights %d" % n, step(n), [delta_path("worker-1", n)])
        spent = {k: v - before.get(k, 0) for k, v in requests(master).items()}
        assert {k: v for k, v in spent.items() if v} == {"put": 2, "delete": 1}
    keys = s3_store.keys(bucket, "run/")
    counted = json.loads(keys[f"run/{STEP_COUNT}"])
    sha = counted["weights_sha256"]
    assert counted["weights_key"] == f"global/weights/{3:012d}-{sha[:16]}.safetensors"
    weights = sorted(k for k in keys if "/global/weights/" in k)
    assert len(weights) == 2 and keys[weights[-1]] == b"weights 3"  # this one and the last
    assert not [k for k in keys if "/nodes/" in k]  # consumed deltas are gone
    assert master.stats()["s3_deleted"] == 3 + 2  # three deltas, two superseded globals


def test_a_lost_answer_to_the_pointer_write_is_found_to_be_ours(s3_store, bucket):
    master = node(s3_store, bucket, "master")
    master.read_step_count()
    master.publish(b"weights 0", step(0), [])
    s3_store.proxy.plan.add(LOST, method="PUT", path_re="step_count")
    master.publish(b"weights 1", step(1), [])  # 412 on its own write, read, recognised
    assert master.stats()["s3_publish_conflicts"] == 1
    master.publish(b"weights 2", step(2), [])
    assert json.loads(s3_store.keys(bucket, "run/")[f"run/{STEP_COUNT}"])["outer_step"] == 2


def test_a_stranger_weights_object_or_a_damaged_step_count_never_stops_a_publish(s3_store, bucket):
    s3_store.put(bucket, f"run/{STEP_COUNT}", b"{not json")
    s3_store.put(bucket, "run/global/weights/README.txt", b"not ours: never deleted")
    master = node(s3_store, bucket, "master")
    with pytest.raises(TransportError, match="step_count.json is not valid JSON"):
        master.read_step_count()
    master.publish(b"weights 1", step(1), [])  # I3: the master restores what is broken
    keys = s3_store.keys(bucket, "run/")
    assert json.loads(keys[f"run/{STEP_COUNT}"])["outer_step"] == 1
    assert "run/global/weights/README.txt" in keys


# ---------------------------------------------------------------------- reads


def test_global_weights_are_checked_against_the_step_count(s3_store, bucket):
    master, worker = node(s3_store, bucket, "master"), node(s3_store, bucket, "worker-1")
    master.read_step_count()
    master.publish(b"weights 1", step(1), [])
    counted = worker.read_step_count()
    s3_store.put(bucket, f"run/{counted['weights_key']}", b"replaced by someone")
    with pytest.raises(TransportError, match="does not match the weights_sha256"):
        worker.read(GLOBAL_WEIGHTS, 1000)


def test_a_step_count_without_weights_key_is_refused_by_name(s3_store, bucket):
    s3_store.put(bucket, f"run/{STEP_COUNT}", json.dumps(step(4)).encode())
    worker = node(s3_store, bucket, "worker-1")
    assert worker.read_step_count()["outer_step"] == 4
    with pytest.raises(TransportError, match="step_count.json names no weights_key"):
        worker.read(GLOBAL_WEIGHTS, 1000)


def test_a_delta_replaced_since_the_listing_is_not_read_under_the_old_version(s3_store, bucket):
    master, path = node(s3_store, bucket, "master"), delta_path("worker-1", 1)
    s3_store.put(bucket, f"run/{path}", b"first")
    [listed] = master.list_deltas()
    s3_store.put(bucket, f"run/{path}", b"second")
    assert master.read(path, 100) is None  # the next listing has the new version
    [again] = master.list_deltas()
    assert again.version != listed.version and master.read(path, 100) == b"second"


# ---------------------------------------------------------------------- conditional writes


def test_a_store_ignoring_conditional_writes_is_found_and_a_second_master_still_seen(
    s3_store, bucket
):
    s3_store.proxy.strip_conditions = True
    first, log = node(s3_store, bucket, "master-a"), Log()
    first.prepare(Settings("master"), log)
    assert first.conditional is False
    assert any("ignores conditional writes" in w for w in log.warnings)
    first.publish(b"weights 1", {**step(1), "master": "a"}, [])
    second = node(s3_store, bucket, "master-b")
    second.conditional = False
    second.publish(b"weights 2", {**step(2), "master": "b"}, [])
    with pytest.raises(TransportError, match="another master published outer step 2"):
        first.publish(b"weights 2", {**step(2), "master": "a"}, [])


def test_a_store_honouring_them_is_found_too(s3_store, bucket):
    master = node(s3_store, bucket, "master")
    master.prepare(Settings("master"), Log())
    assert master.conditional is True
    assert s3_store.keys(bucket) == {}  # the probe object is gone


# ---------------------------------------------------------------------- start-up


def test_a_worker_on_a_missing_bucket_stops_at_start_in_one_line(s3_store):
    worker = node(s3_store, "never-created", "worker-1")
    with pytest.raises(TransportError) as info:
        worker.prepare(Settings("worker"), Log())
    assert info.value.permanent
    assert str(info.value) == (
        f"worker-1: bucket never-created not found at {s3_store.url} (or not visible to these "
        "credentials): create it with speedtronic storage init s3://never-created/run"
    )


def test_a_master_creates_a_missing_bucket(s3_store):
    master, log = node(s3_store, "made-by-master", "master"), Log()
    master.prepare(Settings("master"), log)
    assert any("created the bucket s3://made-by-master/run" in n for n in log.notices)
    assert "made-by-master" in [b["Name"] for b in s3_store.raw.list_buckets()["Buckets"]]


def test_credentials_that_cannot_write_stop_a_node_at_start(s3_store, bucket):
    s3_store.proxy.plan.add(403, method="PUT")
    worker = node(s3_store, bucket, "worker-1")
    with pytest.raises(TransportError) as info:
        worker.prepare(Settings("worker"), Log())
    assert info.value.permanent and "worker-1: cannot write" in str(info.value)
    assert "(403)" in str(info.value) and "\n" not in str(info.value)


def test_a_store_down_at_start_is_a_warning_and_training_goes_on(s3_store, bucket):
    s3_store.proxy.plan.add(503, times=10)
    worker, log = node(s3_store, bucket, "worker-1", max_attempts=2), Log()
    worker.prepare(Settings("worker"), log)
    assert any("could not check s3://" in w and "going on" in w for w in log.warnings)


def test_deletes_that_fail_are_reported_and_tried_again_with_the_next_publish(s3_store, bucket):
    master = node(s3_store, bucket, "master", max_attempts=1)
    master.read_step_count()
    master.publish(b"weights 0", step(0), [])
    s3_store.put(bucket, f"run/{delta_path('w', 1)}", b"d")
    s3_store.proxy.plan.add(500, method="POST", path_re=r"\?delete")
    master.publish(b"weights 1", step(1), [delta_path("w", 1)])
    [warning] = master.take_warnings()
    assert "could not delete 1 object(s)" in warning and master.take_warnings() == []
    master.publish(b"weights 2", step(2), [])
    assert not [k for k in s3_store.keys(bucket, "run/") if "/nodes/" in k]


def test_stats_are_numbers_only(s3_store, bucket):
    stats = node(s3_store, bucket, "a").stats()
    assert stats and all(isinstance(v, int) for v in stats.values())
    assert {"s3_requests", "s3_put", "s3_retries", "s3_publishes"} <= set(stats)


# ---------------------------------------------------------------------- the composition root


def test_open_transport_builds_a_bucket_transport_without_a_request(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("open_transport made a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    settings = SpeedtronicConfig.from_dict(
        {
            "distributed": {
                "node_id": "node-b",
                "repo_id": "s3://my-bucket/runs/one",
                "endpoint_url": "http://minio.lan:9000",
                "min_publish_interval_s": 5,
            }
        }
    ).distributed
    transport = open_transport(settings.repo, settings)
    assert isinstance(transport, S3Transport)
    assert transport.describe() == "s3://my-bucket/runs/one"
    assert transport.client.endpoint_url == "http://minio.lan:9000"
    assert transport.min_publish_interval_s == 5.0 and transport.node_id == "node-b"


def test_open_transport_refuses_a_bad_bucket_as_a_config_error():
    with pytest.raises(ConfigError, match="distributed.repo_id: the bucket 'x' is no bucket"):
        open_transport("s3://x/run")


def test_runs_on_other_transports_never_import_boto3(tmp_path):
    code = (
        "import sys\n"
        "from speedtronic.distributed.repos import open_transport\n"
        f"open_transport({str(tmp_path)!r}).list_deltas()\n"
        "open_transport('my-org/run')\n"
        "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_weights_key_is_content_addressed(s3_store, bucket):
    master = node(s3_store, bucket, "master")
    master.read_step_count()
    master.publish(b"weights 7", step(7), [])
    sha = hashlib.sha256(b"weights 7").hexdigest()
    assert f"run/global/weights/{7:012d}-{sha[:16]}.safetensors" in s3_store.keys(bucket)
