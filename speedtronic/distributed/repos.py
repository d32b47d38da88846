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
from speedtronic.distributed.transport import LocalTransport, Transport
from speedtronic.errors import ConfigError
from speedtronic.hub.names import is_hub_repo_id
from speedtronic.hub.names import no_directory_note as no_directory_note  # for the core's setup

# Caps the waits of a node's Hub client between attempts (default 60 s); for tests against a
# local Hub emulator (docs/hub.md), never against the real Hub and its rate-limit resets
MAX_BACKOFF_ENV = "SPEEDTRONIC_HUB_MAX_BACKOFF_S"
REPO_KEY = "distributed.repo_id"
# Kernel and device file systems: a repo there is a typo, and writing to them is harmful
_SYSTEM_DIRS = tuple(Path(p) for p in ("/proc", "/sys", "/dev"))


def open_transport(repo: str, settings: Any = None) -> Transport:
    """A directory path or ``file://`` URL -> LocalTransport; ``s3://bucket/prefix`` ->
    S3Transport; a Hub repo id -> HubTransport.

    ``settings`` (the ``distributed`` config section, or anything with some of its fields:
    node_id, token, cache_dir, min_publish_interval_s, squash_every, endpoint_url) configures
    the Hub and bucket transports. Nothing is contacted here: the first call on the transport
    is the first request. A spec that cannot work is a ConfigError (exit 2) at start
    (``check_repo_spec``).
    """
    kind, target = check_repo_spec(repo)
    if kind == "directory":
        return LocalTransport(target)
    if kind == "s3":
        return _s3_transport(target, settings)
    return _hub_transport(target, settings)


def check_repo_spec(repo: str) -> tuple[str, str]:
    """``(kind, target)`` of a repo spec: ``("directory", path)``, ``("s3", url)`` or
    ``("hub", repo_id)``.

    Refused, in one line naming the key: ``file://`` with no path, the filesystem root or a
    system directory (/proc, /sys, /dev), a path that is a file, a directory this process
    cannot write to (or create), and anything that is neither a path, a bucket nor
    ``owner/name``.
    """
    if is_s3_url(repo):
        return "s3", repo
    if repo.startswith("file://") or is_local_repo(repo):
        raw = repo[len("file://") :] if repo.startswith("file://") else repo
        if not raw.strip():
            raise ConfigError(f"{REPO_KEY}: {repo!r} names no directory (use file:///path/to/repo)")
        return "directory", str(_check_directory(Path(raw).expanduser(), repo))
    if not is_hub_repo_id(repo):
        raise ConfigError(
            f"{REPO_KEY}: {repo!r} is neither a directory nor a Hugging Face Hub repo id "
            "(owner/name), nor a bucket (s3://bucket/prefix); use my-org/my-run, "
            "s3://bucket/run, or a path or file:// URL"
        )
    return "hub", repo


def _check_directory(path: Path, spec: str) -> Path:
    """``path`` if a node can keep a shared repo there; ConfigError naming what is wrong."""
    resolved = path.resolve()
    if resolved == Path(resolved.anchor):
        raise ConfigError(f"{REPO_KEY}: {spec!r} is the filesystem root; give the run a folder")
    if any(resolved.is_relative_to(system) for system in _SYSTEM_DIRS):
        raise ConfigError(f"{REPO_KEY}: {spec!r} is a system directory; give the run a folder")
    if resolved.exists() and not resolved.is_dir():
        raise ConfigError(f"{REPO_KEY}: {spec!r} is a file, not a directory")
    existing = next(p for p in (resolved, *resolved.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "" if existing == resolved else f" (its nearest existing folder {existing})"
        raise ConfigError(f"{REPO_KEY}: {spec!r}{what} is not writable by this process")
    return path


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
    from speedtronic.distributed.hub.transport import HubTransport
    from speedtronic.hub.client import HubClient

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
