"""The master's side of ``global_dtype: deltas``: the round chain each saved step publishes.

A saved step's ``RoundChain`` (``round_record``) is the chain of the step before plus this
step's round, or a fresh chain when the step is a keyframe (``Publisher.keyframe_for``: every
``keyframe_every`` outer steps and the run's end). A republish of a step keeps its chain, so it
gives the same bytes (I3); the chain is saved with the step (``MasterState.round_chain``).

Deltas a round names are replayed by nodes until a keyframe covers them, so their deletes are
held back (``deletes``) and sent with the first publish whose chain no longer names them (the
step after a keyframe, or the run's last), in the same commit as before: no extra commit.
"""

from __future__ import annotations

from typing import Any

from speedtronic.distributed.round_apply import weights_sha256
from speedtronic.distributed.round_record import Round, RoundChain, RoundDelta

Shared = tuple[float, list[RoundDelta]]  # a round's outer lr and its deltas, in order


def next_chain(
    previous: RoundChain | None,
    state: Any,
    keyframe: Any,
    shared: Shared | None,
    last: bool = False,
) -> RoundChain:
    """The chain ``state``'s publish carries: ``previous`` when it is the same step; else
    ``previous``'s rounds (from its newest keyframe) and this step's, the step's keyframe named
    as the newest when it is one, so nodes in step replay the round rather than download it.
    A fresh chain on the keyframe at the start (no previous step) and at the run's end
    (``last``: every node reads the final keyframe, and no delta outlives the run)."""
    step = state.outer_step
    newest = keyframe.sha256 if keyframe.step == step else ""
    if previous is not None and previous.outer_step == step:
        return previous
    follows = previous is not None and previous.outer_step == step - 1
    if newest and (last or not follows):
        return RoundChain(step, step, newest, ())
    if not follows or (shared is None and not newest):
        raise ValueError(
            f"outer step {step} has no round to publish after {_named(previous)} (a bug)"
        )
    lr, deltas = shared or (1.0, [])  # no deltas: the same weights, under a step of its own
    one = Round(step, lr, tuple(deltas), weights_sha256(state.global_weights))
    if previous.newest_sha256:  # the previous step is the newest keyframe: rounds start anew
        return RoundChain(step, previous.outer_step, previous.newest_sha256, (one,), newest)
    rounds = (*previous.rounds, one)
    return RoundChain(step, previous.keyframe_step, previous.keyframe_sha256, rounds, newest)


def held(chain: RoundChain | None) -> set[str]:
    """The delta paths ``chain`` names: nodes may still replay them."""
    return set() if chain is None else {d.path for r in chain.rounds for d in r.deltas}


def deletes(previous: RoundChain | None, chain: RoundChain, consumed: list[str]) -> list[str]:
    """What the publish of ``chain`` deletes: ``consumed`` but what ``chain`` still names, and
    what the previous chain named once a keyframe covers it."""
    keep = held(chain)
    gone = [p for p in consumed if p not in keep]
    return list(dict.fromkeys([*gone, *sorted(held(previous) - keep)]))


def _named(chain: RoundChain | None) -> str:
    return "no chain" if chain is None else f"the chain at outer step {chain.outer_step}"
