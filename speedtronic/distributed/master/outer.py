"""The master's brain: outer aggregation, the Nesterov outer optimizer, and the master's state.

No network I/O: the coordinator offers deltas that ``codec`` validated and publishes what
``Master.round`` returns; ``MasterState.save``/``load`` (a local dir) are the only file I/O.

Aggregation (DESIGN.md section 5, I2): a node's consecutive deltas are increments of one
trajectory, so a round first adds up each node's deltas (a master that paused and finds forty
deltas of one node applies all forty, not their mean), then takes the weighted mean over nodes,
weight = the node's tokens per optimizer step * ``staleness_discount`` ** staleness (outer step
- the ``base_outer_step`` of its freshest delta). A delta staler than ``max_staleness`` is
stale (counted, never applied), a base from the future is bad. A round runs at a quorum:
``min_deltas`` deltas, or ``max_wait_s`` after the first arrived.

The ``fleet`` policy (default). DumbDiLoCo never makes a worker wait, so a round holds only
part of the fleet and every delta is at least one round stale. Applying each round's mean in
full with Nesterov momentum (``naive``) therefore steps several times per inner loop of the
fleet, and diverged in our benchmark (naive async, and the first version of this module: eval
loss 21.8 against 1.55 for one worker). So a round's mean is scaled by its nodes' share of the
fleet's pace (tokens per step of every node heard from within ``max_staleness`` outer steps):
each node's summed increments count as its share of the fleet, however many deltas they came
in. Momentum is delayed Nesterov (Liu et al. 2024, "Asynchronous Local-SGD"): the gradient
part at once, the momentum look-ahead once the rounds' shares add up to one inner loop of the
whole fleet; with every node in every round this is exactly DiLoCo's Nesterov step. The
defaults are plain averaging (outer lr 1.0, momentum 0), the best asynchronous setting
measured; DiLoCo's 0.7 / 0.9 was worse asynchronously (docs/benchmarks.md).

I1: identity = ``node_id/seq/sha256(bytes)`` (restarted workers reuse names); every settled one
(applied, stale, bad) is kept, across save/load too, and a repeat is a "duplicate". At ~100
bytes each, memory and save size grow with deltas ever seen (10k ~ 1 MB); an idle poll costs
nothing here. I3: see ``master/state``.
"""

from __future__ import annotations

import copy
import hashlib
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from speedtronic.distributed.master.outer_optim import OuterOptimizer, fp32_copies
from speedtronic.distributed.master.state import MasterState, Tensors
from speedtronic.distributed.protocol import BadDelta, DeltaHeader
from speedtronic.distributed.round_apply import apply_round
from speedtronic.errors import ConfigError


def delta_identity(node_id: str, seq: int, data: bytes) -> str:
    """I1's identity of a delta: who sent it, which file slot, and exactly which bytes."""
    return f"{node_id}/{seq}/{hashlib.sha256(data).hexdigest()}"


@dataclass(frozen=True)
class ReceivedDelta:
    """A validated delta: ``identity`` from ``delta_identity``, fp32 CPU ``tensors``."""

    identity: str
    header: DeltaHeader
    tensors: Tensors


@dataclass(frozen=True)
class MasterConfig:
    """The outer optimizer and the round policy; defaults are the stable async policy."""

    outer_lr: float = 1.0  # plain averaging: see the module docstring
    outer_momentum: float = 0.0
    nesterov: bool = True
    min_deltas: int = 2  # quorum: deltas per full round
    max_wait_s: float = 600.0  # a partial round after this long since the first pending delta
    max_staleness: int = 4  # outer steps; staler deltas are rejected
    staleness_discount: float = 0.5  # weight factor per outer step of staleness
    policy: str = "fleet"  # "fleet": the stable async rule (module doc); "naive": per round
    shared_rounds: bool = False  # global_dtype deltas: rounds as nodes repeat them (shared_round)

    def __post_init__(self) -> None:
        rules = [
            ("outer_lr", self.outer_lr > 0, "> 0"),
            ("outer_momentum", 0 <= self.outer_momentum < 1, "in [0, 1)"),
            ("min_deltas", self.min_deltas >= 1, ">= 1"),
            ("max_wait_s", self.max_wait_s >= 0, ">= 0"),
            ("max_staleness", self.max_staleness >= 0, ">= 0"),
            ("staleness_discount", 0 < self.staleness_discount <= 1, "in (0, 1]"),
            ("policy", self.policy in ("fleet", "naive"), "fleet or naive"),
        ]
        for key, ok, rule in rules:
            if not ok:
                raise ConfigError(f"distributed.{key}: must be {rule} (got {getattr(self, key)!r})")
        if self.shared_rounds and self.outer_momentum > 0:
            raise ConfigError(
                f"distributed.outer_momentum: must be 0 with global_dtype deltas (got "
                f"{self.outer_momentum}): a keyframe carries weights, not the momentum a "
                "joining node would need to repeat the rounds"
            )

    def warnings(self) -> list[str]:
        """Why this setting is unsafe for uneven async workers; empty for the stable ones."""
        if self.policy == "naive" and self.outer_momentum > 0:
            return [
                f"distributed.outer_policy naive with outer_momentum {self.outer_momentum} "
                "applies every round's mean in full with momentum, however few and stale its "
                "deltas (naive async), which diverged in our benchmark; use the fleet policy "
                "unless you are experimenting"
            ]
        return []


@dataclass(frozen=True)
class AggregateResult:
    """A round's mean over nodes (empty if nothing was included) and each delta's fate.

    ``node_weights`` is each node's weight in the mean (its tokens per step x the staleness
    discount), ``tokens`` every included delta's tokens, ``rates`` each included node's tokens
    per optimizer step: its part of the fleet's pace (``Master``'s share). Rates, not tokens per
    delta: a delta that folds two failed uploads must not count as two nodes.
    """

    mean: Tensors
    included: list[str]
    stale: list[str]
    bad: dict[str, str]  # identity -> reason
    node_weights: dict[str, float]
    tokens: int
    rates: dict[str, float]


def delta_problem(header: DeltaHeader, outer_step: int) -> str | None:
    """Why a delta can never be applied at this outer step, or None."""
    if header.base_outer_step > outer_step:
        return f"base_outer_step {header.base_outer_step} is ahead of outer step {outer_step}"
    if header.tokens <= 0 or header.steps <= 0:
        return "trained on 0 tokens" if header.tokens <= 0 else "trained 0 steps"
    return None


def aggregate(
    deltas: list[ReceivedDelta],
    outer_step: int,
    max_staleness: int,
    staleness_discount: float,
    seen_step: int | None = None,
) -> AggregateResult:
    """Sum each node's increments, then take the weighted mean over nodes (module doc).

    A node's consecutive deltas are increments of one trajectory (its base moves to its
    weights at every boundary), so they add up; the chains of a node that restarted without
    its checkpoint each began at a global, so they are averaged (token-weighted). Nodes are
    then averaged with weight = tokens per optimizer step x ``staleness_discount`` ** the
    staleness of the node's freshest delta. Staleness is counted from ``seen_step`` (the newest
    step nodes could have installed; ``outer_step`` when None), bases from the future against
    ``outer_step``.
    """
    seen_step = outer_step if seen_step is None else seen_step
    included: list[ReceivedDelta] = []
    stale: list[str] = []
    bad: dict[str, str] = {}
    seen: set[str] = set()
    for delta in deltas:
        identity, staleness = delta.identity, seen_step - delta.header.base_outer_step
        if identity in seen:
            continue  # I1 even for a careless caller: an identity listed twice counts once
        seen.add(identity)
        if problem := delta_problem(delta.header, outer_step):
            bad[identity] = problem
        # Weight 0 (a discount of 0 reached the pure function) would add nothing: stale.
        elif staleness > max_staleness or staleness_discount**staleness == 0:
            stale.append(identity)
        else:
            included.append(delta)
    nodes = _node_sums(included, seen_step, staleness_discount)
    weights = {node: n.weight for node, n in nodes.items()}
    mean = _weighted_mean({node: n.tensors for node, n in nodes.items()}, weights)
    tokens = sum(d.header.tokens for d in included)
    rates = {node: n.rate for node, n in nodes.items()}
    return AggregateResult(mean, [d.identity for d in included], stale, bad, weights, tokens, rates)


@dataclass(frozen=True)
class _NodeSum:
    tensors: Tensors  # the node's increments added up (its chains averaged)
    weight: float
    rate: float  # tokens per optimizer step


def _node_sums(deltas: list[ReceivedDelta], outer_step: int, discount: float) -> dict:
    """node -> ``_NodeSum`` of its deltas (one per chain of increments, averaged by tokens)."""
    chains: dict[str, dict[str, list[ReceivedDelta]]] = {}
    for delta in deltas:
        node = chains.setdefault(delta.header.node_id, {})
        node.setdefault(delta.header.chain, []).append(delta)
    sums = {}
    for node_id, by_chain in chains.items():
        members = [d for chain in by_chain.values() for d in chain]
        chain_sums = {c: _sum(chain) for c, chain in by_chain.items()}
        chain_tokens = {c: sum(d.header.tokens for d in chain) for c, chain in by_chain.items()}
        rate = sum(d.header.tokens for d in members) / sum(d.header.steps for d in members)
        staleness = min(outer_step - d.header.base_outer_step for d in members)
        tensors = _weighted_mean(chain_sums, {c: float(t) for c, t in chain_tokens.items()})
        sums[node_id] = _NodeSum(tensors, rate * discount**staleness, rate)
    return sums


def _sum(deltas: list[ReceivedDelta]) -> Tensors:
    total = {k: torch.zeros_like(t, dtype=torch.float32) for k, t in deltas[0].tensors.items()}
    for delta in deltas:
        for key, acc in total.items():
            acc.add_(delta.tensors[key].float())
    return total


def _weighted_mean(parts: dict[str, Tensors], weights: dict[str, float]) -> Tensors:
    if not parts:
        return {}
    total = sum(weights.values())
    mean = {
        k: torch.zeros_like(t, dtype=torch.float32) for k, t in next(iter(parts.values())).items()
    }
    for name, tensors in parts.items():
        share = weights[name] / total  # normalised in float64, then one fp32 axpy
        for key, acc in mean.items():
            acc.add_(tensors[key], alpha=share)
    return mean


@dataclass(frozen=True)
class RoundResult:
    """One outer step, proposed by ``Master.propose``: what to save and publish, what the
    publish may delete, and (``candidate``) the state ``Master.commit`` then takes on."""

    outer_step: int
    weights: Tensors  # the new global weights; never changed in place afterwards
    included: list[str]
    stale: list[str]  # rejected since the previous round (at offer or in aggregation)
    bad: dict[str, str]
    momentum_applied: bool  # False for a partial round (plain SGD)
    tokens: int
    momentum_state: str = "off"  # "off" (no outer momentum), "applied", or "pending"
    candidate: Any = None  # _Candidate: the master's state once this round is committed
    # global_dtype deltas: (outer lr, ((identity, coefficient), ...)) in the order applied
    shared: tuple[float, tuple[tuple[str, float], ...]] | None = None

    @property
    def consumed(self) -> list[str]:
        """Every identity this round settled: their files may be removed from the repo."""
        return self.included + self.stale + list(self.bad)

    @property
    def counts(self) -> dict[str, int]:
        return {"included": len(self.included), "stale": len(self.stale), "bad": len(self.bad)}

    @property
    def fleet_rate(self) -> float:
        """The fleet's tokens per step once this round is taken (published with it)."""
        c = self.candidate
        return _fleet_rate(c.fleet, c.step, c.max_staleness)

    def state(self) -> MasterState:
        """The state to save before this round's publish (I3); ``nodes`` is the caller's."""
        c = self.candidate
        fleet = {node: [rate, step] for node, (rate, step) in c.fleet.items()}
        return MasterState(
            c.step, c.weights, c.optimizer.state_dict(), set(c.processed), fleet=fleet
        )


@dataclass(frozen=True)
class _Candidate:
    """The master's state after a proposed round: nothing of the live state is changed until
    ``Master.commit`` (a round whose save fails never happened, issue 27)."""

    step: int
    weights: Tensors
    optimizer: OuterOptimizer
    fleet: dict[str, tuple[float, int]]
    processed: set[str]
    max_staleness: int


class Master:
    """The pure policy object: offer deltas, ask ``ready``, run a ``round``; no I/O, no clock.

    ``now`` is any monotonic clock in seconds, passed in so tests control time. It takes over
    ``state``'s tensors. Pending deltas are not saved: their files stay in the repo until a
    round consumes them, so after a restart they are offered again. One thread drives it.
    A round is ``propose`` then ``commit``: the caller saves the proposal first, and a round
    whose save fails is simply not committed (its deltas stay pending). ``seen_step``, when
    set, is the newest step the repo holds: staleness is measured against what nodes could have
    seen, not against a step still on its way to the repo.
    """

    def __init__(
        self, config: MasterConfig, global_weights: Tensors, state: MasterState | None = None
    ):
        self.config = config
        if state is None:  # a fresh run, from copies: never the live model's tensors
            state = MasterState(0, fp32_copies(global_weights))
        buffers = state.optimizer_state.get("momentum_buffer", {})
        for what, tensors in (("weights", state.global_weights), ("momentum", buffers)):
            if problem := _layout_problem(tensors, global_weights, partial=what == "momentum"):
                raise ValueError(f"saved {what} do not fit the model: {problem}")
        # fp32 on the CPU (a no-op for a loaded state): outer steps must not round to bf16
        self._weights = {k: t.to("cpu", torch.float32) for k, t in state.global_weights.items()}
        self._step = state.outer_step
        self._processed = set(state.processed)
        self._optimizer = OuterOptimizer(config.outer_lr, config.outer_momentum, config.nesterov)
        self._optimizer.load_state_dict(state.optimizer_state)
        self._pending: dict[str, ReceivedDelta] = {}
        self._first_pending_at: float | None = None
        # node -> (its tokens per step, outer step then): the fleet's pace, which scales each
        # round (saved with the state: a restart publishes the same pace)
        self._fleet = {node: (float(rate), int(step)) for node, (rate, step) in state.fleet.items()}
        self._stale: list[str] = []  # settled since the last round, reported by the next
        self._bad: dict[str, str] = {}
        self.seen_step: int | None = None  # the repo's newest step of this master (the loop's)
        for message in config.warnings():
            warnings.warn(message, stacklevel=2)

    @property
    def outer_step(self) -> int:
        return self._step

    @property
    def global_weights(self) -> Tensors:
        """The live weights; a round replaces them with new tensors, never in place."""
        return self._weights

    @property
    def fleet_rate(self) -> float:
        """Tokens per step of every node heard from within max_staleness outer steps."""
        return _fleet_rate(self._fleet, self._step, self.config.max_staleness)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def visible_step(self) -> int:
        """The step staleness is measured against: the newest one nodes could have installed."""
        return self._step if self.seen_step is None else min(self._step, self.seen_step)

    def seen(self, identity: str) -> bool:
        """True if offering this identity now would be a duplicate."""
        return identity in self._processed or identity in self._pending

    def offer(self, delta: ReceivedDelta, now: float) -> str:
        """Returns "accepted", "duplicate", "stale" or "end" (an end marker: the node's run
        ended with nothing left to send, settled at once); raises BadDelta (settled) if
        unusable."""
        identity, header = delta.identity, delta.header
        if self.seen(identity):
            return "duplicate"
        if header.final and header.steps == 0:  # an end marker carries no work
            self._processed.add(identity)
            if any(bool(t.any()) for t in delta.tensors.values()):
                self._bad[identity] = "an end marker (0 steps) with non-zero tensors"
                raise BadDelta(self._bad[identity])
            return "end"
        problem = delta_problem(header, self._step) or _layout_problem(delta.tensors, self._weights)
        if problem or self.visible_step - header.base_outer_step > self.config.max_staleness:
            self._processed.add(identity)  # settled: a repeat is a duplicate, never counted
            if problem:
                self._bad[identity] = problem
                raise BadDelta(problem)
            self._stale.append(identity)
            return "stale"
        if not self._pending:
            self._first_pending_at = now
        self._pending[identity] = delta
        return "accepted"

    def ready(self, now: float) -> bool:
        """Quorum: >= min_deltas pending, or >= 1 pending for at least max_wait_s."""
        if not self._pending or len(self._pending) >= self.config.min_deltas:
            return bool(self._pending)
        return now - self._first_pending_at >= self.config.max_wait_s

    def round(self, now: float, force: bool = False) -> RoundResult | None:
        """``propose`` and ``commit`` at once (for callers with nothing to save between)."""
        result = self.propose(now, force)
        if result is not None:
            self.commit(result)
        return result

    def propose(self, now: float, force: bool = False) -> RoundResult | None:
        """Aggregate every pending delta into one outer step, without taking it; None if not
        ready. ``force`` runs on whatever is pending (the end of a run); still None if nothing
        is. Momentum is applied only if the round holds a quorum (module docstring)."""
        if not (force and self._pending) and not self.ready(now):
            return None
        cfg, pending = self.config, list(self._pending.values())
        got = aggregate(
            pending, self._step, cfg.max_staleness, cfg.staleness_discount, self.visible_step
        )
        weights, optimizer, fleet, step = self._weights, self._optimizer, self._fleet, self._step
        full, shared = False, None
        if got.included and cfg.shared_rounds:
            fleet = dict(self._fleet)
            weights, shared = shared_round(cfg, got, pending, weights, fleet, step)
            step += 1
        elif got.included:
            weights = {k: t.clone() for k, t in self._weights.items()}  # the live ones stay
            optimizer = copy.deepcopy(self._optimizer) if cfg.outer_momentum > 0 else optimizer
            fleet = dict(self._fleet)
            full = _apply(cfg, got, weights, optimizer, fleet, step)
            step += 1
        stale, bad = self._stale + got.stale, {**self._bad, **got.bad}
        mode = "off" if cfg.outer_momentum == 0 else "applied" if full else "pending"
        settled = self._processed | set(self._pending)
        candidate = _Candidate(step, weights, optimizer, fleet, settled, cfg.max_staleness)
        return RoundResult(
            step, weights, got.included, stale, bad, bool(full), got.tokens, mode, candidate, shared
        )

    def propose_same(self) -> RoundResult:
        """An outer step holding the same weights and no delta: the run's end takes one when
        its last round was published as an update on an older keyframe (``global_dtype``), so
        the final global is the master's weights exactly, under a step of its own (I3)."""
        cfg = self.config
        mode = "off" if cfg.outer_momentum == 0 else "pending"
        fleet, settled = dict(self._fleet), set(self._processed)
        candidate = _Candidate(
            self._step + 1, self._weights, self._optimizer, fleet, settled, cfg.max_staleness
        )
        stale, bad = list(self._stale), dict(self._bad)
        return RoundResult(candidate.step, self._weights, [], stale, bad, False, 0, mode, candidate)

    def commit(self, result: RoundResult) -> None:
        """Take on a proposed round's state (once it is saved): its deltas are settled."""
        c = result.candidate
        self._step, self._weights, self._optimizer = c.step, c.weights, c.optimizer
        self._fleet, self._processed = c.fleet, set(c.processed)
        self._pending, self._first_pending_at, self._stale, self._bad = {}, None, [], {}

    def snapshot(self) -> MasterState:
        """The state to save; it shares tensors with the master (a round never changes them)."""
        buffers = self._optimizer.state_dict()
        fleet = {node: [rate, step] for node, (rate, step) in self._fleet.items()}
        return MasterState(self._step, self._weights, buffers, set(self._processed), fleet=fleet)


def _fleet_rate(fleet: dict[str, tuple[float, int]], step: int, max_staleness: int) -> float:
    horizon = step - max_staleness
    return sum(rate for rate, seen in fleet.values() if seen >= horizon)


def _apply(cfg: MasterConfig, got: AggregateResult, weights, optimizer, fleet, step) -> bool:
    """One outer step from a round's mean on these (candidate) parts; whether momentum applied."""
    if cfg.policy == "naive":
        optimizer.step(weights, got.mean)
        return cfg.outer_momentum > 0
    for node, rate in got.rates.items():
        fleet[node] = (rate, step)
    round_rate = sum(got.rates.values())
    share = round_rate / max(_fleet_rate(fleet, step, cfg.max_staleness), round_rate)
    scaled = {k: v.mul(share) for k, v in got.mean.items()}
    return optimizer.delayed_step(weights, scaled, share)


def shared_round(cfg: MasterConfig, got: AggregateResult, deltas: list, weights, fleet, step):
    """``_apply``'s policy as every node repeats it (``global_dtype: deltas``, momentum 0): one
    coefficient per delta (node weight x chain's token share x fleet share), ``apply_round``."""
    share = 1.0
    if cfg.policy == "fleet":
        for node, rate in got.rates.items():
            fleet[node] = (rate, step)
        round_rate = sum(got.rates.values())
        share = round_rate / max(_fleet_rate(fleet, step, cfg.max_staleness), round_rate)
    by_id = {d.identity: d for d in deltas}
    included = [by_id[i] for i in got.included]
    chain_tokens: dict[tuple[str, str], int] = {}
    for delta in included:
        key = (delta.header.node_id, delta.header.chain)
        chain_tokens[key] = chain_tokens.get(key, 0) + delta.header.tokens
    node_tokens: dict[str, int] = {}
    for (node, _), tokens in chain_tokens.items():
        node_tokens[node] = node_tokens.get(node, 0) + tokens
    total = sum(got.node_weights.values())
    coefs = []
    for delta in included:
        node, chain = delta.header.node_id, delta.header.chain
        part = chain_tokens[(node, chain)] / node_tokens[node]
        coefs.append((delta.identity, share * got.node_weights[node] / total * part))
    parts = [(by_id[identity].tensors, coef) for identity, coef in coefs]
    return apply_round(weights, parts, cfg.outer_lr), (cfg.outer_lr, tuple(coefs))


def _layout_problem(tensors: dict, reference: dict, partial: bool = False) -> str | None:
    """Why ``tensors`` do not fit ``reference`` (names, shapes), or None; ``partial``: a subset."""
    extra, missing = set(tensors) - set(reference), set(reference) - set(tensors)
    if extra or (missing and not partial):
        return f"tensor names differ (missing {sorted(missing)}, extra {sorted(extra)})"
    for key, tensor in tensors.items():
        shape, expected = tuple(tensor.shape), tuple(reference[key].shape)
        if shape != expected:
            return f"tensor {key!r} has shape {shape}, expected {expected}"
    return None
