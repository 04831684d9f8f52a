"""Can the cluster place a sweep's trials? Checked before Ray Tune starts, so a trial no node
can hold is an error in seconds instead of Tune waiting for it forever.

A trial asks for bundles: one ``{CPU, GPU}`` bundle when it trains inside its Tune trial, or a
token bundle (``memory`` plus one unit of ``driver_resource``) and one ``{CPU, GPU}`` bundle per
DDP worker when it runs a TorchTrainer. Each bundle must fit on one node; the bundles of one
trial may spread over nodes. The nodes are those alive now and, when the cluster has an
autoscaler, the node types it may add (read from its cluster config).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fusion_ray.config import Resources
from fusion_ray.driver import head
from fusion_ray.driver.trial import CPU_FALLBACK_ENV, trial_bundles
from fusion_ray.schema import CPU_REHEARSAL_TAG

AUTOSCALER_CONFIG_ENV = "FUSION_RAY_AUTOSCALER_CONFIG"
"""The autoscaler's cluster config to read node types from; default: the one ``ray up`` leaves
on the head node (~/ray_bootstrap_config.yaml)."""
PLACEMENT_TIMEOUT_ENV = "FUSION_RAY_PLACEMENT_TIMEOUT_S"
"""Seconds to wait for the autoscaler to add a node a pending trial needs (default 900)."""
_KEYS = ("CPU", "GPU")


def _fits(bundle: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(key, 0.0) >= amount for key, amount in bundle.items() if amount > 0)


def placeable(bundles: list[dict[str, float]], nodes: list[dict[str, float]]) -> bool:
    """Whether ``bundles`` fit at once on ``nodes`` (free capacities), largest bundle first."""
    free = [dict(n) for n in nodes]
    for bundle in sorted(bundles, key=lambda b: -sum(b.get(k, 0.0) for k in _KEYS)):
        node = next((n for n in free if _fits(bundle, n)), None)
        if node is None:
            return False
        for key, amount in bundle.items():
            node[key] = node.get(key, 0.0) - amount
    return True


@dataclass(frozen=True)
class Capacity:
    """What the cluster offers: its alive nodes, and the node types its autoscaler may add
    (each as one node, ``max_workers`` of them)."""

    nodes: list[dict[str, float]]
    node_types: dict[str, tuple[dict[str, float], int]]

    def largest_node(self) -> str:
        if not self.nodes:
            return "no node"
        biggest = max(self.nodes, key=lambda n: (n.get("GPU", 0.0), n.get("CPU", 0.0)))
        return f"{biggest.get('CPU', 0):g} CPUs and {biggest.get('GPU', 0):g} GPUs"

    def with_autoscaling(self) -> list[dict[str, float]]:
        added = [dict(res) for res, most in self.node_types.values() for _ in range(min(most, 16))]
        return self.nodes + added


def cluster_capacity() -> Capacity:
    """The alive nodes of the connected Ray cluster and its autoscaler's node types, if any."""
    import ray

    nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    return Capacity(nodes, autoscaler_node_types())


def local_capacity() -> Capacity:
    """What a local Ray started on this machine would offer (a dry run starts none): one node
    with this machine's CPUs and the GPUs torch sees (``CUDA_VISIBLE_DEVICES`` applies)."""
    import torch  # the dry run has imported it already, to validate the models

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Capacity([{"CPU": float(cpus or 1), "GPU": float(gpus)}], {})


def remote_capacity(address: str) -> Capacity:
    """The capacity of the Ray cluster at ``address``, joined for the question and left (a
    process already connected to a Ray asks that one)."""
    import ray

    if ray.is_initialized():
        return cluster_capacity()
    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    try:
        return cluster_capacity()
    finally:
        ray.shutdown()


def dry_run_check(
    spec: Any, datasets: Sequence[str], address: str | None, smoke: bool = False
) -> str:
    """The placement check of a real run, for a dry run, which always prints its plan: against
    the cluster the sweep would join (``--address``, the file's ``address:``, $RAY_ADDRESS),
    joined for the question and left, or, when the sweep would start a local Ray, against this
    machine. Trials the cluster (or machine) cannot hold, or a cluster that does not answer, are
    a warning saying a real run would be refused, and what to do. GPU trials are rehearsed on
    CPUs as the real run would (``--smoke``, ``FUSION_RAY_CPU_FALLBACK=1``)."""
    where = head.named_address(address, getattr(spec, "address", None))
    if where:
        why = head.unreachable(where)
        if why:
            return f"  placement: WARNING: not checked: {why} (a real run would stop there)"
        try:
            capacity = remote_capacity(where)
        except Exception as exc:  # Ray's ConnectionError, an auth refusal: said, not raised
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            return (
                f"  placement: WARNING: not checked: joining the Ray cluster at {where} failed "
                f"({type(exc).__name__}: {first}); a real run would stop there"
            )
        what = f"the cluster at {where}"
    else:
        capacity, what = local_capacity(), "this machine"
    rehearsed = rehearses_on_cpus(spec, datasets, capacity, smoke)
    placed = on_cpus(spec) if rehearsed else spec
    check = check_placement({d: placed.group_resources(d) for d in datasets}, capacity)
    if check.never:
        return "\n".join(
            [
                f"  placement: WARNING: {what} cannot run these trials (the dry run checked "
                f"{what}; a real run there would stop before any trial starts):",
                *("  " + line for line in check.lines(capacity)),
                f"  fix: {PLACEMENT_FIX}",
            ]
        )
    how = f" with its GPU trials on CPUs ({CPU_FALLBACK_ENV}=1 or --smoke)" if rehearsed else ""
    later = (
        f"; {', '.join(check.later)} only once the autoscaler adds a node" if check.later else ""
    )
    return f"  placement: every trial fits {what}{how} ({capacity.largest_node()}){later}"


def autoscaler_node_types(path: str | None = None) -> dict[str, tuple[dict[str, float], int]]:
    """Node types of the autoscaler's cluster config: name -> (resources, max_workers)."""
    where = Path(path or os.environ.get(AUTOSCALER_CONFIG_ENV) or "~/ray_bootstrap_config.yaml")
    where = where.expanduser()
    if not where.is_file():
        return {}
    config = yaml.safe_load(where.read_text()) or {}
    types = config.get("available_node_types") or {}
    return {
        name: (
            {k: float(v) for k, v in (spec.get("resources") or {}).items()},
            int(spec.get("max_workers", config.get("max_workers", 1)) or 0),
        )
        for name, spec in types.items()
        if isinstance(spec, dict) and int(spec.get("max_workers", 1) or 0) > 0
    }


def _request_text(res: Resources) -> str:
    each = f"{res.cpus_per_worker:g} CPU" + (
        f" + {res.gpus_per_worker:g} GPU" if res.use_gpu else ""
    )
    return f"{res.workers} worker(s) x ({each})"


class PlacementError(RuntimeError):
    """Trials that no node of the cluster can run (now, or after the autoscaler's wait)."""


@dataclass
class PlacementCheck:
    """Per dataset, whether its trials fit now, only once the autoscaler adds a node, or never."""

    never: dict[str, str]
    """dataset -> the request no node and no node type can hold."""
    later: dict[str, str]
    """dataset -> the request only a node type not started yet can hold."""

    def lines(self, capacity: Capacity) -> list[str]:
        """One line per dataset no node can hold, in the sweep's order."""
        return [
            f"  {dataset}: each trial asks {request}; the largest node has {capacity.largest_node()}"
            for dataset, request in self.never.items()
        ]

    def error(self, capacity: Capacity) -> str:
        return (
            "no node of this Ray cluster can run these trials, and Ray Tune would wait for them "
            "forever:\n" + "\n".join(self.lines(capacity)) + f"\nfix: {PLACEMENT_FIX}"
        )


PLACEMENT_FIX = (
    "run it on a cluster that has such nodes (ray up cluster.yaml, then --address or the file's "
    "address:), ask for less under resources: (or datasets.<name>.resources:), or rehearse its "
    f"GPU trials on this machine's CPUs: {CPU_FALLBACK_ENV}=1 for the whole sweep, --smoke for "
    "one seed of one epoch"
)
"""What to do about trials no node can hold; every part of it works (a test runs them)."""


def rehearses_on_cpus(spec: Any, datasets: Sequence[str], capacity: Capacity, smoke: bool) -> bool:
    """Whether the GPU trials of ``datasets`` run on CPUs here: on a Ray without GPUs, for a
    smoke run or with ``FUSION_RAY_CPU_FALLBACK=1``."""
    asked = smoke or os.environ.get(CPU_FALLBACK_ENV) == "1"
    return (
        asked and not has_gpus(capacity) and any(spec.group_resources(d).use_gpu for d in datasets)
    )


def check_placement(requests: dict[str, Resources], capacity: Capacity) -> PlacementCheck:
    """``requests``: each dataset's trial resources, for the datasets with pending cells."""
    never, later = {}, {}
    for dataset, res in requests.items():
        bundles = trial_bundles(res)
        if placeable(bundles, capacity.nodes):
            continue
        if capacity.node_types and placeable(bundles, capacity.with_autoscaling()):
            later[dataset] = _request_text(res)
        else:
            never[dataset] = _request_text(res)
    return PlacementCheck(never, later)


def placement_timeout_s() -> float:
    return float(os.environ.get(PLACEMENT_TIMEOUT_ENV, "900"))


def without_gpus(res: Resources) -> Resources:
    """The same trial on CPUs (a rehearsal of a GPU sweep on a Ray without GPUs): one CPU per
    worker, so DDP trials still run as DDP on a laptop."""
    return res.model_copy(update={"use_gpu": False, "gpus_per_worker": 0.0, "cpus_per_worker": 1.0})


def has_gpus(capacity: Capacity) -> bool:
    return any(n.get("GPU", 0.0) > 0 for n in capacity.with_autoscaling())


def on_cpus(spec: Any) -> Any:
    """The same sweep (or HPO trials) with every GPU request replaced by one CPU per worker
    (``spec.with_resources``: a new value, its grid points not built again)."""
    return spec.with_resources(without_gpus)


@dataclass(frozen=True)
class Placement:
    """Where a sweep's (or an HPO file's) trials run: the spec to run, as it was or with its GPU
    trials rehearsed on CPUs, and the check that found them placeable."""

    spec: Any
    rehearsed_on_cpus: bool
    """A smoke run on a Ray without GPUs: its GPU trials run on CPUs (tagged on the parent run)."""
    check: PlacementCheck
    """Which datasets wait for the autoscaler to add a node (``check.later``)."""


def fit(spec: Any, datasets: Sequence[str], *, smoke: bool) -> Placement:
    """Where the trials of ``datasets`` run on the connected Ray cluster: the spec as it is, or,
    for a smoke run on a Ray without GPUs, a new one with its GPU trials on CPUs (with a line on
    the console); and which datasets must wait for the autoscaler. Raises ``PlacementError``
    when some trial fits no node and no node type of the autoscaler."""
    capacity = cluster_capacity()
    rehearse = rehearses_on_cpus(spec, datasets, capacity, smoke)
    if rehearse:
        spec = on_cpus(spec)
        why = "--smoke" if smoke else f"{CPU_FALLBACK_ENV}=1"
        print(
            f"{spec.name}: {why} on a Ray without GPUs: the GPU trials are rehearsed on CPUs "
            f"(tag {CPU_REHEARSAL_TAG} on the parent run)"
        )
    check = check_placement({d: spec.group_resources(d) for d in datasets}, capacity)
    if check.never:
        raise PlacementError(check.error(capacity))
    return Placement(spec, rehearse, check)
