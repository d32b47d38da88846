"""A real S3 implementation for tests: moto's server on a free port, behind a `FaultProxy`.

`S3Store` starts `moto.server.ThreadedMotoServer` (moto's own server mode: real S3 request
parsing, ETags, conditional writes, ListObjectsV2 paging) and a fault proxy in front of it. The
code under test talks to the proxy (`S3Client(endpoint_url=store.url)`); the test itself reads
and plants objects straight on moto (`store.raw`), so its own requests are neither faulted nor
counted. `running_store` backs a module's store fixture, `fresh_bucket` a test's bucket.
Credentials are fake and set in the environment, as a user would set real ones.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator

import boto3
from botocore.config import Config
from s3_proxy import FaultProxy, wait_for_port

from speedtronic.distributed.s3.client import S3Client

ACCESS_KEY = "AKIASPEEDTRONICTEST1"
SECRET_KEY = "speedtronicTestSecretKey0123456789abcdef"
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # no credential lookups on the network
}
_names = itertools.count()


class S3Store:
    """moto's server and a fault proxy in front of it, both on threads of this process."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self.moto_url = f"http://{host}:{port}"
        wait_for_port(self.moto_url)
        self.proxy = FaultProxy(self.moto_url).start()
        self.url = self.proxy.url
        # One session for the module's clients: a new one loads S3's API model again (~0.1 s)
        self.session = boto3.session.Session()
        self.raw = boto3.client(
            "s3",
            endpoint_url=self.moto_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
        )

    def close(self) -> None:
        self.proxy.close()
        self._moto.stop()

    def new_bucket(self) -> str:
        name = f"run-{next(_names):04d}"
        self.raw.create_bucket(Bucket=name)
        return name

    def client(self, bucket: str, prefix: str = "run", node_id: str = "", **kwargs) -> S3Client:
        """A client through the proxy, retrying at once (tests must not sleep)."""
        options = {"max_attempts": 4, "timeout_s": 5.0, "sleep": lambda s: None, **kwargs}
        options.setdefault("session", self.session)
        return S3Client(bucket, prefix, endpoint_url=self.url, node_id=node_id, **options)

    def keys(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object in the bucket under ``prefix``, straight from moto."""
        pages = self.raw.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        keys = [item["Key"] for page in pages for item in page.get("Contents") or []]
        found = {}
        for key in keys:  # the nodes may delete what was just listed (a probe, a delta)
            try:
                found[key] = self.raw.get_object(Bucket=bucket, Key=key)["Body"].read()
            except self.raw.exceptions.NoSuchKey:
                continue
        return found

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.raw.put_object(Bucket=bucket, Key=key, Body=data)


def running_store() -> Iterator[S3Store]:
    """For a module's fixture: a store, with fake credentials in the environment meanwhile."""
    cleared = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN")
    saved = {k: os.environ.get(k) for k in (*FAKE_ENV, *cleared)}
    os.environ.update(FAKE_ENV)
    for name in cleared:
        os.environ.pop(name, None)
    store = S3Store()
    try:
        yield store
    finally:
        store.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def fresh_bucket(store: S3Store) -> Iterator[str]:
    """For a test's fixture: a new bucket, and a proxy with no faults planned or recorded."""
    store.proxy.reset()
    yield store.new_bucket()
    store.proxy.reset()
