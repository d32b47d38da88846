"""Can this token write to that repo? Read from the Hub's ``whoami`` answer, before training.

A worker whose token cannot write would otherwise train a whole inner loop before its first
upload is refused. ``HubClient.whoami`` says what kind of token it is (``token_role``: read,
write or fineGrained with scoped permissions) and the user's organisations with their roles,
so most refusals can be predicted at start. When the answer does not decide it, this says
nothing and the first upload's 403 stops the node instead. Stdlib only.
"""

from __future__ import annotations

from typing import Any

WRITE_ROLES = ("write", "admin")
# A contributor writes only to the org repos they created: the answer cannot tell which
UNDECIDED_ROLES = ("contributor",)
WRITE_PERMISSION = "repo.write"


def token_facts(info: dict[str, Any]) -> dict[str, Any]:
    """What the Hub's ``whoami-v2`` answer says about a token: its user, the user's orgs and
    roles in them, and the token's kind and scopes (never its value)."""
    roles = {o["name"]: o.get("roleInOrg") for o in info.get("orgs") or [] if "name" in o}
    token = (info.get("auth") or {}).get("accessToken") or {}
    return {
        "name": info.get("name", ""),
        "orgs": list(roles),
        "org_roles": roles,
        "token_role": token.get("role"),
        "fine_grained": token.get("fineGrained") or {},
    }


def write_access_problem(whoami: dict[str, Any], repo_id: str) -> str | None:
    """Why the token behind ``whoami`` cannot write to ``repo_id``, or None if it may."""
    role = whoami.get("token_role")
    namespace = repo_id.split("/", 1)[0].casefold()  # the Hub's names ignore case
    if role == "read":
        return "the token is read-only: create a write or fine-grained token"
    if role == "fineGrained":
        return _fine_grained_problem(whoami.get("fine_grained") or {}, repo_id, namespace)
    if role == "write" and namespace != str(whoami.get("name", "")).casefold():
        return _org_problem(whoami, namespace)
    return None


def _org_problem(whoami: dict[str, Any], org: str) -> str | None:
    roles = {name.casefold(): role for name, role in (whoami.get("org_roles") or {}).items()}
    if org not in roles:
        return f"{whoami.get('name')} is not a member of {org}"
    role = roles[org]
    if role is not None and role not in WRITE_ROLES + UNDECIDED_ROLES:
        return f"{whoami.get('name')} has the {role!r} role in {org}; it needs write"
    return None


def _fine_grained_problem(grants: dict[str, Any], repo_id: str, namespace: str) -> str | None:
    """Fine-grained tokens list permissions per entity (a repo, a user or an org)."""
    for scope in grants.get("scoped") or []:
        entity = scope.get("entity") or {}
        covers = str(entity.get("name", "")).casefold() in (repo_id.casefold(), namespace)
        if covers and WRITE_PERMISSION in (scope.get("permissions") or []):
            return None
    if WRITE_PERMISSION in (grants.get("global") or []):
        return None
    return f"the fine-grained token has no {WRITE_PERMISSION} permission for {repo_id}"
