"""An ``s3://`` repo in the config: the bucket, prefix and endpoint rules (one line naming the key,
exit 2), ``weights_key`` in step_count.json, and what ``validate`` says a fleet costs per hour.
Pure config and arithmetic: no server, no boto3 request."""

from __future__ import annotations

import json

import pytest
from cli.test_cli import assert_one_line_error, invoke, write

from speedtronic.config import SpeedtronicConfig
from speedtronic.config.storage import endpoint_url_problem, parse_s3_url
from speedtronic.distributed.protocol import STEP_COUNT, parse_step_count, weights_key
from speedtronic.distributed.s3.costs import fleet_cost
from speedtronic.errors import ConfigError, TransportError


def distributed(**keys):
    return SpeedtronicConfig.from_dict({"distributed": {"enabled": True, **keys}}).distributed


@pytest.mark.parametrize(
    "url, bucket, prefix",
    [
        ("s3://my-bucket", "my-bucket", ""),
        ("s3://my-bucket/", "my-bucket", ""),
        ("s3://my.bucket-1/runs/2026_05/run.a/", "my.bucket-1", "runs/2026_05/run.a"),
        ("s3://HF_Bucket/run", "HF_Bucket", "run"),  # a gateway's bucket name
    ],
)
def test_an_s3_repo_parses_into_bucket_and_prefix(url, bucket, prefix):
    assert parse_s3_url(url) == (bucket, prefix)
    assert distributed(repo_id=url).repo == url


@pytest.mark.parametrize(
    "url, reason",
    [
        ("s3://ab/run", "the bucket 'ab' is no bucket name"),
        ("s3://-bucket/run", "is no bucket name"),
        ("s3://my..bucket/run", "is no bucket name"),
        ("s3://my bucket/run", "is no bucket name"),
        ("s3:///run", "the bucket '' is no bucket name"),
        ("s3://bucket/../etc", "the prefix folder '..' is not allowed"),
        ("s3://bucket/a//b", "the prefix folder '' is not allowed"),
        ("s3://bucket/.hidden", "the prefix folder '.hidden'"),
        ("s3://bucket/a b", "the prefix folder 'a b'"),
        ("s3://bucket/" + "/".join("a" * 17), "at most 16 folders"),
    ],
)
def test_a_bad_s3_repo_is_one_problem_naming_the_key(url, reason):
    with pytest.raises(ConfigError) as info:
        distributed(repo_id=url)
    (problem,) = info.value.problems
    assert problem.startswith("distributed.repo_id: ") and reason in problem
    assert "\n" not in problem


@pytest.mark.parametrize(
    "url",
    [
        "https://s3.amazonaws.com",
        "http://192.168.1.20:9000",
        "https://s3.hf.co/my-org",
        "http://[::1]:9000",
    ],
)
def test_endpoint_urls_that_are_accepted(url):
    assert endpoint_url_problem(url) is None
    assert distributed(repo_id="s3://bucket/run", endpoint_url=url).endpoint_url == url


@pytest.mark.parametrize(
    "url, reason",
    [
        ("minio.lan:9000", "must start with https://"),
        ("ftp://minio.lan", "must start with https://"),
        ("https://key:secret@minio.lan", "must not hold a user or password"),
        ("https://minio.lan/?x=1", "no query or fragment"),
        ("https://", "must name a host"),
        ("https://minio.lan:99999", "is no URL"),
        ("https://minio.lan\n", "printable URL"),
    ],
)
def test_a_bad_endpoint_url_is_one_problem_naming_the_key(url, reason):
    with pytest.raises(ConfigError) as info:
        distributed(repo_id="s3://bucket/run", endpoint_url=url)
    (problem,) = info.value.problems
    assert problem.startswith("distributed.endpoint_url: ") and reason in problem
    assert "secret" not in problem  # a URL with credentials is not echoed


def test_an_endpoint_url_is_only_for_a_bucket():
    with pytest.raises(ConfigError, match="distributed.endpoint_url: only for an s3:// repo_id"):
        distributed(repo_id="my-org/run", endpoint_url="http://minio.lan:9000")


def test_the_cli_refuses_a_bad_bucket_in_one_line_with_exit_2(tiny, tmp_path):
    result = invoke(
        "validate",
        "-c",
        write(tmp_path, tiny),
        "--set",
        "distributed.enabled=true",
        "--set",
        'distributed.repo_id="s3://Not..A.Bucket/run"',
    )
    assert_one_line_error(result, "distributed.repo_id: the bucket 'Not..A.Bucket'")


# ---------------------------------------------------------------------- step_count.json


def test_weights_key_names_the_step_and_the_content():
    sha = "0123456789abcdef" * 4
    assert weights_key(12, sha) == "global/weights/000000000012-0123456789abcdef.safetensors"
    assert weights_key(10**13, sha).startswith("global/weights/10000000000000-")
    with pytest.raises(ValueError):
        weights_key(1, "NOT-HEX")
    key = weights_key(3, sha)
    assert parse_step_count(json.dumps({"outer_step": 3, "weights_key": key}).encode()) == {
        "outer_step": 3,
        "weights_key": key,
    }


@pytest.mark.parametrize(
    "key",
    [
        "global/latest.safetensors",
        "global/weights/../../x.safetensors",
        "global/weights/12-0123456789abcdef.safetensors",  # fewer than 12 digits
        "global/weights/000000000012-0123456789ABCDEF.safetensors",
        "global/weights/000000000012-0123456789abcdef.bin",
        "/global/weights/000000000012-0123456789abcdef.safetensors",
        12,
        None,
    ],
)
def test_a_bad_weights_key_is_refused_naming_the_file_and_field(key):
    with pytest.raises(TransportError) as info:
        parse_step_count(json.dumps({"outer_step": 3, "weights_key": key}).encode())
    assert str(info.value).startswith(f"{STEP_COUNT}: weights_key ")


# ---------------------------------------------------------------------- what a fleet costs


def test_the_fleet_cost_adds_up_by_role():
    cost = fleet_cost(
        workers=4,
        inner_steps=100,
        step_time_s=1.0,  # a delta every 100 s per worker: 36 an hour each, 144 in all
        poll_interval_s=30,  # 120 polls an hour
        min_publish_interval_s=60,  # at most 60 publishes an hour
        min_deltas=2,
        delta_bytes=1000,
        weights_bytes=4000,
    )
    assert cost.deltas == 144 and cost.publishes == 60
    assert cost.worker_requests == 36 + 120 + 60  # uploads, polls, one more GET per global
    assert cost.master_requests == 120 + 144 + 60 * 3  # lists, delta GETs, publishes
    assert cost.requests == cost.master_requests + 4 * cost.worker_requests
    assert cost.bytes_up == 144 * 1000 + 60 * 4000
    assert cost.bytes_down == 144 * 1000 + 4 * 60 * 4000


def test_validate_shows_what_the_fleet_costs_a_bucket_and_the_hub(tiny, tmp_path):
    base = ["validate", "-c", write(tmp_path, tiny), "--format", "json", "--nodes", "32"]
    base += ["--step-time", "0.06", "--set", "distributed.enabled=true"]
    bucket = json.loads(invoke(*base, "--set", 'distributed.repo_id="s3://b-1/run"').stdout)
    facts = bucket["facts"]
    assert facts["diloco_bucket"]["workers"] == 32 and facts["diloco_bucket"]["requests"] > 0
    assert "requests/hour" in facts["diloco_bucket_per_hour"]
    assert "a Hub repo takes about 128" in facts["diloco_hub_commits_per_hour"]
    hub = json.loads(invoke(*base, "--set", "distributed.repo_id=my-org/run").stdout)["facts"]
    assert "diloco_hub_commits_per_hour" in hub and "diloco_bucket" not in hub
    local = json.loads(invoke(*base, "--set", f"distributed.repo_id={tmp_path}").stdout)
    assert not [k for k in local["facts"] if k.startswith(("diloco_hub", "diloco_bucket"))]


def test_a_fleet_on_round_records_downloads_the_others_deltas_not_the_publish():
    settings = dict(workers=4, inner_steps=100, step_time_s=1.0, poll_interval_s=30)
    settings.update(min_publish_interval_s=60, min_deltas=2, delta_bytes=1000)
    cost = fleet_cost(**settings, weights_bytes=400, fetch_bytes=3000)  # issue 54
    assert cost.bytes_up == 144 * 1000 + 60 * 400  # the master: the record, a keyframe share
    assert cost.bytes_down == 144 * 1000 + 4 * 60 * 3000


def test_validate_prices_a_bucket_fleet_on_round_records(tiny, tmp_path):
    base = ["validate", "-c", write(tmp_path, tiny), "--format", "json", "--nodes", "4"]
    base += ["--set", "distributed.enabled=true", "--set", 'distributed.repo_id="s3://b-1/run"']
    facts = json.loads(invoke(*base, "--set", "distributed.global_dtype=deltas").stdout)["facts"]
    cost, delta = facts["diloco_bucket"], facts["diloco_delta_bytes"]["bf16"]
    per_fetch = (cost["bytes_down"] - cost["deltas"] * delta) / (4 * cost["publishes"])
    assert 3 * delta < per_fetch < 3 * delta + 20_000  # the 3 others' deltas and the record
