"""boto3 against obstore on the S3 operations the bucket transport makes, on one local server.

Usage::

    python benchmarks/diloco/s3_clients.py                  # 10M-parameter sizes, 5 repeats
    python benchmarks/diloco/s3_clients.py --repeats 10 --delta-mb 20 --weights-mb 40

Both clients talk to the same moto S3 server, run in a child process so that the time this
process spends on the CPU (``time.process_time``) is the client's own: that, and the wall
time, per operation, median of ``--repeats``. The operations are the transport's: a delta
PUT (bf16 of a 10M model, 20 MB), a weights GET (fp32, 40 MB), a LIST of 100 keys, the
pointer's conditional PUT (If-Match), the worker's idle poll (GET If-None-Match: 304) and a
DeleteObjects of 32 keys; plus what importing and building each client costs. obstore is
optional (``pip install obstore``): without it only boto3 is measured. Wall times against a
Python server on a loopback are the server's more than the client's: the CPU column is the
comparison. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

BUCKET = "bench"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIABENCHMARK0000000", "AWS_SECRET_ACCESS_KEY": "b" * 40}
SERVER = "from moto.server import ThreadedMotoServer as S; import logging, sys, time\n"
SERVER += "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
SERVER += "s = S(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False); s.start()\n"
SERVER += "print('ready', flush=True)\nwhile True: time.sleep(60)\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    return proc, f"http://127.0.0.1:{port}"


def measure(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    walls, cpus = [], []
    fn()  # warm: connections, caches
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return {"wall_ms": statistics.median(walls) * 1e3, "cpu_ms": statistics.median(cpus) * 1e3}


def import_cost(statement: str) -> dict[str, float]:
    """Seconds to import and build a client in a fresh interpreter, and the memory it adds (MB,
    resident, over a bare interpreter's; ru_maxrss would count this parent's, as it survives
    exec on Linux)."""
    code = (
        "import time, re; rss = lambda: int(re.search(r'VmRSS:\\s+(\\d+)', "
        "open('/proc/self/status').read()).group(1))\n"
        "r = rss(); t = time.perf_counter()\n"
        f"{statement}\n"
        "print(time.perf_counter() - t, rss() - r)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seconds, rss_kb = out.stdout.split()
    return {"import_s": float(seconds), "rss_mb": int(rss_kb) / 1024}


def boto3_ops(url: str, sizes: dict[str, bytes]) -> dict[str, Callable[[], object]]:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    config = Config(
        s3={"addressing_style": "path"},
        retries={"total_max_attempts": 1},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", config=config)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="b/weights", Body=sizes["weights"])
    for i in range(100):
        s3.put_object(Bucket=BUCKET, Key=f"b/nodes/n{i:03d}/delta_1.safetensors", Body=b"x")
    etag = [s3.put_object(Bucket=BUCKET, Key="b/step_count.json", Body=b"{}")["ETag"]]

    def pointer() -> None:
        etag[0] = s3.put_object(
            Bucket=BUCKET, Key="b/step_count.json", Body=b'{"a": 1}', IfMatch=etag[0]
        )["ETag"]

    def poll() -> None:
        try:
            s3.get_object(Bucket=BUCKET, Key="b/step_count.json", IfNoneMatch=etag[0])
        except ClientError as exc:
            assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 304

    def delete() -> None:
        keys = [f"b/gone/{i}" for i in range(32)]
        s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys]})

    return {
        "put delta": lambda: s3.put_object(Bucket=BUCKET, Key="b/delta", Body=sizes["delta"]),
        "get weights": lambda: s3.get_object(Bucket=BUCKET, Key="b/weights")["Body"].read(),
        "list 100": lambda: s3.list_objects_v2(Bucket=BUCKET, Prefix="b/nodes/"),
        "conditional put": pointer,
        "idle poll (304)": poll,
        "delete 32": delete,
    }


def obstore_ops(url: str, sizes: dict[str, bytes]) -> dict[str, Callable[[], object]]:
    import obstore
    from obstore.exceptions import NotModifiedError
    from obstore.store import S3Store

    store = S3Store(
        BUCKET,
        endpoint=url,
        region="us-east-1",
        virtual_hosted_style_request=False,
        conditional_put="etag",
        client_options={"allow_http": True},
        retry_config={"max_retries": 0},
    )
    obstore.put(store, "o/weights", sizes["weights"], use_multipart=False)
    for i in range(100):
        obstore.put(store, f"o/nodes/n{i:03d}/delta_1.safetensors", b"x")
    etag = [obstore.put(store, "o/step_count.json", b"{}").get("e_tag")]

    def pointer() -> None:
        mode = {"e_tag": etag[0]}
        etag[0] = obstore.put(store, "o/step_count.json", b'{"a": 1}', mode=mode).get("e_tag")

    def poll() -> None:
        try:
            obstore.get(store, "o/step_count.json", options={"if_none_match": etag[0]}).bytes()
        except NotModifiedError:
            pass

    return {
        "put delta": lambda: obstore.put(store, "o/delta", sizes["delta"], use_multipart=False),
        "get weights": lambda: obstore.get(store, "o/weights").bytes(),
        "list 100": lambda: obstore.list(store, "o/nodes/").collect(),
        "conditional put": pointer,
        "idle poll (304)": poll,
        "delete 32": lambda: obstore.delete(store, [f"o/gone/{i}" for i in range(32)]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--delta-mb", type=float, default=20.0)
    parser.add_argument("--weights-mb", type=float, default=40.0)
    args = parser.parse_args()
    os.environ.update(CREDENTIALS)
    sizes = {
        "delta": os.urandom(int(args.delta_mb * 1e6)),
        "weights": os.urandom(int(args.weights_mb * 1e6)),
    }
    clients = {"boto3": (boto3_ops, "import boto3; boto3.client('s3', region_name='us-east-1')")}
    try:
        import obstore  # noqa: F401
    except ImportError:
        print("obstore is not installed: measuring boto3 only", file=sys.stderr)
    else:
        clients["obstore"] = (
            obstore_ops,
            "from obstore.store import S3Store; S3Store('b', region='us-east-1')",
        )
    server, url = start_server()
    results: dict[str, dict] = {}
    try:
        for name, (build, statement) in clients.items():
            ops = build(url, sizes)
            results[name] = {op: measure(fn, args.repeats) for op, fn in ops.items()}
            results[name]["import and build"] = import_cost(statement)
    finally:
        server.terminate()
        server.wait()
    print_table(results)
    print(json.dumps({"benchmark": "s3_clients", "repeats": args.repeats, "results": results}))
    return 0


def print_table(results: dict[str, dict]) -> None:
    names = list(results)
    ops = [op for op in results[names[0]] if op != "import and build"]
    print(f"{'operation':<18}" + "".join(f"{n + ' wall/cpu ms':>26}" for n in names))
    for op in ops:
        cells = [
            f"{results[n][op]['wall_ms']:>12.1f} / {results[n][op]['cpu_ms']:<10.1f}" for n in names
        ]
        print(f"{op:<18}" + "".join(f"{c:>26}" for c in cells))
    build = [results[n]["import and build"] for n in names]
    cells = [f"{b['import_s']:.2f} s, +{b['rss_mb']:.0f} MB" for b in build]
    print(f"{'import + build':<18}" + "".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
