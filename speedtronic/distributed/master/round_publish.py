"""The master's side of ``global_dtype: deltas``: the round chain each saved step publishes.

A saved step's ``RoundChain`` (``round_record``) is the chain of the step before plus this
step's round, or a fresh chain when the step is a keyframe (``Publisher.keyframe_for``: every
``keyframe_every`` outer steps and the run's end). A republish of a step keeps its chain, so it
gives the same bytes (I3); the chain is saved with the step (``MasterState.round_chain``).

Deltas a round names are replayed by nodes until a keyframe covers them, so their deletes are
held back (``deletes``) and sent with the publish of the next keyframe, in the same commit as
before: no extra commit per round.
"""

from __future__ import annotations

from typing import Any

from speedtronic.distributed.round_apply import weights_sha256
from speedtronic.distributed.round_record import Round, RoundChain, RoundDelta

Shared = tuple[float, list[RoundDelta]]  # a round's outer lr and its deltas, in order


def next_chain(
    previous: RoundChain | None, state: Any, keyframe: Any, shared: Shared | None
) -> RoundChain:
    """The chain ``state``'s publish carries: ``previous`` when it is the same step, a fresh
    one at a keyframe, else ``previous`` and this step's round."""
    step = state.outer_step
    if previous is not None and previous.outer_step == step:
        return previous
    if keyframe.step == step:
        return RoundChain(step, step, keyframe.sha256, ())
    if previous is None or previous.outer_step != step - 1 or shared is None:
        raise ValueError(
            f"outer step {step} has no round to publish after {_named(previous)} (a bug)"
        )
    lr, deltas = shared
    one = Round(step, lr, tuple(deltas), weights_sha256(state.global_weights))
    rounds = (*previous.rounds, one)
    return RoundChain(step, previous.keyframe_step, previous.keyframe_sha256, rounds)


def held(chain: RoundChain | None) -> set[str]:
    """The delta paths ``chain`` names: nodes may still replay them."""
    return set() if chain is None else {d.path for r in chain.rounds for d in r.deltas}


def deletes(previous: RoundChain | None, chain: RoundChain, consumed: list[str]) -> list[str]:
    """What the publish of ``chain`` deletes: ``consumed`` but what ``chain`` still names, and
    what the previous chain named once a keyframe covers it."""
    keep = held(chain)
    gone = [p for p in consumed if p not in keep]
    if previous is not None and chain.keyframe_step > previous.keyframe_step:
        gone += sorted(held(previous) - keep)
    return list(dict.fromkeys(gone))


def _named(chain: RoundChain | None) -> str:
    return "no chain" if chain is None else f"the chain at outer step {chain.outer_step}"
