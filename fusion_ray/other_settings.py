"""Runs of other settings, described once: what the driver's note (``fusion_ray.policy.plan``)
and the report (``analysis.load.other_settings``) both say of an experiment's runs that are not its
sweep's cells. Standard library only, like ``fusion_ray.schema``, so ``analysis`` shares it.

A left-out run is compared with the sweep's run of the same dataset, position, attention
position, fusion and seed; each param whose value differs counts once per run, and the keys
that differ in most runs come first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

UNSET = "unset"
"""How an absent param is shown."""
SHOWN_DIFFERENCES = 4
"""How many param differences are named before the rest are only counted."""


def plural(n: int, noun: str) -> str:
    """``plural(1, "run")`` -> "1 run", ``plural(9, "run")`` -> "9 runs"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def param_differences(
    pairs: Iterable[tuple[Mapping[str, str], Mapping[str, str]]],
) -> Counter[tuple[str, str, str]]:
    """(param, theirs, ours) -> in how many runs it differs so, over (a left-out run's params,
    its counterpart's params) pairs; a param one side lacks is ``UNSET`` there."""
    found: Counter[tuple[str, str, str]] = Counter()
    for theirs, ours in pairs:
        for key in sorted(set(theirs) | set(ours)):
            a, b = str(theirs.get(key, UNSET)), str(ours.get(key, UNSET))
            if a != b:
                found[(key, a, b)] += 1
    return found


def describe_differences(found: Counter[tuple[str, str, str]]) -> list[str]:
    """'key theirs in n runs vs ours in the sweep's runs', keys differing in most runs first,
    at most ``SHOWN_DIFFERENCES`` of them, then how many others."""
    per_key: Counter[str] = Counter()
    for (key, _, _), n in found.items():
        per_key[key] += n
    ranked = sorted(found.items(), key=lambda kv: (-per_key[kv[0][0]], -kv[1], kv[0]))
    lines = [
        f"{key} {theirs} in {plural(n, 'run')} vs {ours} in the sweep's runs"
        for (key, theirs, ours), n in ranked[:SHOWN_DIFFERENCES]
    ]
    if len(ranked) > SHOWN_DIFFERENCES:
        lines.append(f"{plural(len(ranked) - SHOWN_DIFFERENCES, 'other difference')}")
    return lines
