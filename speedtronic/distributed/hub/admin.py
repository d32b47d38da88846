"""Administering a Hub run repo: ``init_repo``, ``grant`` and ``RepoWatcher`` (status). Torch-free.

Everything goes through the ``HubClient`` interface (``hub.py``), so this module never imports
``huggingface_hub`` and its logic is tested with a small fake. The ``speedtronic hub`` commands
(``cli/hub.py``) render what these return; the master reuses ``init_repo`` when it starts on a
missing repo and ``grant`` for ``distributed.collaborators``. Results are plain dataclasses
and dicts with snake_case keys and units in their names, ready for ``--format json``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from speedtronic.config.rules import is_hub_user_name
from speedtronic.distributed.protocol import (
    NODES_DIR,
    STEP_COUNT,
    parse_step_count,
)
from speedtronic.distributed.repo_status import run_summary
from speedtronic.distributed.transport import MAX_STEP_COUNT_BYTES
from speedtronic.errors import ConfigError, TransportError
from speedtronic.hub.access import WRITE_ROLES
from speedtronic.hub.budget import HUB_CALLS_PER_5_MIN, HUB_COMMITS_PER_HOUR
from speedtronic.hub.names import is_hub_repo_id

README = "README.md"
# init rewrites only READMEs that carry this line, so a README a person wrote is never replaced
README_MARKER = "<!-- written by `speedtronic hub init`: delete this line to keep your edits -->"
MAX_README_BYTES = 1 << 20
MEMBERS_URL = "https://huggingface.co/organizations/{org}/members"
TOKENS_URL = "https://huggingface.co/settings/tokens"
NEW_ORG_URL = "https://huggingface.co/organizations/new"


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` if it is a Hub ``owner/name``; ConfigError (exit 2) otherwise."""
    if not is_hub_repo_id(repo_id):
        raise ConfigError(
            f"{repo_id!r} is not a Hugging Face Hub repo id: use owner/name, e.g. my-org/my-run"
        )
    return repo_id


def worker_command(repo_id: str, role: str = "worker") -> str:
    return f"speedtronic train --config worker.yaml --role {role} --node-id <id> --repo {repo_id}"


def config_snippet(repo_id: str) -> str:
    """The ``distributed:`` section every node's config needs for this repo (defaults shown)."""
    return (
        "distributed:\n"
        "  enabled: true\n"
        "  mode: dumb_diloco\n"
        "  role: worker                # the master's node: --role master\n"
        f"  repo_id: {repo_id}\n"
        "  inner_steps: 500            # optimizer steps between syncs: size it for the budgets\n"
        "  poll_interval: 60           # seconds between checks of the repo\n"
        "  min_publish_interval_s: 60  # the master publishes at most this often\n"
        "  delta_dtype: bf16\n"
        "  squash_every: 0             # squash the repo history every N publishes; 0: never\n"
    )


def readme_text(repo_id: str, owner_kind: str) -> str:
    """The README ``hub init`` writes: the same bytes for the same repo, so reruns are no-ops."""
    owner = repo_id.split("/")[0]
    if owner_kind == "org":
        writers = (
            f"members of the `{owner}` organization with the write or admin role "
            f"({MEMBERS_URL.format(org=owner)}), and holders of a fine-grained token with write "
            "access to this repo"
        )
    else:
        writers = (
            f"the account `{owner}`, and whoever holds a fine-grained token `{owner}` created "
            "with write access to this repo only (the Hub has no write collaborators on a "
            "user's repos)"
        )
    return (  # the YAML header spares the Hub's "missing metadata" warning on commit
        "---\ntags:\n- speedtronic\n- dumb-diloco\n---\n"
        f"{README_MARKER}\n"
        f"# {repo_id}: a Speedtronic DumbDiLoCo run\n\n"
        "Several machines train one model and meet only here: each worker uploads a\n"
        "pseudo-gradient every `inner_steps` steps, the master averages what arrived and\n"
        "publishes new global weights. Every file is data (safetensors or JSON), validated\n"
        "before use; nothing here is ever run as code.\n\n"
        "## Layout\n\n"
        "| path | written by | content |\n"
        "| --- | --- | --- |\n"
        "| `global/latest.safetensors` | master | full fp32 weights of the newest outer step |\n"
        "| `global/step_count.json` | master | outer step, time, weights sha256, per-node "
        "summary |\n"
        "| `nodes/<node_id>/delta_<n>.safetensors` | each worker | a pseudo-gradient; the "
        "master deletes it once applied |\n\n"
        "## Who may write\n\n"
        f"Trusted collaborators only, since a write can change the model: {writers}.\n\n"
        "## Join\n\n"
        "```bash\n"
        f"{worker_command(repo_id)}\n"
        "```\n\n"
        f"with this in `worker.yaml`:\n\n```yaml\n{config_snippet(repo_id)}```\n\n"
        f"`speedtronic hub status {repo_id}` shows the run. Set-up, budgets and troubleshooting:\n"
        "`docs/hub.md` in the Speedtronic repository.\n"
    )


@dataclass
class InitResult:
    """What ``init_repo`` did (or, with ``dry_run``, would do)."""

    repo_id: str
    dry_run: bool
    existed: bool
    private: bool
    readme_changed: bool
    commit: str | None = None
    actions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "worker_command": worker_command(self.repo_id),
            "master_command": worker_command(self.repo_id, "master"),
            "config_snippet": config_snippet(self.repo_id),
        }


def init_repo(
    client: Any, *, public: bool = False, allow_public: bool = False, dry_run: bool = False
) -> InitResult:
    """Create the run repo (private unless ``public``) and its README; idempotent.

    An existing public repo is refused unless ``allow_public`` or ``public``: its weights and
    deltas would be readable by anyone. The README is committed only when missing or when a
    README this function wrote differs, so a second run makes no commit. ``dry_run`` calls
    only read-only endpoints.
    """
    repo = check_repo_id(client.repo_id)
    visible = client.visibility()  # True private, False public, None missing
    if visible is False and not (public or allow_public):
        raise TransportError(
            f"{repo} exists and is public, so anyone can read its weights and deltas: make it "
            "private in its settings on the Hub, or pass --allow-public to use it as it is"
        )
    result = InitResult(repo, dry_run, visible is not None, not public, False)
    if visible is None:
        if not dry_run:
            client.create_repo(private=not public)
        kind = "public" if public else "private"
        verb = "would create" if dry_run else "created"
        result.actions.append(f"{verb} {kind} model repo {repo}")
    else:
        result.private = visible
        result.actions.append(f"{repo} exists ({'private' if visible else 'public'}): kept")
        if public and visible:
            result.notes.append(
                "--public does not change an existing repo: change it in its settings on the Hub"
            )
    _init_readme(client, result, visible is None)
    return result


def _init_readme(client: Any, result: InitResult, missing: bool) -> None:
    wanted = readme_text(result.repo_id, owner_kind(client)).encode()
    current = None if missing else client.download(README, client.head(), MAX_README_BYTES)
    if current == wanted:
        result.actions.append(f"{README} is up to date")
        return
    if current is not None and README_MARKER.encode() not in current:
        result.notes.append(f"{README} was written by someone else: left as it is")
        return
    result.readme_changed = True
    verb = "write" if current is None else "update"
    if result.dry_run:
        result.actions.append(f"would {verb} {README}")
        return
    result.commit = client.commit({README: wanted}, [], f"speedtronic hub init: {verb} README")
    done = "wrote" if current is None else "updated"
    result.actions.append(f"{done} {README} (commit {result.commit[:8]})")


def owner_kind(client: Any) -> str:
    """``org`` when the repo's owner is an organization of the token's user, else ``user``."""
    owner = client.repo_id.split("/")[0]
    me = client.whoami()
    return "org" if owner in (me.get("orgs") or []) else "user"


# ---------------------------------------------------------------------------------- grant


@dataclass(frozen=True)
class UserAccess:
    """One user's standing: ``can_write``, ``manual_step`` (someone must act) or ``error``."""

    user: str
    status: str
    detail: str


@dataclass
class GrantResult:
    repo_id: str
    owner_kind: str  # "org" or "user"
    users: list[UserAccess] = field(default_factory=list)
    instructions: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """1 when a user is in error, 3 when one still needs a manual step, else 0."""
        statuses = {u.status for u in self.users}
        return 1 if "error" in statuses else 3 if "manual_step" in statuses else 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": self.exit_code}


def grant(client: Any, users: list[str]) -> GrantResult:
    """Check who of ``users`` can write to the repo and say what each other one needs.

    The Hub has no API to add a write collaborator to a user's repo nor to invite someone to
    an org, so nothing is changed: org roles are read, users checked to exist, and the manual
    steps are spelled out (an org invite with the write role, or a fine-grained token).
    """
    repo = check_repo_id(client.repo_id)
    if client.visibility() is None:
        raise TransportError(f"{repo} not found: create it with speedtronic hub init {repo}")
    owner = repo.split("/")[0]
    members = client.org_members(owner)
    result = GrantResult(repo, "user" if members is None else "org")
    roles = None if members is None else {name.lower(): role for name, role in members.items()}
    for user in dict.fromkeys(users):  # de-duplicated, in order
        result.users.append(_access(client, repo, owner, roles, user))
    waiting = [u.user for u in result.users if u.status == "manual_step"]
    if waiting:
        result.instructions = _instructions(repo, owner, result.owner_kind, waiting)
    return result


def _access(client: Any, repo: str, owner: str, roles: dict | None, user: str) -> UserAccess:
    if not is_hub_user_name(user):
        return UserAccess(user, "error", f"{user!r} is not a valid Hugging Face user name")
    if roles is None:  # a user's repo: only its owner can write
        if user.lower() == owner.lower():
            return UserAccess(user, "can_write", f"owns {repo}")
        if not client.user_exists(user):
            return UserAccess(user, "error", f"no Hugging Face user named {user}")
        return UserAccess(
            user, "manual_step", f"cannot write to {repo}: it belongs to the user {owner}"
        )
    role = roles.get(user.lower(), "")
    if role in WRITE_ROLES:
        return UserAccess(user, "can_write", f"member of {owner} with the {role} role")
    if user.lower() in roles:
        why = {
            "contributor": "the contributor role writes only to repos its holder created",
            "read": "the read role cannot write",
        }.get(role, f"role {role or 'not visible to this token'}, so write access is unknown")
        return UserAccess(user, "manual_step", f"member of {owner}, but {why}")
    if not client.user_exists(user):
        return UserAccess(user, "error", f"no Hugging Face user named {user}")
    return UserAccess(user, "manual_step", f"not a member of the {owner} organization")


def _instructions(repo: str, owner: str, kind: str, users: list[str]) -> list[str]:
    names = ", ".join(users)
    token = (
        f"creates a fine-grained token at {TOKENS_URL} with write permission on {repo} only "
        "for each worker, given to it as HF_TOKEN (it acts as its creator and shares that "
        "account's 1,000 API calls per 5 minutes)"
    )
    if kind == "org":
        return [
            f"The Hub has no API to invite members: an admin of {owner} invites {names} with "
            f"the write role (or raises their role to write) at {MEMBERS_URL.format(org=owner)}; "
            "each invitee accepts the invitation.",
            f"Or, without membership: a member who can write {token}.",
        ]
    return [
        f"{repo} belongs to the user {owner}, and the Hub cannot give another account write "
        f"access to a user's repo. Either move the run to an organization ({NEW_ORG_URL}; then "
        f"speedtronic hub init ORG/NAME) and invite {names} with the write role,",
        f"or {owner} {token}.",
    ]


# --------------------------------------------------------------------------------- status


class RepoWatcher:
    """``hub status``: one snapshot per ``status()`` call, refetching only when head moved.

    An unchanged repo costs one API call (``head``); a changed one about seven (step count,
    listing with times, the global's files, size, commits of the last hour). Ages are
    recomputed every time. Bytes per round: each node's newest delta (up), the global's file
    (down: full weights, or an update) and the keyframe an update builds on (down once).
    """

    def __init__(self, client: Any, clock: Any = time.time):
        self.client = client
        self.clock = clock
        self.head: str | None = None
        self.facts: dict[str, Any] = {}

    def status(self) -> dict[str, Any]:
        head = self.client.head()
        if head != self.head:
            self.facts = self._fetch(head)
            self.head = head
        return self._render(self.clock())

    def _fetch(self, head: str) -> dict[str, Any]:
        client = self.client
        problems = []
        counted: dict[str, Any] = {}
        data = client.download(STEP_COUNT, head, MAX_STEP_COUNT_BYTES)
        if data is not None:
            try:
                counted = parse_step_count(data)
            except TransportError as exc:
                problems.append(str(exc))
        files = client.list_files(NODES_DIR, head, with_times=True)
        since = self.clock() - 3600
        return {
            "counted": counted,
            "files": files,
            "global_files": {f.path: f.size for f in client.list_files("global", head)},
            "size_bytes": client.storage_bytes(),
            "commit_times": [c.time for c in client.commits(since=since)],
            "problems": problems,
        }

    def _render(self, now: float) -> dict[str, Any]:
        facts, budget = self.facts, self.client.budget
        summary = run_summary(
            facts["counted"], facts["files"], facts["global_files"], now, facts["problems"]
        )
        return {
            "repo_id": self.client.repo_id,
            "head": self.head,
            **summary,
            "size_bytes": facts["size_bytes"],
            "commits_1h": sum(t >= now - 3600 for t in facts["commit_times"]),
            "commits_limit_1h": HUB_COMMITS_PER_HOUR,
            "api_calls_5min": budget.calls(300),
            "api_calls_1h": budget.calls(3600),
            "api_calls_limit_5min": HUB_CALLS_PER_5_MIN,
        }
