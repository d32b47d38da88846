"""What a node does with its Hub repo before training, so what cannot work fails at start.

``prepare_node``: a master creates a missing repo (private, as ``hub init``) and attempts the
grants in ``collaborators``; every node checks that its token can write, so a refusal is one
line at start rather than after an inner loop. A Hub that is down for now is only a warning:
training starts anyway and the transport retries later (I5). No torch here.
"""

from __future__ import annotations

from typing import Any

from speedtronic.distributed.hub.admin import grant, init_repo
from speedtronic.errors import TransportError
from speedtronic.hub.access import write_access_problem
from speedtronic.hub.errors import HubError, RepoNotFound
from speedtronic.hub.names import no_directory_note


def prepare_node(client: Any, settings: Any, logger: Any) -> None:
    """Check (and for a master, create) ``client``'s repo for the node ``settings`` describe."""
    who, repo_id = (f"{client.node_id}: " if client.node_id else ""), client.repo_id
    try:
        if client.visibility() is None:
            if settings.role != "master":
                raise RepoNotFound(  # one line, the advice in it: no hint line under it
                    f"{who}{repo_id} not found (or not visible to this token): "
                    f"create it with speedtronic hub init {repo_id}",
                    permanent=True,
                )
            init_repo(client)
            logger.notice(f"diloco master: created the private repo {repo_id}")
        problem = write_access_problem(client.whoami(), repo_id)
        if problem is not None:
            message = f"{who}token cannot write to {repo_id}: {problem}"
            raise HubError(message, status=403, permanent=True)
        if settings.role == "master" and settings.collaborators:
            for line in grant(client, list(settings.collaborators)).instructions:
                logger.warn(f"diloco master: {line}")
    except TransportError as exc:  # the Hub is down for now: training starts anyway (I5)
        if getattr(exc, "permanent", False):
            raise
        note = no_directory_note(repo_id)  # or a mistyped relative path: say that too
        also = f"; the Hub cannot be reached, and {note}" if note else ""
        logger.warn(f"diloco: could not check {repo_id} at start ({exc}){also}; going on")
