"""The master's trust boundary: its own state dir against the repo's global (I3).

The state dir is written only by this master, atomically and content-addressed; the repo can be
edited by anyone with write access. So the state dir is the source of truth for the outer step:
``RepoGuard.inspect`` reads the repo's ``step_count.json`` (and at start the weights) as
untrusted data and says what is wrong with it, naming the file; ``at_start`` decides which
state the master resumes and whether to republish; ``check`` is the periodic look that restores
a global that was deleted, damaged or left behind, and stops this master when another one
publishes, and ``keyframe_lost`` the look at the keyframe the current update builds on. The
repo is adopted only where nothing local can say better: with no state dir (a
master on a new machine), or when it holds this master's own later publish whose state was
lost (a publish follows its save, so never past an intact state dir). A step count that names
this master past its saved state, or names no master, is no master's publish: named once, and
replaced by this master's own. The periodic look compares the whole file with what this master
published, so an edited field (a node's seq, the fleet's pace) is restored too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from speedtronic.distributed.codec import (
    BadDelta,
    check_plausible_global,
    global_norm,
)
from speedtronic.distributed.frozen_base import check_recorded_base
from speedtronic.distributed.global_update import GlobalReader
from speedtronic.distributed.master.state import MasterState
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, STEP_COUNT, leaves_room
from speedtronic.errors import DamagedRepoFile, TransportError

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class RepoView:
    """The repo's global as read: ``step`` None when absent or damaged, ``problem`` why."""

    step: int | None = None
    master: str | None = None
    sha256: str | None = None
    problem: str | None = None
    weights: Tensors | None = None  # read at start only, when consistent with the step count
    keyframe: str | None = None  # the keyframe path an update builds on, read with the weights
    nodes: dict | None = None  # step_count's per-node summary (``hub status`` shows it)
    count: dict | None = None  # the whole step count as parsed: the periodic look compares it


class AnotherMaster(TransportError):
    """Another master publishes to this repo: only one may run (permanent, exit 1)."""

    permanent = True


class RepoGuard:
    """Reads and judges the repo's global on behalf of the master with id ``master_id``."""

    def __init__(
        self,
        transport: Any,
        logger: Any,
        master_id: str,
        reference: Tensors,
        clock: Callable[[], float],
        sha_of: Callable[[MasterState], str],
        interval_s: float = 60.0,
    ):
        """``sha_of``: the sha256 of what a publish of a state sends (the publisher's)."""
        self.transport, self.logger, self.master_id = transport, logger, master_id
        self.reference, self.clock, self.interval_s = reference, clock, interval_s
        self.reader = GlobalReader(transport, reference, hashed=True)
        self.sha_of = sha_of
        self.base_sha256: str | None = None  # the frozen base each publish records (LoRA)
        self.last_check = -float("inf")
        self.checked = False  # the repo answered once: rounds may run
        self._said: set[str] = set()  # problems logged already (each once)
        self._keyframe_seen: tuple[str, str | None] | None = None  # (path, version) verified

    # ------------------------------------------------------------------ reading

    def inspect(self, with_weights: bool, max_bytes: int) -> RepoView:
        """What the repo holds, damage included (``problem``); a transport failure raises."""
        try:
            counted = self.transport.read_step_count()
        except DamagedRepoFile as exc:
            self.checked = True
            return RepoView(problem=_named(STEP_COUNT, exc))
        self.checked = True
        if counted is None:
            return RepoView()
        view = RepoView(
            counted["outer_step"],
            counted.get("master"),
            counted.get("weights_sha256"),
            nodes=counted.get("nodes"),
            count=counted,
        )
        if not with_weights:
            return view
        return self._with_weights(view, max_bytes)

    def _with_weights(self, view: RepoView, max_bytes: int) -> RepoView:
        try:
            read = self.reader.read(max_bytes)
            if read is None:
                return RepoView(problem=f"{GLOBAL_WEIGHTS} is missing")
            check_plausible_global(read.weights, global_norm(self.reference))
        except (DamagedRepoFile, BadDelta) as exc:
            return RepoView(problem=_named(GLOBAL_WEIGHTS, exc))
        if read.outer_step != view.step:
            problem = (
                f"{GLOBAL_WEIGHTS} holds outer step {read.outer_step}, {STEP_COUNT} says "
                f"{view.step}"
            )
            return RepoView(problem=problem)
        if view.sha256 is not None and read.sha256 != view.sha256:
            return RepoView(problem=f"{GLOBAL_WEIGHTS} does not match {STEP_COUNT}'s sha256")
        return replace(view, weights=read.weights, keyframe=read.keyframe)

    # ------------------------------------------------------------------ decisions

    def at_start(
        self, state: MasterState | None, view: RepoView, newest_saved: int | None = None
    ) -> tuple[MasterState, bool]:
        """The state to resume and whether to publish it now. ``newest_saved`` is the newest
        outer step with a manifest in state_dir, usable or not (None: none there)."""
        check_recorded_base(view.count or {}, self.base_sha256, self.transport.describe())
        if state is None:
            return self._without_state(view)
        where = f"this master's state (outer step {state.outer_step})"
        if view.problem is not None:
            self._say(f"the repo's global is damaged ({view.problem}); republishing {where}")
            return state, True
        if view.step is None or view.step < state.outer_step:
            return state, True
        if view.step == state.outer_step:
            return state, not self._holds(view, state)
        if self._own(view) and self._lost_since(state, view.step, newest_saved):
            self._say(
                f"the repo holds this master's outer step {view.step}, past {where}: continuing "
                "from it (outer momentum starts again from zero)"
            )
            return MasterState(view.step, view.weights), False
        if view.master in (self.master_id, None) or not leaves_room(view.step):
            self._say(f"{self._not_a_publish(view, state.outer_step)}; republishing {where}")
            return state, True
        raise self._another_master(view)

    def _own(self, view: RepoView) -> bool:
        """Whether the repo's step can be a publish of this master's: its id, and a step a
        master can count on from (one near the 18-digit limit is no run's)."""
        return view.master == self.master_id and leaves_room(view.step)

    def _holds(self, view: RepoView, state: MasterState) -> bool:
        """Whether the repo's global at the state's step is this state's, as published: the
        weights, this master's id and each node's newest applied delta (a node numbers its
        deltas and reapplies its own from them); what differs is named once."""
        edited = [
            name
            for name, same in (
                ("weights_sha256", view.sha256 == self.sha_of(state)),
                ("master", view.master == self.master_id),
                ("base_sha256", (view.count or {}).get("base_sha256") == self.base_sha256),
                ("nodes", not state.nodes or view.nodes == state.nodes),
            )
            if not same
        ]
        if edited:
            where = f"this master's state (outer step {state.outer_step})"
            self._say(f"{STEP_COUNT} differs from {where} in {', '.join(edited)}; republishing it")
        return not edited

    @staticmethod
    def _lost_since(state: MasterState, step: int, newest_saved: int | None) -> bool:
        """Whether ``step`` can be this master's publish whose state is lost: a publish follows
        its save, so only up to the newest manifest in state_dir, when that one is unusable,
        or when state_dir holds nothing newer than the state (restored from a checkpoint)."""
        if newest_saved is None or newest_saved < state.outer_step:
            return True  # state_dir lost: the checkpoint's copy is older than what was published
        return state.outer_step < newest_saved and step <= newest_saved

    def _not_a_publish(self, view: RepoView, outer_step: int) -> str:
        if not leaves_room(view.step):
            return (
                f"{STEP_COUNT} says outer step {view.step}, which leaves no room to count on "
                "(names and headers hold 18 digits): no master's publish"
            )
        if view.master is None:
            return (
                f"{STEP_COUNT} says outer step {view.step} and names no master: not a master's "
                "publish (every master names itself)"
            )
        return (
            f"{STEP_COUNT} names this master at outer step {view.step}, past its newest saved "
            f"state (outer step {outer_step}): not its publish (a publish follows its save)"
        )

    def _without_state(self, view: RepoView) -> tuple[MasterState | None, bool]:
        if view.problem is not None:
            self._say(
                f"the repo's global is damaged ({view.problem}) and this master has no state: "
                "starting from the initial weights"
            )
        if view.weights is None:
            return None, True
        if not leaves_room(view.step):
            self._say(f"{self._not_a_publish(view, 0)}; starting from the initial weights")
            return None, True
        self._say(
            f"no state of this master: continuing from the repo's outer step {view.step} "
            "(outer momentum starts again from zero)"
        )
        return MasterState(view.step, view.weights), False

    def due(self) -> bool:
        return self.clock() - self.last_check >= self.interval_s

    def check(self, expected: dict, saved_step: int | None, max_bytes: int) -> bool:
        """Is the repo's step count still ``expected``, the one this master last published (or
        found in order at start), in every field? False if so; True (with the anomaly named
        once in the log) when it must be published again; ``AnotherMaster`` when a consistent
        global at or past that step is another master's. ``saved_step`` is the newest step
        this master saved: a publish of its own may land late, never past it."""
        self.last_check = self.clock()
        published_step, published_sha = expected["outer_step"], expected.get("weights_sha256")
        view = self.inspect(with_weights=False, max_bytes=max_bytes)
        again = "publishing this master's global again"
        if view.problem is not None:
            return self._say(f"the repo's global is damaged ({view.problem}); {again}")
        if view.step is None:
            return self._say(f"{STEP_COUNT} is missing from the repo; {again}")
        if view.step == published_step and view.sha256 == (published_sha or view.sha256):
            edited = _edited_fields(view.count or {}, expected)
            if not edited:  # in order again (an adopted global too): a later problem is news
                self._said.clear()
                return False
            fields = ", ".join(edited)
            return self._say(
                f"{STEP_COUNT} was edited since this master published ({fields}); {again}"
            )
        if not leaves_room(view.step) or view.master is None:
            return self._say(f"{self._not_a_publish(view, published_step)}; {again}")
        if view.master == self.master_id:
            if published_step < view.step <= max(saved_step or 0, published_step):
                # a publish of ours that landed before its send returned (or whose answer was
                # lost): that send, or its retry, settles it. Asking for another publish here
                # raced the send's own success and committed the same step twice
                return False
            if view.step > published_step:
                return self._say(
                    f"{self._not_a_publish(view, saved_step or published_step)}; {again}"
                )
            if view.step == published_step:
                return self._say(f"{STEP_COUNT} names other weights than published; {again}")
        if view.step < published_step:
            return self._say(f"{STEP_COUNT} went back to outer step {view.step}; {again}")
        full = self.inspect(with_weights=True, max_bytes=max_bytes)  # another name, at or ahead
        if full.problem is not None:
            return self._say(f"the repo's global is damaged ({full.problem}); {again}")
        if full.step is not None and full.step >= published_step:
            raise self._another_master(full)
        return self._say(f"{STEP_COUNT} says outer step {full.step}; {again}")

    def keyframe_lost(
        self, path: str, sha256: str, max_bytes: int, uploaded: str | None = None
    ) -> bool:
        """Whether the repo no longer holds the keyframe ``path`` as this master uploaded it
        (deleted, damaged or replaced): every global naming it is unreadable until the master
        uploads it again from its state (I3), so True is named once. A transport that says a
        file's version (``file_version``: the Hub's blob id, a bucket's ETag) is asked that, and
        the bytes are read and hashed only when it differs from the one seen just after this
        master's upload (``uploaded``) or at the last look; a directory's are read each look."""
        version_of = getattr(self.transport, "file_version", None)
        version = version_of(path) if version_of is not None else None
        if version is not None and version == uploaded:
            self._keyframe_seen = (path, version)
        if version is not None and self._keyframe_seen == (path, version):
            return False
        gone = version_of is not None and version is None
        problem = (
            "is missing" if gone else keyframe_problem(self.transport, path, sha256, max_bytes)
        )
        if problem is None:
            self._keyframe_seen = (path, version)
            return False
        self._keyframe_seen = None
        return self._say(
            f"{path} {problem}: every global on it is unreadable; uploading it again from this "
            "master's state"
        )

    def _another_master(self, view: RepoView) -> AnotherMaster:
        return AnotherMaster(
            f"another master ({view.master or 'no id'}) published outer step {view.step} to "
            f"{self.transport.describe()}; only one master may run",
            hint=f"stop the other master; if none runs (a file someone wrote), delete "
            f"{STEP_COUNT} and start this master again: it publishes its own state",
        )

    def _say(self, message: str) -> bool:
        if message not in self._said:
            self._said.add(message)
            self.logger.warn(f"diloco master: {message}")
        return True


def _edited_fields(found: dict, expected: dict) -> list[str]:
    """The fields of a step count that differ from the one published; ``weights_key`` is the
    bucket transport's own (it checks it against the step and sha256)."""
    keys = (found.keys() | expected.keys()) - {"weights_key"}
    return sorted(k for k in keys if found.get(k) != expected.get(k))


def _named(path: str, exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if path in text else f"{path}: {text}"


def keyframe_problem(transport: Any, path: str, sha256: str, max_bytes: int) -> str | None:
    """What is wrong with the keyframe at ``path`` (missing, damaged, other bytes), or None."""
    try:
        data = transport.read(path, max_bytes)
    except DamagedRepoFile as exc:
        return f"is damaged ({exc})"
    if data is None:
        return "is missing"
    if hashlib.sha256(bytes(data)).hexdigest() != sha256:
        return "is not the keyframe this master uploaded (its sha256 differs)"
    return None
