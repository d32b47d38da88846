"""The simulator behind ``convergence.py``: real DumbDiLoCo nodes, simulated time, latency.

Everything that decides what the model learns is the product's code: one ``MasterLoop`` over a
``LocalTransport`` on a temporary directory, and per worker a real Trainer (``build_runtime``)
with a ``WorkerPlugin(background=False)``, all in one process. Only time is simulated: an event
loop on a ``SimClock`` plays the parts of the threads the plug-in would otherwise start (the
uploader, the poller, the master's poll loop, ``sync_wait_s``'s wait), and ``LatentTransport``
makes every write reach the repo late.

The latency model (``Latency``), as fractions ``f`` of L, one inner loop of a *nominal* worker
(``inner_steps`` x ``step_seconds``; speed 1, the fleet's mean speed, so uneven fleets pay the
same seconds for the same link):

* **upload** f L: a delta is visible to the master f L after its upload starts. A node uploads
  one delta at a time, like the real ``Uploader``: deltas of boundaries that pass while it is
  busy wait in the outbox and fold into one (``worker/upload.fold``).
* **publish** f L: a round's weights and ``step_count.json`` become visible together (atomic)
  f L after the master's poll ran the round; the master is busy meanwhile, as its poll thread
  is inside ``transport.publish``, and polls again f L after it returns.
* **master poll** every f L; the deltas it reads cost their bytes over the master's downlink
  (with a link; the f arms: f/2 L per full fp32 global's bytes), and it publishes after them.
* **the master trains** (the product's default, issue 47): it runs on worker 0's machine and
  shares its uplink, so worker 0's uploads and the master's publishes queue behind each other.
  ``mx`` puts it on a fifth, non-training machine with its own uplink (the model before).
* **L is the loop that runs**: an inner loop of the inner optimizer the arm trains with (a Muon
  step costs ``MUON_STEP_COST`` AdamW steps), so f = 0.25 is the same link for every optimizer.
* **jitter** (``jit<x>``): each step takes its node's time times a log-normal factor of mean 1
  and spread x, drawn per node and seed.
* **stalls** (``stall<p>``, issue 54 item 6): after each inner loop, with chance p, a node
  pauses for one loop (another job, a sleeping laptop): slowdowns that do not average out
  over a loop as jitter does. **A jittery link** (``ljit<x>``): every upload, download and
  publish takes its time times a log-normal factor of spread x.
* **worker poll** every f L; a newer global takes f/2 L to download before the plug-in sees it
  in ``fetcher.ready``. ``install: eager`` installs it after the next optimizer step;
  ``boundary`` at the next boundary.
* **deltas** (``gdeltas``, issue 54: ``distributed.global_dtype: deltas``): no weights are
  published per round. The master's publish is a round record (``RECORD_BYTES``), plus the fp32
  weights as a keyframe every ``keyframe_every`` outer steps and at the run's last round; a
  node's download of a newer global is the deltas of every round it lacks that are not its own
  (each an ``encoding`` delta's bytes, on its downlink, after the record lands: no prefetch, and
  worker 0 downloads them although its master read them), and it never downloads a keyframe.
  The global each node installs is the master's exact fp32 result, as every node applies the
  round with the master's arithmetic; the product's code runs with ``global_dtype: fp32``.
* **sync_wait_s** (blocking synchronous DiLoCo): at a boundary the worker idles until its upload
  has landed and a global naming its delta is downloaded, polling every
  ``min(poll, 1 s)`` as ``WorkerPlugin._wait_for_own_round`` does (one step is 0.3 s here, the
  issue's unit), then installs it. The idle time is simulated time: it costs steps.

A run ends at a budget: at simulated time T (``until_s``: no step may end after it) or after
each worker's planned steps. Then the flush: every worker's ``on_train_end`` (a last boundary
for a partial loop), every upload in flight lands, the master runs its final forced round, and
its publish lands. The published global is scored by ``Evaluator`` at each publish that lands
and after the flush.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from speedtronic.distributed.codec import expected_delta_bytes
from speedtronic.distributed.global_update import GlobalReader
from speedtronic.distributed.master.loop import MasterLoop
from speedtronic.distributed.master.outer import MasterConfig
from speedtronic.distributed.protocol import BadDelta, is_keyframe_path, parse_delta_path
from speedtronic.distributed.transport import LocalTransport
from speedtronic.distributed.worker.plugin import WorkerPlugin, parameters_of
from speedtronic.errors import SpeedtronicError
from speedtronic.evaluate.loss_plugin import EvalPlugin
from speedtronic.runtime import build_runtime

SYNC_PACE_S = 1.0  # WorkerPlugin._wait_for_own_round polls every min(poll_interval, 1 s)
MAX_TIME_S = 1e7  # a simulation past this has a bug (e.g. a quorum that never comes)
RECORD_BYTES = 1024  # gdeltas: a round record (deltas, hashes, coefficients, weights' sha256)


@dataclass(frozen=True)
class Link:
    """A home link, in bytes per simulated second: each transfer costs ``fixed_s`` + bytes /
    bandwidth. ``up`` is a node's uplink (its deltas), ``down`` its downlink (the globals),
    ``master_up`` the master's uplink (its publishes of the global); the master's downlink (the
    deltas it reads) is a node's."""

    up: float
    down: float
    master_up: float
    fixed_s: float
    delta_bytes: int  # one delta in the arm's encoding
    weights_bytes: int  # one published global (fp32 full weights)


@dataclass(frozen=True)
class Latency:
    """Communication times in simulated seconds: ``fraction`` of one nominal inner loop, or,
    with a ``link``, the bytes each transfer moves over it (``bw`` arms)."""

    fraction: float
    loop_s: float
    link: Link | None = None
    weights_bytes: int = 0  # the f arms: a full fp32 global, the unit of a delta read's cost

    @property
    def upload_s(self) -> float:
        if self.link:
            return self.link.fixed_s + self.link.delta_bytes / self.link.up
        return self.fraction * self.loop_s

    @property
    def publish_s(self) -> float:
        if self.link:
            return self.link.fixed_s + self.link.weights_bytes / self.link.master_up
        return self.fraction * self.loop_s

    @property
    def download_s(self) -> float:
        if self.link:
            return self.link.fixed_s + self.link.weights_bytes / self.link.down
        return self.fraction * self.loop_s / 2

    def publish_time(self, nbytes: int) -> float:
        """A publish of ``nbytes`` (an update, a keyframe with it): over the link, by its
        bytes; without one, ``publish_s`` whatever it holds (the f arms' model)."""
        if self.link:
            return self.link.fixed_s + nbytes / self.link.master_up
        return self.publish_s

    def download_time(self, nbytes: int) -> float:
        if self.link:
            return self.link.fixed_s + nbytes / self.link.down
        return self.download_s

    def master_read_time(self, nbytes: int) -> float:
        """The master's download of ``nbytes`` of deltas (0 bytes: nothing read, no time)."""
        if nbytes <= 0:
            return 0.0
        if self.link:
            return self.link.fixed_s + nbytes / self.link.down
        return self.download_s * nbytes / self.weights_bytes if self.weights_bytes else 0.0

    @property
    def poll_s(self) -> float:
        # a link: poll about as often as an upload takes, the product's advice (diloco_facts)
        return self.upload_s if self.link else self.fraction * self.loop_s


# The named home link of the ``bw`` arms: asymmetric cable, 50 Mbit/s up, 250 down, so a
# downlink 5x the uplink; the master is a home machine too (its uplink is a node's). A fixed
# 1% of an inner loop per transfer stands for request round trips.
CABLE_DOWN_RATIO = 5.0
FIXED_SHARE = 0.01


def link_latency(arm: Any, scale: Any, params: dict[str, torch.Tensor]) -> Latency:
    """The ``bw`` arms' latency: the uplink on which a bf16 delta takes ``arm.latency`` x L
    (``scale.bandwidth`` in bytes per simulated second instead, if set), the rest by ratio. L is
    an inner loop of ``scale.inner_steps`` steps of the arm's own inner optimizer, whatever H
    the arm syncs at (``h<n>``): one link for every arm."""
    bf16 = expected_delta_bytes(params, "bf16")
    loop_s = scale.loop_s * arm.cost
    up = scale.bandwidth or bf16 / (arm.latency * loop_s)
    link = Link(
        up=up,
        down=up * scale.down_ratio,
        master_up=up * scale.master_up_ratio,
        fixed_s=FIXED_SHARE * loop_s,
        delta_bytes=expected_delta_bytes(params, arm.encoding),
        weights_bytes=expected_delta_bytes(params, "fp32"),
    )
    return Latency(arm.latency, loop_s, link)


class SimClock:
    """Simulated seconds: the master's clock (``max_wait_s``) and the transport's."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class LatentTransport:
    """``LocalTransport`` whose uploads and publishes land ``delay`` simulated seconds late.

    Readers (the master's listing, the workers' pollers) see only what has landed by the
    clock's now; a publish lands weights and step count together, as the real one is atomic.
    """

    def __init__(self, inner: LocalTransport, clock: SimClock):
        self.inner, self.clock = inner, clock
        self.upload_s = self.publish_s = 0.0
        self.latency: Latency | None = None  # publishes charged by their bytes when set
        # When a publish of this cost (s) lands, counted from now: the simulation's answer (the
        # master's reads before it, a shared uplink), or the cost itself
        self.publish_delay: Callable[[float], float] = lambda cost: cost
        self.last_publish_delay = 0.0
        self.delta_bytes_read = 0  # by the master: charged over its downlink
        self.keyframes: list[tuple[str, bytes]] = []  # the master's, landing with its publish
        self.keyframe_every = 0  # gdeltas: publishes carry a record, weights only as keyframes
        self.final = False  # the run's last round: a keyframe in gdeltas
        self.bytes_published = 0  # over the master's uplink
        self._in_air: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    # -- writes land late
    def upload(self, path: str, data: bytes) -> None:
        if is_keyframe_path(path):  # the master's uplink: sent just before the publish naming it
            self.keyframes.append((path, data))
            return
        self._later(self.upload_s, lambda: self.inner.upload(path, data))

    def publish(self, weights: bytes, step_count: dict[str, Any], consumed: list[str]) -> None:
        keyframes, self.keyframes = self.keyframes, []
        sent = len(weights) + sum(len(data) for _, data in keyframes)
        if self.keyframe_every:  # gdeltas: the record; the weights when a keyframe is due
            step = step_count["outer_step"]
            keyframe = self.final or step % self.keyframe_every == 0
            sent = RECORD_BYTES + (len(weights) if keyframe else 0)
        self.bytes_published += sent
        self.publish_s = self.latency.publish_time(sent) if self.latency else self.publish_s

        def land() -> None:
            for path, data in keyframes:
                self.inner.upload(path, data)
            self.inner.publish(weights, step_count, consumed)

        self.last_publish_delay = self.publish_delay(self.publish_s)
        self._later(self.last_publish_delay, land)

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        at = round(self.clock.now + delay, 9)  # as the event loop rounds its times
        heapq.heappush(self._in_air, (at, next(self._order), action))

    def land(self, everything: bool = False) -> float:
        """Apply what has landed by now (or everything in flight); the last landing time."""
        last = self.clock.now
        while self._in_air and (everything or self._in_air[0][0] <= self.clock.now):
            at, _, action = heapq.heappop(self._in_air)
            action()
            last = max(last, at)
        return last

    # -- reads see only what landed
    def list_deltas(self):
        self.land()
        return self.inner.list_deltas()

    def read(self, path: str, max_bytes: int):
        self.land()
        data = self.inner.read(path, max_bytes)
        if data and parse_delta_path(path) is not None:
            self.delta_bytes_read += len(data)
        return data

    def read_step_count(self):
        self.land()
        return self.inner.read_step_count()

    def describe(self) -> str:
        return self.inner.describe()

    def prepare(self, settings: Any, logger: Any) -> None:
        self.inner.prepare(settings, logger)

    def cadence_warnings(self, settings: Any, step_time_s: float | None) -> list[str]:
        return []

    def stats(self) -> dict[str, int]:
        return {}


class Log:
    """The logger the plug-ins talk to: counts events, keeps warnings, prints nothing."""

    def __init__(self, clock: SimClock):
        self.clock, self.rounds, self.warnings = clock, [], []
        self.counts: dict[str, int] = {}

    def log(self, event: str, payload: dict[str, Any]) -> None:
        self.counts[event] = self.counts.get(event, 0) + 1
        if event == "diloco_round":
            self.rounds.append({"time": self.clock.now, **payload})

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def notice(self, message: str) -> None:
        pass


# ---------------------------------------------------------------------- evaluation


def load_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, param in parameters_of(model).items():
            param.copy_(weights[name].to(param.device, param.dtype))


class Skip:
    """A loader's batches after its first ``count``: every iteration starts afresh."""

    def __init__(self, loader: Any, count: int):
        self.loader, self.count = loader, count

    def __iter__(self):
        return itertools.islice(iter(self.loader), self.count, None)


class Evaluator:
    """Held-out loss of given weights: an eval model and the configured ``EvalPlugin``."""

    def __init__(self, config: dict[str, Any], batches: int, final_batches: int):
        self.runtime = build_runtime(config, console=False)
        self.batches = (batches, final_batches)
        plugins = [p for p in self.runtime.trainer.plugins if isinstance(p, EvalPlugin)]
        if not plugins:
            raise SpeedtronicError("no EvalPlugin: the corpus has no held-out tail")
        self.plugin = plugins[0]
        # The test slice: the next ``batches`` held-out batches, never used to choose an arm
        self.test = EvalPlugin(Skip(self.plugin.loader, batches), 10**9, batches)
        self.reference = {
            k: p.detach().clone() for k, p in parameters_of(self.runtime.model).items()
        }  # the seed's initial weights: every arm of a seed starts here
        self.cache: tuple[int, float] | None = None
        self.last_weights: dict[str, torch.Tensor] | None = None  # of the last global read
        self.reader: GlobalReader | None = None  # keeps the keyframe, as a node's does

    def loss(self, weights: dict[str, torch.Tensor], final: bool = False) -> float:
        load_weights(self.runtime.model, weights)
        self.plugin.batches = self.batches[final]
        return float(self.plugin.evaluate(self.runtime.trainer)["eval_loss"])

    def test_loss(self, weights: dict[str, torch.Tensor] | None) -> float | None:
        """Held-out loss of ``weights`` on the test slice (the one the speedup is read on)."""
        if weights is None:
            return None
        load_weights(self.runtime.model, weights)
        return float(self.test.evaluate(self.runtime.trainer)["eval_loss"])

    def global_loss(self, transport: Any, final: bool = False) -> tuple[int, float]:
        """Read, validate and evaluate the published global (cached per outer step)."""
        counted = transport.read_step_count()
        if self.cache and counted and counted["outer_step"] == self.cache[0] and not final:
            return self.cache
        if self.reader is None or self.reader.transport is not transport:  # another arm's repo
            self.reader = GlobalReader(transport, self.reference)
        read = self.reader.read(expected_delta_bytes(self.reference, "fp32") + 2**20)
        self.last_weights = read.weights
        self.cache = (read.outer_step, self.loss(read.weights, final))
        return self.cache


# ---------------------------------------------------------------------- a prototype


class LookAheadWorker(WorkerPlugin):
    """PROTOTYPE, not in the product: an install also steps on by the other nodes' expected
    progress since the global (the staleness correction of Kale et al. 2025's eager updates and
    Ajanthan et al. 2025's momentum look-ahead, without outer momentum).

    A global lacks the other nodes' work since its round: about ``loops`` inner loops of it,
    where ``loops`` counts this node's own work the global lacks (its deltas not included, in
    steps, plus the progress since its boundary) in inner loops. The other nodes' progress per
    loop is estimated by the change between the last two globals installed, per outer step
    (with equal nodes a round is one fleet loop), times their part of the fleet
    (1 - this node's share). The estimate is added to the weights *and* to the base, so it
    never enters a delta: the master applies only trained work, and the next install replaces
    the estimate with the real global.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.previous: tuple[int, dict[str, torch.Tensor]] | None = None  # last raw global

    def install_ready(self, trainer: Any, carry_progress: bool = False) -> int | None:
        ready = self.fetcher.ready
        lacking = self._steps_lacking(ready, trainer) if ready is not None else 0
        installed = super().install_ready(trainer, carry_progress)
        if installed is None:
            return None
        previous, self.previous = self.previous, (ready.outer_step, ready.weights)
        if previous is None or not ready.fleet_rate:
            return installed
        share = min(1.0, self.rate / ready.fleet_rate)
        loops = lacking / self.config.inner_steps
        scale = (1.0 - share) * loops / (ready.outer_step - previous[0])
        with torch.no_grad():
            for name, param in self.params.items():
                step = (ready.weights[name] - previous[1][name]).to(param.device, param.dtype)
                param.add_(step, alpha=scale)
                self.base[name].add_(step, alpha=scale)
        return installed

    def _steps_lacking(self, ready: Any, trainer: Any) -> int:
        """This node's steps that ``ready`` lacks: deltas sent or queued after its newest
        included one, and the progress since the last boundary."""
        up = self.uploader
        missing = [b.last - max(b.first - 1, ready.own_seq) for b in up.in_flight]
        steps_per_delta = self.config.inner_steps
        lacking = sum(max(0, m) for m in missing) * steps_per_delta
        for pending in (up.exact, up.sending, up.outbox):
            if pending is not None and not 0 < pending.seq <= ready.own_seq:
                lacking += pending.steps
        return lacking + trainer.step - self.boundary_step


# ---------------------------------------------------------------------- the event loop


@dataclass
class SimNode:
    """One worker: its runtime and plug-in, and what the simulated threads are doing."""

    runtime: Any
    plugin: Any
    step_s: float
    planned: int  # steps, for a token budget
    upload_free_at: float = 0.0  # its uploader is busy until then
    downloading: Any = None  # a global being downloaded (a fetcher ``Ready``)
    waiting_since: float | None = None  # sync_wait_s: idle at a boundary since then
    idle_s: float = 0.0
    parked: bool = False  # the sync wait goes on when the download in flight ends
    finished: bool = False
    jitter: float = 0.0  # log-normal spread of a step's time (``jit<x>``)
    rng: random.Random | None = None  # draws the jitter
    bytes_down: int = 0  # what its downloads of newer globals were charged
    stall: float = 0.0  # ``stall<p>``: the chance that a loop is followed by a loop's pause
    stall_rng: random.Random | None = None  # draws the stalls (apart: jitter draws unchanged)
    stalls: int = 0

    def next_step_s(self) -> float:
        """This step's time: ``step_s``, times a log-normal factor of mean 1 with jitter."""
        if not self.jitter:
            return self.step_s
        return self.step_s * lognormal(self.rng, self.jitter)

    def pause_s(self) -> float:
        """``stall<p>``: after a boundary, with chance p, the machine does something else for
        one inner loop's time (another job, a sleeping laptop): correlated, unlike jitter."""
        trainer, plugin = self.runtime.trainer, self.plugin
        if not self.stall or trainer.step == 0 or plugin.boundary_step != trainer.step:
            return 0.0
        if self.stall_rng.random() >= self.stall:
            return 0.0
        self.stalls += 1
        return plugin.config.inner_steps * self.step_s


def lognormal(rng: random.Random, spread: float) -> float:
    """A log-normal factor of mean 1 (1.0 when ``spread`` is 0)."""
    return math.exp(rng.gauss(0.0, spread) - spread**2 / 2) if spread else 1.0


# Event kinds, in the order they act at the same instant: what lands first, then who reads it
UPLOAD_DONE, MASTER, LANDED, FETCH_DONE, FETCH, SYNC, STEP = range(7)


@dataclass
class Simulation:
    """Runs the nodes against the master on the simulated clock (module docstring)."""

    nodes: list[SimNode]
    loop: Any  # MasterLoop
    transport: LatentTransport
    clock: SimClock
    latency: Latency
    sync: bool
    until_s: float | None  # time budget; None: each node's planned steps
    on_publish: Callable[[float], None]  # a publish landed at this time
    log: Any = None  # the plug-ins' Log
    master_node: int | None = 0  # the worker whose machine (and uplink) the master shares
    uplink_free_at: float = 0.0  # that shared uplink is busy until then
    replay_bytes: int = 0  # gdeltas: one delta's bytes, which nodes download per other delta
    link_jitter: float = 0.0  # ``ljit<x>``: every transfer's time times a log-normal factor
    link_rng: random.Random = field(default_factory=lambda: random.Random(0))
    rounds: dict[int, list[str]] = field(default_factory=dict)  # outer step -> its deltas' nodes
    _poll_bytes: int = 0  # delta bytes the master had read when its current poll began
    _events: list = field(default_factory=list)
    _order: Any = field(default_factory=itertools.count)

    def at(self, time: float, kind: int, node: int = -1) -> None:
        # Rounded: sums of float steps must not reorder events that happen at the same instant
        heapq.heappush(self._events, (round(time, 9), kind, node, next(self._order)))

    def run(self) -> float:
        """Until every node has finished; returns the time of the last step."""
        lat = self.latency
        self.transport.upload_s, self.transport.publish_s = lat.upload_s, lat.publish_s
        self.transport.latency = lat
        self.transport.publish_delay = self._publish_delay
        self.at(lat.poll_s, MASTER)
        for i, node in enumerate(self.nodes):
            self.at(node.next_step_s(), STEP, i)
            self.at(lat.poll_s, FETCH, i)
        end, handlers = 0.0, self._handlers()
        while self._events and not all(n.finished for n in self.nodes):
            time, kind, i, _ = heapq.heappop(self._events)
            if self.until_s is not None and time > self.until_s + 1e-9:
                return self.until_s  # nodes still waiting (sync) stop here
            if time > MAX_TIME_S:
                raise SpeedtronicError("the simulation does not end: a quorum never came?")
            self.clock.now = time
            end = max(end, time) if kind == STEP else end
            handlers[kind](time, i)
        return self.until_s if self.until_s is not None else end

    def _handlers(self) -> dict[int, Callable[[float, int], None]]:
        return {
            STEP: self._step,
            UPLOAD_DONE: self._upload_done,
            MASTER: self._master,
            LANDED: lambda t, _: self.on_publish(t),
            FETCH: self._fetch,
            FETCH_DONE: self._fetch_done,
            SYNC: self._sync_poll,
        }

    # -- a worker's optimizer step
    def _step(self, now: float, i: int) -> None:
        node = self.nodes[i]
        trainer, plugin = node.runtime.trainer, node.plugin
        boundary = trainer.step + 1 - plugin.boundary_step >= plugin.config.inner_steps
        held = plugin.fetcher.take() if self.sync and boundary else None  # installed after the wait
        trainer.train_step()
        plugin.after_optimizer_step(trainer)
        self._send(now, node, i)
        if self.sync and plugin.boundary_step == trainer.step:
            if held is not None and plugin.fetcher.ready is None:
                plugin.fetcher.ready = held
            node.waiting_since = now
            self.at(now, SYNC, i)
            return
        self._next_step(now, node, i)

    def _next_step(self, now: float, node: SimNode, i: int) -> None:
        trainer = node.runtime.trainer
        step_s = node.next_step_s() + node.pause_s()
        over_time = self.until_s is not None and now + step_s > self.until_s + 1e-9
        over_steps = self.until_s is None and trainer.step >= node.planned
        if over_time or over_steps:
            self._finish(now, node, i)
        else:
            self.at(now + step_s, STEP, i)

    def _finish(self, now: float, node: SimNode, i: int) -> None:
        """The product's end of training: a last boundary for the steps since the previous one;
        its upload goes out with the flush."""
        node.finished = True
        node.plugin.on_train_end(node.runtime.trainer, None)

    # -- the uploader thread: one upload at a time, later deltas fold in the outbox
    def _send(self, now: float, node: SimNode, i: int) -> None:
        uploader = node.plugin.uploader
        if node.upload_free_at <= now and uploader.unsent():
            shared = i == self.master_node
            start = max(now, self.uplink_free_at) if shared else now  # behind a publish
            node.upload_free_at = start + self._link_s(self.latency.upload_s)
            self.transport.upload_s = node.upload_free_at - now
            uploader.send_pending()  # lands then (LatentTransport)
            if shared:
                self.uplink_free_at = node.upload_free_at
            self.at(node.upload_free_at, UPLOAD_DONE, i)

    def _upload_done(self, now: float, i: int) -> None:
        if not self.nodes[i].finished:
            self._send(now, self.nodes[i], i)

    # -- the master's poll thread
    def _master(self, now: float, _: int) -> None:
        self._poll_bytes = self.transport.delta_bytes_read
        result = self.loop.poll_once()
        self._record(result)
        if result is None:
            self.at(now + self._read_s() + self.latency.poll_s, MASTER)
            return
        landed = now + self.transport.last_publish_delay  # busy reading and publishing till then
        self.at(landed, LANDED)
        self.at(landed + self.latency.poll_s, MASTER)

    def _record(self, result: Any) -> None:
        """The nodes whose deltas make the round's outer step (gdeltas downloads them)."""
        if result is not None:
            nodes = [identity.split("/")[0] for identity in result.included]
            self.rounds[result.outer_step] = nodes

    def replay_bytes_for(self, node_id: str, held: int, new: int) -> int:
        """gdeltas: the bytes a node holding outer step ``held`` downloads to apply the rounds
        up to ``new`` itself: every delta of those rounds that is not its own."""
        steps = range(held + 1, new + 1)
        others = sum(n != node_id for s in steps for n in self.rounds.get(s, []))
        return others * self.replay_bytes

    def _read_s(self) -> float:
        """The time the deltas read in this poll took to download."""
        return self.latency.master_read_time(self.transport.delta_bytes_read - self._poll_bytes)

    def _publish_delay(self, cost: float) -> float:
        """A publish starts after this poll's reads, and on a shared uplink after what it is
        sending; it lands ``cost`` later. Returns when, counted from now."""
        now = self.clock.now
        start, cost = now + self._read_s(), self._link_s(cost)
        if self.master_node is not None:
            start = max(start, self.uplink_free_at)
            self.uplink_free_at = start + cost
        return start + cost - now

    def _link_s(self, seconds: float) -> float:
        """A transfer's time on a jittery link (``ljit<x>``): a slow upload, a busy line."""
        return seconds * lognormal(self.link_rng, self.link_jitter)

    # -- the worker's poller thread: a newer global is ready download_s after it is seen
    def _fetch(self, now: float, i: int) -> None:
        node = self.nodes[i]
        if node.finished:
            return
        took = (
            self._start_download(now, node, i, FETCH_DONE) if node.waiting_since is None else None
        )
        if took is not None:
            self.at(now + took + self.latency.poll_s, FETCH, i)
        else:
            self.at(now + self.latency.poll_s, FETCH, i)

    def _start_download(self, now: float, node: SimNode, i: int, done: int) -> float | None:
        """Look for a newer global; if there is one, it is ready the time its bytes take later
        (an update; a keyframe too when the node does not hold it). None: nothing to fetch."""
        fetcher = node.plugin.fetcher
        if node.downloading is not None:  # one refresh at a time (the fetcher's lock)
            return None
        before, counted = fetcher.ready, fetcher.status.counters["bytes_down"]
        fetcher.refresh()
        if fetcher.ready is before:
            return None
        nbytes = fetcher.status.counters["bytes_down"] - counted
        if self.replay_bytes:
            held = max(fetcher.installed_step, before.outer_step if before else -1)
            node_id = node.plugin.config.node_id
            nbytes = self.replay_bytes_for(node_id, held, fetcher.ready.outer_step)
        node.bytes_down += nbytes
        node.downloading, fetcher.ready = fetcher.ready, before  # not there before the download
        took = self._link_s(self.latency.download_time(nbytes))
        self.at(now + took, done, i)
        return took

    def _fetch_done(self, now: float, i: int) -> None:
        node = self.nodes[i]
        fetcher, new = node.plugin.fetcher, node.downloading
        node.downloading = None
        known = max(fetcher.installed_step, fetcher.ready.outer_step if fetcher.ready else -1)
        if new is not None and new.outer_step > known:
            fetcher.ready = new
        if node.parked:
            node.parked = False
            self._sync_check(now, node, i)

    # -- sync_wait_s: idle at the boundary until a global holds this node's delta
    def _sync_poll(self, now: float, i: int) -> None:
        node = self.nodes[i]
        uploader = node.plugin.uploader
        landed = node.upload_free_at <= now and not uploader.unsent()
        if node.downloading is not None or (
            landed and self._start_download(now, node, i, FETCH_DONE) is not None
        ):
            node.parked = True  # the check follows the download
            return
        self._sync_check(now, node, i)

    def _sync_check(self, now: float, node: SimNode, i: int) -> None:
        if node.waiting_since is None:
            return
        plugin = node.plugin
        ready = plugin.fetcher.ready
        if ready is None or ready.own_seq < plugin.uploader.seq:
            self.at(now + min(self.latency.poll_s, SYNC_PACE_S), SYNC, i)
            return
        plugin.install_ready(node.runtime.trainer)
        node.idle_s += now - node.waiting_since
        node.waiting_since = None
        self._next_step(now, node, i)

    # -- the end
    def flush(self, end: float) -> float:
        """After the budget: uploads in flight land, the master's final round publishes, and
        that lands. Returns the simulated time it all took to land."""
        self.clock.now = end
        for node in self.nodes:
            if node.waiting_since is not None:  # idle at the end: the wait counts to the end
                node.idle_s += end - node.waiting_since
                node.waiting_since = None
            if not node.finished:
                self._finish(end, node, -1)
        self.clock.now = self.transport.land(everything=True)
        self._poll_bytes = self.transport.delta_bytes_read
        self.transport.final = True
        self._record(self.loop.poll_once(force=True))
        self.clock.now += self.transport.last_publish_delay
        self.transport.land(everything=True)
        return self.clock.now


# ---------------------------------------------------------------------- arms and sizes

EVAL_FRACTION = 0.05  # the corpus tail held out for evaluation, never trained on
UNEVEN_SPEEDS = (1.0, 1.3, 2.6, 5.7)


@dataclass(frozen=True)
class Scale:
    """Model, data and schedule sizes shared by every arm; T = ``steps`` x ``step_seconds``."""

    steps: int = 600  # optimizer steps of one worker in T (12 inner loops)
    inner_steps: int = 50  # H
    batch: int = 8  # sequences per worker step (16 before issue 19: half the CPU per run)
    seq_len: int = 64
    d_model: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2
    lr: float = 3.0e-3
    warmup: int = 20
    workers: int = 4
    speeds: tuple[float, ...] = UNEVEN_SPEEDS  # uneven fleets, scaled to a mean of 1
    eval_every: int = 50  # arm a: steps between evaluations (DiLoCo arms: every publish)
    eval_batches: int = 4  # 4 x 128 x 64 = 33k held-out tokens, the same ones every time
    eval_batch: int = 128  # sequences per eval batch
    step_seconds: float = 0.3  # simulated duration of a speed-1 step (the issue's unit)
    device: str = "cpu"
    # ``bw`` arms (issue 38): a node's uplink in bytes per simulated second (None: the one on
    # which a bf16 delta takes f x L), its downlink and the master's uplink as ratios to it
    bandwidth: float | None = None
    down_ratio: float = CABLE_DOWN_RATIO
    master_up_ratio: float = 1.0

    @property
    def until_s(self) -> float:
        return self.steps * self.step_seconds

    @property
    def loop_s(self) -> float:
        """L: one inner loop of a nominal (speed 1) worker, the unit of latency."""
        return self.inner_steps * self.step_seconds


@dataclass(frozen=True)
class Arm:
    """One arm, parsed from its name (``convergence.py``'s docstring)."""

    name: str
    fleet: str  # "single" | "equal" | "uneven"
    latency: float = 0.25  # f
    install: str = "boundary"  # distributed.install
    sync: bool = False  # sync_wait_s > 0 and min_deltas = nodes: blocking synchronous DiLoCo
    reset_inner: bool = True  # distributed.reset_inner_optimizer
    reapply_own: bool = True  # distributed.reapply_own_delta
    budget: str = "time"  # "time": stop at T; "tokens": each worker does ``steps`` steps
    dylu: bool = False  # dynamic local updates: inner_steps scaled by the node's speed
    lookahead: bool = False  # prototype ``LookAheadWorker`` (not in the product)
    policy: dict[str, Any] = field(default_factory=dict)  # MasterConfig overrides
    inner: str = "adamw"  # the inner optimizer: optimizer.name
    cost: float = 1.0  # a step's time over an AdamW step's: more time, fewer steps in T
    encoding: str = "bf16"  # distributed.delta_dtype
    feedback: bool = True  # distributed.error_feedback
    bandwidth: bool = False  # latency from bytes over a link (``Link``), f = a bf16 delta's
    global_dtype: str = "fp32"  # distributed.global_dtype (``gint8``, ``gint4``, ``gdeltas``)
    keyframe_every: int = 10  # distributed.keyframe_every (``kf<n>``)
    master_apart: bool = False  # ``mx``: the master on a fifth machine, not worker 0's
    jitter: float = 0.0  # ``jit<x>``: log-normal spread of every step's time
    stall: float = 0.0  # ``stall<p>``: a loop's pause after a loop, with chance p
    link_jitter: float = 0.0  # ``ljit<x>``: log-normal spread of every transfer's time
    inner_steps: int | None = None  # ``h<n>``: H for this arm (the link stays the scale's)
    batch: int | None = None  # ``b<n>`` (arm a): sequences per step, at the same step time
    steps: int | None = None  # ``s<n>``: T for this arm, in AdamW steps (the scale's ``steps``)


POLICY_KEYS = {
    "lr": ("outer_lr", float),
    "m": ("outer_momentum", float),
    "md": ("min_deltas", int),
    "sd": ("staleness_discount", float),
    "ms": ("max_staleness", int),
}
FLAGS = {
    "eager": {"install": "eager"},
    "sync": {"sync": True},
    "keep": {"reset_inner": False},
    "bare": {"reapply_own": False},
    "tok": {"budget": "tokens"},
    "dylu": {"dylu": True},
    "la": {"lookahead": True},
    "muon": {"inner": "muon"},
    "noef": {"feedback": False},
    "bw": {"bandwidth": True},
    "mx": {"master_apart": True},
    **{encoding: {"encoding": encoding} for encoding in ("fp32", "bf16", "int8", "int4", "int2")},
    **{f"g{dtype}": {"global_dtype": dtype} for dtype in ("int8", "int4", "deltas")},
}
# Muon as the inner optimizer (issue 30): the settings time_to_quality.py chose at the 0.43M
# size, and what a step costs over an AdamW step at this benchmark's batch (8 x 64 tokens),
# measured on this machine by ``diloco_convergence.py --muon-cost`` (docs/benchmarks.md)
MUON_INNER = {"name": "muon", "muon_lr": 0.02}
MUON_STEP_COST = 1.3  # 1.30 (rounds 1.15-1.38), 1 thread, CPU time, AVX512-BF16 CPU


def parse_arm(name: str) -> Arm:
    """``a``, or ``c`` (4 equal workers) / ``d`` (uneven) followed by ``_``-separated modifiers:
    ``f<fraction>`` latency, ``eager``, ``sync``, ``keep``, ``bare``, ``tok``, ``dylu``, ``la``,
    ``naive`` (outer policy), ``lr<x>``, ``m<x>``, ``md<n>``, ``sd<x>``, ``ms<n>``, an encoding
    (``fp32``, ``bf16``, ``int8``, ``int4``, ``int2``), ``noef`` (no error feedback), ``bw``
    (latency from bytes over a link: ``link_latency``), ``gint8`` / ``gint4`` (the global as an
    update on a keyframe: ``global_dtype``), ``gdeltas`` (no global published: each node
    applies the round from the others' deltas, issue 54), ``kf<n>`` (``keyframe_every``),
    ``mx`` (the master on a machine of its own), ``jit<x>`` (jittery steps), ``stall<p>`` (a
    loop's pause after a loop, chance p), ``ljit<x>`` (jittery transfers), ``h<n>`` (H),
    ``s<n>`` (T in AdamW steps; arm a: evaluated at its end only, a rung of the speedup's
    ladder) and, for arm a only, ``b<n>`` (its batch at the same step time: data parallel with
    a free all-reduce)."""
    head, *mods = name.split("_")
    values: dict[str, Any] = {"policy": {}}
    if "muon" in mods:
        values["cost"] = MUON_STEP_COST
    counts = [m for m in mods if _count(m, "s") or (head == "a" and _count(m, "b"))]
    for mod in counts:
        values["steps" if mod[0] == "s" else "batch"] = _count(mod, mod[0])
    mods = [m for m in mods if m not in counts]
    if head == "a":
        inner = [m for m in mods if m == "muon" or m.startswith("cost")]
        if inner != mods:
            raise ValueError(f"arm {name!r}: a takes only muon, cost<x>, b<n> and s<n>")
        return Arm(name, "single", latency=0.0, **_inner(name, mods, values))
    if head not in ("c", "d"):
        raise ValueError(f"arm {name!r}: unknown fleet {head!r} (a, c, d)")
    for mod in mods:
        if mod.startswith("cost"):
            continue  # _inner's
        if mod in FLAGS:
            values.update(FLAGS[mod])
        elif mod == "naive":
            values["policy"]["policy"] = "naive"
        elif mod.startswith("f") and _number(mod[1:]) is not None:
            values["latency"] = _number(mod[1:])
        elif mod.startswith("kf") and mod[2:].isdigit() and int(mod[2:]) >= 1:
            values["keyframe_every"] = int(mod[2:])
        elif _count(mod, "h"):
            values["inner_steps"] = _count(mod, "h")
        elif mod.startswith("jit") and (_number(mod[3:]) or -1) >= 0:
            values["jitter"] = _number(mod[3:])
        elif mod.startswith("ljit") and (_number(mod[4:]) or -1) >= 0:
            values["link_jitter"] = _number(mod[4:])
        elif mod.startswith("stall") and 0 <= (_number(mod[5:]) or -1) < 1:
            values["stall"] = _number(mod[5:])
        else:
            prefix = next((p for p in ("md", "sd", "ms", "lr", "m") if mod.startswith(p)), None)
            if prefix is None or _number(mod[len(prefix) :]) is None:
                raise ValueError(f"arm {name!r}: unknown modifier {mod!r}")
            key, kind = POLICY_KEYS[prefix]
            values["policy"][key] = kind(_number(mod[len(prefix) :]))
    return Arm(name, "equal" if head == "c" else "uneven", **_inner(name, mods, values))


def _inner(name: str, mods: list[str], values: dict[str, Any]) -> dict[str, Any]:
    """``muon`` (the inner optimizer, at ``MUON_STEP_COST``) and ``cost<x>`` (a step's time)."""
    for mod in mods:
        if mod == "muon":
            values["inner"] = "muon"
        elif mod.startswith("cost"):
            if _number(mod[4:]) is None or _number(mod[4:]) <= 0:
                raise ValueError(f"arm {name!r}: cost<x> needs a positive number")
            values["cost"] = _number(mod[4:])
    return values


def _count(mod: str, prefix: str) -> int | None:
    """``n`` for a modifier ``<prefix><n>`` with n a positive integer; None otherwise."""
    rest = mod[len(prefix) :]
    return int(rest) if mod.startswith(prefix) and rest.isdigit() and int(rest) > 0 else None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


# ---------------------------------------------------------------------- one job


def make_config(
    scale: Scale,
    corpus: str,
    out_dir: str,
    seed: int,
    batch: int,
    horizon: int,
    eval_batches: int = 0,
    inner: str = "adamw",
) -> dict[str, Any]:
    """A worker's (or the eval model's) config; ``horizon`` is the cosine schedule's length."""
    optimizer = {"lr": scale.lr, "weight_decay": 0.1, "grad_clip": 1.0}
    if inner == "muon":
        optimizer.update(MUON_INNER)
    return {
        "run": {
            "name": "diloco-convergence",
            "seed": seed,
            "device": scale.device,
            "max_steps": horizon,
            "output_dir": out_dir,
        },
        "model": {
            "name": "reference_transformer",
            "vocab_size": 256,
            "seq_len": scale.seq_len,
            "n_layer": scale.n_layer,
            "n_head": scale.n_head,
            "n_kv_head": scale.n_kv_head,
            "d_model": scale.d_model,
        },
        "data": {
            "text_path": corpus,
            "tokenizer": "byte",
            "micro_batch_size": batch,
            "target_batch_size": batch,
            "eval_fraction": EVAL_FRACTION,
            "eval_every": 10**9 if eval_batches else 0,
            "eval_batches": max(1, eval_batches),
        },
        "optimizer": optimizer,
        "scheduler": {"name": "cosine", "warmup_steps": scale.warmup, "min_lr_ratio": 0.1},
        "precision": {"mode": "fp32"},
        "checkpoint": {"interval": 0},
        "logging": {"every_steps": 10**9},
    }


def data_seed(seed: int, worker: int) -> int:
    """Worker ``w`` of seed ``s`` reads the corpus in its own order (arm a reads worker 0's)."""
    return 1000 * seed + worker + 1


# A model small enough that a dry run of the event loop costs seconds: the timing of every
# event depends on the clock and the latency only, never on the weights
DRY = dict(d_model=8, n_layer=1, n_head=1, n_kv_head=1, batch=1, seq_len=8)


class Job:
    """One (arm, seed) run; ``run()`` returns its result record."""

    def __init__(self, arm: Arm, seed: int, scale: Scale, corpus: str, tmp: Any):
        if arm.steps:
            scale = replace(scale, steps=arm.steps)
        self.arm, self.seed, self.scale, self.corpus, self.tmp = arm, seed, scale, corpus, tmp
        self.final_weights: dict[str, torch.Tensor] | None = None  # scored on the test slice
        self.curve: list[list[float]] = []  # [simulated s, tokens (all workers), loss, step]
        self.status = "completed"

    def run(self) -> dict[str, Any]:
        wall, cpu = time.perf_counter(), time.process_time()
        scale = self.scale
        config = make_config(
            scale, self.corpus, str(self.tmp / "eval"), self.seed, scale.eval_batch, 1,
            scale.eval_batches,
        )  # fmt: skip
        self.evaluator = Evaluator(config, scale.eval_batches, scale.eval_batches)
        extra: dict[str, Any] = {}
        try:
            extra = self._single() if self.arm.fleet == "single" else self._diloco()
        except (SpeedtronicError, BadDelta) as exc:  # e.g. non-finite weights: diverged
            self.status = f"failed: {str(exc).splitlines()[0][:200]}"
        final = self.curve[-1][2] if self.curve and self.status == "completed" else None
        test = self.evaluator.test_loss(self.final_weights) if final is not None else None
        return {
            "arm": self.arm.name,
            "seed": self.seed,
            "status": self.status,
            "latency": self.arm.latency,
            "fleet": self.arm.fleet,
            "curve": self.curve,
            "final_eval_loss": final if final is not None and math.isfinite(final) else None,
            "final_test_loss": test if test is not None and math.isfinite(test) else None,
            "until_s": scale.until_s,
            "wall_s": time.perf_counter() - wall,
            "cpu_s": time.process_time() - cpu,
            **extra,
        }

    def _runtime(self, worker: int, horizon: int, name: str, scale: Scale | None = None) -> Any:
        scale = scale or self.scale
        seed = data_seed(self.seed, worker)
        batch = self.arm.batch or scale.batch
        config = make_config(
            scale, self.corpus, str(self.tmp / name), seed, batch, horizon, inner=self.arm.inner
        )
        return build_runtime(config, console=False)

    def _point(self, time_s: float, tokens: int, weights_fn: Callable) -> None:
        step, loss = weights_fn()
        self.curve.append([time_s, tokens, loss if math.isfinite(loss) else None, step])

    # -- a: one worker
    def _single(self) -> dict[str, Any]:
        scale, cost = self.scale, self.arm.cost
        steps = int(scale.steps / cost + 1e-6)  # what fits in T at this step's cost
        runtime = self._runtime(0, steps, "single")
        load_weights(runtime.model, self.evaluator.reference)
        runtime.model.train()
        trainer = runtime.trainer

        def weights() -> tuple[int, float]:
            return trainer.step, self.evaluator.loss(dict(parameters_of(runtime.model)))

        self._point(0.0, 0, weights)
        every = steps if self.arm.steps else scale.eval_every  # a rung: its end only
        for _ in range(steps):
            trainer.train_step()
            if trainer.step % every == 0 or trainer.step == steps:
                self._point(trainer.step * scale.step_seconds * cost, trainer.tokens, weights)
        self.final_weights = dict(parameters_of(runtime.model))
        return {"workers": 1, "steps_per_worker": [trainer.step], "idle_share": 0.0}

    # -- c, d: DumbDiLoCo
    def _fleet(self) -> tuple[list[float], list[int]]:
        """Each node's speed (the fleet's mean is 1) and inner_steps."""
        scale, n = self.scale, self.scale.workers
        speeds = [1.0] * n
        if self.arm.fleet == "uneven":
            if len(scale.speeds) != n:
                raise ValueError(f"--speeds needs {n} values")
            speeds = [s * n / sum(scale.speeds) for s in scale.speeds]
        h = self.arm.inner_steps or scale.inner_steps
        inner = [max(1, round(h * s)) if self.arm.dylu else h for s in speeds]
        return speeds, inner

    def _planned(self, speeds: list[float]) -> list[int]:
        """Steps per node: what fits in T (sync: measured by a dry run), or ``steps`` each."""
        scale = self.scale
        if self.arm.budget == "tokens":
            return [scale.steps] * len(speeds)
        if self.arm.sync:  # its schedule must end at T like every other arm's
            return self._dry_run()
        step_s = scale.step_seconds * self.arm.cost
        return [int(scale.until_s * s / step_s + 1e-6) for s in speeds]

    def _dry_run(self) -> list[int]:
        dry = replace(self.scale, **DRY)
        speeds, _ = self._fleet()
        step_s = dry.step_seconds * self.arm.cost
        horizons = [int(dry.until_s * s / step_s + 1e-6) for s in speeds]
        sim, nodes, _ = self._build(dry, horizons, "dry", initial=None, on_publish=lambda t: None)
        sim.run()
        return [node.runtime.trainer.step for node in nodes]

    def _build(self, scale: Scale, horizons: list[int], name: str, initial, on_publish):
        arm = self.arm
        speeds, inner = self._fleet()
        clock = SimClock()
        log = Log(clock)
        transport = LatentTransport(LocalTransport(self.tmp / f"{name}-repo"), clock)
        policy = {("outer_policy" if k == "policy" else k): v for k, v in arm.policy.items()}
        if arm.sync:
            policy.setdefault("min_deltas", len(speeds))
        runtimes = [self._runtime(i, h, f"{name}-w{i}", scale) for i, h in enumerate(horizons)]
        params = initial or parameters_of(runtimes[0].model)
        latency = Latency(
            arm.latency, scale.loop_s * arm.cost, weights_bytes=expected_delta_bytes(params, "fp32")
        )
        if arm.bandwidth:
            latency = link_latency(arm, scale, params)
        settings = SimpleNamespace(
            **{**MASTER_DEFAULTS, **policy},
            poll_interval=latency.poll_s,
            inner_steps=arm.inner_steps or scale.inner_steps,
            reset_inner_optimizer=arm.reset_inner,
            reapply_own_delta=arm.reapply_own,
            sync_wait_s=3600.0 if arm.sync else 0.0,  # the event loop models the wait
            delta_dtype=arm.encoding,
            error_feedback=arm.feedback,
            global_dtype="fp32" if arm.global_dtype == "deltas" else arm.global_dtype,
            keyframe_every=arm.keyframe_every,
            upload_timeout_s=1.0,
            install=arm.install,
        )
        if initial is None:  # a dry run: any weights of the right shapes
            initial = {k: p.detach().clone() for k, p in parameters_of(runtimes[0].model).items()}
        loop = MasterLoop(
            settings, {k: t.clone() for k, t in initial.items()}, transport, log,
            self.tmp / f"{name}-master", clock=clock.monotonic,
        )  # fmt: skip
        loop.start()  # publishes the initial global (outer step 0), landed at once
        transport.land(everything=True)
        transport.bytes_published = 0  # the initial global: before the run's clock starts
        nodes = []
        for i, runtime in enumerate(runtimes):
            node_settings = SimpleNamespace(
                **{**vars(settings), "inner_steps": inner[i]}, node_id=f"worker-{i}"
            )
            kind = LookAheadWorker if arm.lookahead else WorkerPlugin
            plugin = kind(node_settings, runtime.model, transport, log, background=False)
            runtime.model.train()
            plugin.on_train_start(runtime.trainer)  # installs the published global
            step_s = scale.step_seconds * arm.cost / speeds[i]
            rng = random.Random(data_seed(self.seed, i))  # the same draws in the dry run
            stalls = random.Random(data_seed(self.seed, i) + 7919)  # apart from the jitter's
            nodes.append(SimNode(runtime, plugin, step_s, horizons[i], jitter=arm.jitter, rng=rng,
                                 stall=arm.stall, stall_rng=stalls))  # fmt: skip
        until = scale.until_s if arm.budget == "time" else None
        sim = Simulation(nodes, loop, transport, clock, latency, arm.sync, until, on_publish, log)
        sim.master_node = None if arm.master_apart else 0
        sim.link_jitter, sim.link_rng = arm.link_jitter, random.Random(data_seed(self.seed, 99))
        if arm.global_dtype == "deltas":
            transport.keyframe_every = arm.keyframe_every
            sim.replay_bytes = latency.link.delta_bytes if latency.link else 1
        return sim, nodes, loop

    def _diloco(self) -> dict[str, Any]:
        scale = self.scale
        speeds, inner = self._fleet()
        planned = self._planned(speeds)
        holder: dict[str, Any] = {}

        def tokens() -> int:
            return sum(node.runtime.trainer.tokens for node in holder["nodes"])

        def on_publish(time_s: float) -> None:
            self._point(time_s, tokens(), lambda: self.evaluator.global_loss(holder["transport"]))

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sim, nodes, loop = self._build(
                scale, planned, "run", self.evaluator.reference, on_publish
            )
            holder.update(nodes=nodes, transport=sim.transport)
            on_publish(0.0)
            end = sim.run()
            flushed = sim.flush(end)
            on_publish(flushed)  # the flush's round
            self.final_weights = self.evaluator.last_weights
            messages = [str(w.message) for w in caught]
        log, rounds = sim.log, sim.log.rounds
        boundaries = log.counts.get("diloco_boundary", 0)
        uploads = sum(node.plugin.counters["uploads"] for node in nodes)
        return {
            "workers": len(nodes),
            "speeds": speeds,
            "inner_steps": inner,
            "steps_per_worker": [node.runtime.trainer.step for node in nodes],
            "stalls": [node.stalls for node in nodes],
            "planned_steps": planned,
            "tokens": tokens(),
            "end_s": end,
            "flushed_s": flushed,
            "idle_share": sum(node.idle_s for node in nodes) / (len(nodes) * max(end, 1e-9)),
            "outer_steps": loop.master.outer_step,
            "rounds": len(rounds),
            "deltas_per_round": loop.counters["included"] / max(1, len(rounds)),
            "stale": loop.counters["stale"],
            "boundaries": boundaries,
            "uploads": uploads,
            "folded": boundaries - uploads,
            "eager_installs": log.counts.get("diloco_install", 0),
            # what one worker moves per round of the master (up: its deltas; down: globals)
            "bytes_up_per_round": sum(n.plugin.counters["bytes_up"] for n in nodes)
            / len(nodes)
            / max(1, len(rounds)),
            "bytes_down_per_round": sum(
                n.bytes_down if sim.replay_bytes else n.plugin.counters["bytes_down"] for n in nodes
            )
            / len(nodes)
            / max(1, len(rounds)),
            "upload_s": sim.latency.upload_s,
            "download_s": sim.latency.download_s,
            "publish_s": sim.latency.publish_s,
            "encoding": self.arm.encoding,
            "global_dtype": self.arm.global_dtype,
            "master_bytes_up_per_round": sim.transport.bytes_published / max(1, len(rounds)),
            "bytes_per_worker": sum(
                n.plugin.counters["bytes_up"] + n.plugin.counters["bytes_down"] for n in nodes
            )
            // len(nodes),
            "warnings": sorted(set(log.warnings + messages))[:10],
        }


MASTER_DEFAULTS = {
    k if k != "policy" else "outer_policy": v
    for k, v in asdict(MasterConfig()).items()
    if k != "nesterov"
}


def run_job(arm_name: str, seed: int, scale: Scale, corpus: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="speedtronic-diloco-") as tmp:
        return Job(parse_arm(arm_name), seed, scale, corpus, Path(tmp)).run()
