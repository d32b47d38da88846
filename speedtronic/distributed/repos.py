"""The one composition root of the transports: from a repo spec to the ``Transport`` serving it.

A directory path or ``file://`` URL is a shared directory (``transport.LocalTransport``);
``s3://bucket/prefix`` is object storage over the S3 API (``s3.transport.S3Transport`` over an
``s3.client.S3Client``); ``owner/name`` is a Hugging Face Hub repo (``hub.transport.HubTransport``
over a ``hub.client.HubClient``). Only this module knows every implementation, and it imports
each inside the function that builds it, so a shared-directory run never loads
``huggingface_hub`` or ``boto3`` and the core (``transport``, ``master``, ``worker``) knows only
the interface. Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from speedtronic.config.storage import is_s3_url, parse_s3_url
from speedtronic.distributed.hub.names import is_hub_repo_id
from speedtronic.distributed.transport import LocalTransport, Transport
from speedtronic.errors import ConfigError, TransportError

# Caps the waits of a node's Hub client between attempts (default 60 s); for tests against a
# local Hub emulator (docs/hub.md), never against the real Hub and its rate-limit resets
MAX_BACKOFF_ENV = "SPEEDTRONIC_HUB_MAX_BACKOFF_S"


def open_transport(repo: str, settings: Any = None) -> Transport:
    """A directory path or ``file://`` URL -> LocalTransport; ``s3://bucket/prefix`` ->
    S3Transport; anything else is a Hub repo id.

    ``settings`` (the ``distributed`` config section, or anything with some of its fields:
    node_id, token, cache_dir, min_publish_interval_s, squash_every, endpoint_url) configures
    the Hub and bucket transports. Nothing is contacted here: the first call on the transport
    is the first request.
    """
    if repo.startswith("file://"):
        return LocalTransport(repo[len("file://") :])
    if is_s3_url(repo):
        return _s3_transport(repo, settings)
    if is_local_repo(repo):
        return LocalTransport(Path(repo).expanduser())
    if not is_hub_repo_id(repo):
        raise TransportError(
            f"{repo!r} is neither a directory nor a Hugging Face Hub repo id (owner/name), nor "
            "a bucket (s3://bucket/prefix)",
            hint="set distributed.repo_id to my-org/my-run, s3://bucket/run, or a path",
        )
    return _hub_transport(repo, settings)


def _setting(settings: Any, name: str, default: Any) -> Any:
    value = getattr(settings, name, None)
    return default if value is None else value


def _s3_transport(repo: str, settings: Any) -> Transport:
    # Imported here so that other runs never load boto3 (an optional extra: [s3])
    try:
        from speedtronic.distributed.s3.client import S3Client
    except ImportError as exc:
        raise ConfigError(
            f"{repo} needs the S3 client, which is not installed ({exc.name} is missing)",
            hint="pip install 'speedtronic[s3]'",
        ) from None
    from speedtronic.distributed.s3.transport import S3Transport

    try:
        bucket, prefix = parse_s3_url(repo)
    except ValueError as exc:
        raise ConfigError(f"distributed.repo_id: {exc} (got {repo[:80]!r})") from None
    node_id = _setting(settings, "node_id", None) or getattr(settings, "resolved_node_id", "")
    client = S3Client(
        bucket, prefix, endpoint_url=_setting(settings, "endpoint_url", None), node_id=node_id
    )
    interval = float(_setting(settings, "min_publish_interval_s", 0.0))
    return S3Transport(client, min_publish_interval_s=interval)


def _hub_transport(repo: str, settings: Any) -> Transport:
    # Imported here so that shared-directory runs never load huggingface_hub
    from speedtronic.distributed.hub.client import HubClient
    from speedtronic.distributed.hub.transport import HubTransport

    def setting(name: str, default: Any) -> Any:
        value = getattr(settings, name, None)
        return default if value is None else value

    backoff = hub_max_backoff_s()
    client = HubClient(
        repo,
        token=setting("token", None),
        node_id=setting("node_id", None) or getattr(settings, "resolved_node_id", ""),
        cache_dir=setting("cache_dir", None),
        **({} if backoff is None else {"max_backoff_s": backoff}),
    )
    return HubTransport(
        client,
        min_publish_interval_s=float(setting("min_publish_interval_s", 60.0)),
        squash_every=int(setting("squash_every", 0)),
    )


def hub_max_backoff_s() -> float | None:
    """``$SPEEDTRONIC_HUB_MAX_BACKOFF_S`` in seconds, None when unset."""
    raw = os.environ.get(MAX_BACKOFF_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise ConfigError(f"{MAX_BACKOFF_ENV}: must be seconds in (0, 3600] (got {raw[:40]!r})")
    return value


def is_local_repo(repo: str) -> bool:
    """Paths start with '/', '.', '~' or 'file://', or name an existing directory."""
    return repo.startswith(("/", ".", "~", "file://")) or Path(repo).is_dir()
