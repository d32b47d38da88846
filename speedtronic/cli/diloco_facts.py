"""What ``validate`` says about a DumbDiLoCo config: rounds, bytes per delta, the latency
fraction f with its advice, settings measured to hurt an asynchronous fleet, and what a fleet
costs per hour (Hub commits, bucket requests and bytes). Heavy imports inside the functions:
``validate`` pays for them only when distributed training is on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the config package loads with the command, not with --help
    from speedtronic.config import SpeedtronicConfig


@dataclass(frozen=True)
class Fleet:
    """The user's guess of the fleet: workers, seconds per optimizer step, uplink in Mbit/s."""

    nodes: int = 4
    step_time_s: float = 1.0
    uplink_mbps: float = 50.0  # latency.DEFAULT_UPLINK_MBPS: --help must not load it


# Measured at equal wall-clock, 4 equal nodes, f = 0.25, 2 seeds (docs/benchmarks.md, DumbDiLoCo
# convergence): the published global's eval loss against one worker's
MOMENTUM_COST = "+8.0% with outer lr 0.7 / Nesterov 0.9 against +1.3% with plain averaging"
RESET_COST = (
    "+9.8% with a reset at each install against +4.9% without over 12 rounds, +2.2% against "
    "-1.8% over 48"
)
MANY_ROUNDS = 12  # the shortest run measured; the cost held at 4-5 points up to 48 rounds


def measured_warnings(cfg: SpeedtronicConfig) -> list[str]:
    """Settings measured to hurt an asynchronous fleet: said, never refused."""
    dist, found = cfg.distributed, []
    if dist.outer_momentum > 0 and dist.sync_wait_s == 0:
        found.append(
            f"distributed.outer_momentum {dist.outer_momentum:g} with sync_wait_s 0: outer "
            f"momentum on deltas that arrive late measured worse, {MOMENTUM_COST} (eval loss "
            "vs one worker at equal wall-clock, docs/diloco.md); use 0, or wait (sync_wait_s)"
        )
    rounds = -(-cfg.run.max_steps // dist.inner_steps)
    if dist.reset_inner_optimizer and rounds >= MANY_ROUNDS:
        found.append(
            f"distributed.reset_inner_optimizer true over {rounds} rounds: clearing AdamW's "
            f"moments at every install measured worse, {RESET_COST} (eval loss vs one worker "
            "at equal wall-clock, docs/diloco.md); false keeps them"
        )
    return found


def fleet_warnings(cfg: SpeedtronicConfig, fleet: Fleet) -> list[str]:
    """For a Hub repo: where ``fleet`` at this cadence would exceed the Hub's budgets (the
    commits a repo takes an hour, the calls an account makes), each naming the way out."""
    from speedtronic.distributed.hub.cadence import settings_warnings
    from speedtronic.distributed.repos import check_repo_spec

    dist = cfg.distributed
    if check_repo_spec(dist.repo)[0] != "hub":
        return []
    return settings_warnings(
        dist,
        nodes=fleet.nodes,
        step_time_s=fleet.step_time_s,
        min_publish_interval_s=dist.min_publish_interval_s,
    )


def diloco_facts(cfg: SpeedtronicConfig, model: Any, fleet: Fleet) -> dict[str, Any]:
    """Every DumbDiLoCo fact ``validate`` prints; the repo spec is checked first (exit 2)."""
    from speedtronic.distributed.repos import check_repo_spec

    dist = cfg.distributed
    kind, target = check_repo_spec(dist.repo)  # a repo no node could use: refused here, exit 2
    facts: dict[str, Any] = {
        "diloco_node": f"{dist.role} {dist.resolved_node_id} on {dist.repo}",
        "diloco_repo": _repo_reading(kind, target),
        "diloco_rounds_per_run": -(-cfg.run.max_steps // dist.inner_steps),
        "diloco_uploads_per_hour": f"{3600 / (dist.inner_steps * fleet.step_time_s):.1f} per "
        f"node: 3600 / ({dist.inner_steps} inner steps x {fleet.step_time_s:g} s/step, "
        "--step-time)",
    }
    model = _as_trained(cfg, model)
    if model is not None:
        facts.update(_delta_facts(cfg, model, kind, fleet))
    if kind == "hub":  # docs/hub.md's figures
        from speedtronic.distributed.hub.cadence import keyframes_every, request_facts

        facts.update(
            request_facts(
                inner_steps=dist.inner_steps,
                poll_interval_s=dist.poll_interval,
                min_publish_interval_s=dist.min_publish_interval_s,
                keyframe_every=keyframes_every(dist),
            )
        )
    facts.update(fleet_facts(cfg, model, kind, fleet))
    return facts


def _as_trained(cfg: SpeedtronicConfig, model: Any) -> Any:
    """The model as its nodes train it: with ``model.lora`` a copy wrapped with its adapters
    (on the meta device, as ``validate`` builds it), so the bytes are the adapters' only."""
    if model is None or cfg.model.lora is None:
        return model
    import copy

    from speedtronic.train.lora import wrap

    return wrap(copy.deepcopy(model), cfg.model.lora)


def _repo_reading(kind: str, target: str) -> str:
    """How the nodes read the repo spec: a Hub repo id and a relative path are spelled alike
    (``no_such_dir/fleet``), so a Hub reading with no such directory here says so."""
    from speedtronic.hub.names import no_directory_note

    if kind == "directory":
        return f"the directory {target}"
    if kind == "s3":
        return f"the bucket {target}"
    note = no_directory_note(target)
    return f"the Hugging Face Hub repo {target}" + (f" ({note})" if note else "")


def _delta_facts(cfg: SpeedtronicConfig, model: Any, kind: str, fleet: Fleet) -> dict[str, Any]:
    """Bytes per delta, and the latency fraction f they make at this uplink and step time."""
    from speedtronic.distributed.codec import expected_delta_bytes
    from speedtronic.distributed.latency import (
        latency_advice,
        latency_fraction,
        suggested_poll_interval,
        upload_seconds,
    )
    from speedtronic.distributed.protocol import ENCODINGS
    from speedtronic.distributed.worker.plugin import parameters_of

    dist, params = cfg.distributed, parameters_of(model)
    sizes = {enc: expected_delta_bytes(params, enc) for enc in ENCODINGS}
    upload_s = upload_seconds(sizes[dist.delta_dtype], kind, fleet.uplink_mbps)
    loop_s = dist.inner_steps * fleet.step_time_s
    f = latency_fraction(upload_s, dist.inner_steps, fleet.step_time_s)
    poll = suggested_poll_interval(upload_s, loop_s)
    return {
        "diloco_delta_bytes": sizes,
        **_trainable_fact(model, params, dist.delta_dtype),
        "diloco_upload_share_of_loop": (
            f"f = {f:.2f}: a {dist.delta_dtype} delta takes ~{upload_s:.1f} s to upload at "
            f"{fleet.uplink_mbps:g} Mbit/s, an inner loop {dist.inner_steps} x "
            f"{fleet.step_time_s:g} s = {loop_s:.0f} s (--uplink, --step-time); "
            f"{latency_advice(f, dist.inner_steps)}"
        ),
        "diloco_poll_interval": f"{dist.poll_interval:g} s (about {poll:.0f} s keeps the wait "
        "for a new global under an upload's)",
        "diloco_global": _global_line(params, dist, kind, fleet, loop_s),
    }


def _trainable_fact(model: Any, params: dict, encoding: str) -> dict[str, str]:
    """A model with frozen parameters (``model.lora``): the deltas and globals carry only the
    trainable ones, and this says what share of a full model's bytes that is."""
    from speedtronic.data.describe import size_text
    from speedtronic.distributed.codec import expected_delta_bytes

    every = dict(model.named_parameters())  # tied weights once, as the deltas count them
    if len(every) == len(params):
        return {}
    sent, full = expected_delta_bytes(params, encoding), expected_delta_bytes(every, encoding)
    count = sum(p.numel() for p in params.values())
    total = sum(p.numel() for p in every.values())
    return {
        "diloco_trainable": f"{count:,} of {total:,} parameters travel (the trainable ones; "
        f"the frozen base stays on each node): a {encoding} delta is {size_text(sent)}, "
        f"{sent / max(full, 1):.1%} of the full model's {size_text(full)}"
    }


def _global_line(params: dict, dist: Any, kind: str, fleet: Fleet, loop_s: float) -> str:
    """What the global costs a round: its bytes, and its publish on an uplink like a node's."""
    from speedtronic.data.describe import size_text
    from speedtronic.distributed.global_update import global_bytes_per_round
    from speedtronic.distributed.latency import upload_seconds

    if dist.global_dtype == "deltas":
        return _rounds_line(params, dist, kind, fleet, loop_s)
    size = global_bytes_per_round(params, dist.global_dtype, dist.keyframe_every)
    publish_s = upload_seconds(size, kind, fleet.uplink_mbps)
    what = (
        "full fp32 weights"
        if dist.global_dtype == "fp32"
        else f"an {dist.global_dtype} update, a keyframe every {dist.keyframe_every} rounds"
    )
    hint = "; global_dtype int8 cuts it to about a third" if dist.global_dtype == "fp32" else ""
    return (
        f"{size_text(size)} per round ({what}): every node downloads it, and a master on an "
        f"uplink like this one takes ~{publish_s:.1f} s ({publish_s / max(loop_s, 1e-9):.2f} "
        f"of an inner loop) to publish it{hint}"
    )


def _rounds_line(params: dict, dist: Any, kind: str, fleet: Fleet, loop_s: float) -> str:
    """``global_dtype: deltas``: a node's bytes up and down a round, and the master's up."""
    from speedtronic.data.describe import size_text
    from speedtronic.distributed.latency import upload_seconds
    from speedtronic.distributed.round_apply import deltas_bytes_per_round

    got = deltas_bytes_per_round(params, dist.delta_dtype, fleet.nodes, dist.keyframe_every)
    publish_s = upload_seconds(got["master_up"], kind, fleet.uplink_mbps)
    return (
        f"{size_text(got['node_down'])} down and {size_text(got['node_up'])} up per round a "
        f"node with {fleet.nodes} nodes (the {fleet.nodes - 1} others' {dist.delta_dtype} "
        f"deltas and the round record; full weights only as a keyframe at a start or "
        f"rejoin); the master uploads {size_text(got['master_up'])} a round (the record, a "
        f"keyframe every {dist.keyframe_every} rounds): ~{publish_s:.1f} s "
        f"({publish_s / max(loop_s, 1e-9):.2f} of an inner loop) on an uplink like this one"
    )


def fleet_facts(cfg: SpeedtronicConfig, model: Any, kind: str, fleet: Fleet) -> dict:
    """What ``fleet.nodes`` workers cost per hour: Hub commits against the repo's budget, and
    for a bucket its requests and bytes (docs/storage.md); nothing for a shared directory."""
    from speedtronic.distributed.hub.cadence import estimate_commits_per_hour, keyframes_every
    from speedtronic.hub.budget import HUB_COMMITS_PER_HOUR

    if kind == "directory":
        return {}  # a shared directory: no budget, no bill
    dist = cfg.distributed
    commits = estimate_commits_per_hour(
        nodes=fleet.nodes,
        inner_steps=dist.inner_steps,
        step_time_s=fleet.step_time_s,
        min_publish_interval_s=dist.min_publish_interval_s,
        keyframe_every=keyframes_every(dist),
    )
    facts: dict[str, Any] = {
        "diloco_hub_commits_per_hour": f"{commits:.0f} for {fleet.nodes} worker(s) at "
        f"{fleet.step_time_s:g} s/step (a Hub repo takes about {HUB_COMMITS_PER_HOUR})"
    }
    if kind == "s3" and model is not None:
        facts.update(_bucket_cost(cfg, model, fleet))
    return facts


def _fetch_bytes(params: dict, dist: Any, nodes: int) -> int | None:
    """global_dtype deltas: a worker downloads the others' deltas, not the master's publish."""
    if dist.global_dtype != "deltas":
        return None
    from speedtronic.distributed.round_apply import deltas_bytes_per_round

    return deltas_bytes_per_round(params, dist.delta_dtype, nodes, dist.keyframe_every)["node_down"]


def _bucket_cost(cfg: SpeedtronicConfig, model: Any, fleet: Fleet) -> dict:
    from speedtronic.distributed.codec import expected_delta_bytes
    from speedtronic.distributed.global_update import global_bytes_per_round
    from speedtronic.distributed.s3.costs import describe, fleet_cost
    from speedtronic.distributed.worker.plugin import parameters_of

    dist, params = cfg.distributed, parameters_of(model)
    cost = fleet_cost(
        workers=fleet.nodes,
        inner_steps=dist.inner_steps,
        step_time_s=fleet.step_time_s,
        poll_interval_s=dist.poll_interval,
        min_publish_interval_s=dist.min_publish_interval_s,
        min_deltas=dist.min_deltas,
        delta_bytes=expected_delta_bytes(params, dist.delta_dtype),
        weights_bytes=global_bytes_per_round(params, dist.global_dtype, dist.keyframe_every),
        fetch_bytes=_fetch_bytes(params, dist, fleet.nodes),
    )
    described = describe(cost, fleet.step_time_s)
    return {"diloco_bucket_per_hour": described, "diloco_bucket": cost.as_dict()}
