"""The tuned fragment: the chosen values per dataset as YAML that sweep files extend, with how
they were chosen as comments."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fusion_ray.driver.preflight import RefusedError
from fusion_ray.hpo.ranking import Ranking
from fusion_ray.hpo.spec import METRIC, HpoPlan

if TYPE_CHECKING:
    from fusion_ray.hpo.tracking import Best


def short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def plain_value(value: Any) -> Any:
    """A sampled value as a plain Python value (Optuna may hand numpy scalars)."""
    return value.item() if hasattr(value, "item") else value


def values_text(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={short(plain_value(v))}" for k, v in config.items())


def _ranking_lines(dataset: str, ranking: Ranking, experiment: str) -> list[str]:
    """The fragment's record of a ranked choice: every setting's ranks, the chosen one's runs."""
    chosen = ranking.settings[0]
    lines = [
        f"# {dataset}: {len(ranking.settings)} settings finished on every operator "
        f"({ranking.trials} trials, MLflow experiment {experiment}); "
        "mean rank, then rank (val_acc) per operator:"
    ]
    for n, s in enumerate(ranking.settings):
        per_op = ", ".join(f"{op} {s.ranks[op]:g} ({s.scores[op]:.4f})" for op in ranking.operators)
        mark = "chosen" if n == 0 else "      "
        lines.append(f"#   {mark} {s.mean_rank:.2f}: {per_op}; {values_text(s.config)}")
    runs = ", ".join(f"{op} {chosen.run_ids[op]}" for op in ranking.operators)
    lines.append(f"#   chosen setting's runs: {runs}")
    return lines


def fragment_text(plan: HpoPlan, best: dict[str, Best | Ranking], sha: str) -> str:
    """The tuned fragment: the chosen values per dataset, with how they were chosen as comments."""
    body: dict[str, Any] = {"datasets": {}}
    for dataset, found in best.items():
        entry: dict[str, dict[str, Any]] = {}
        for key, value in found.config.items():
            section, _, name = key.partition(".")
            entry.setdefault(section, {})[name] = plain_value(value)
        body["datasets"][dataset] = entry
    t = plan.tune
    lines = [
        f"# Tuned shared settings, written by `python -m fusion_ray.hpo {plan.path.name}` (git {sha})."
    ]
    where = (
        f"position {t.position.label}, attention position {t.attention_position.label}, "
        f"seed {t.seed}"
    )
    if t.fusions:
        lines += [
            f"# Operators {', '.join(op.label for op in t.operators)}, each sampled setting trained "
            f"on every one; {where}; Optuna (told each setting's mean val_acc over the operators), "
            "no early stopping, scored on validation accuracy only.",
            "# Chosen by mean validation rank: on each operator the settings are ranked by best "
            "val_acc (1 = best, ties share their mean place); the lowest mean rank over the "
            "operators wins, ties to the higher mean val_acc, then to the earlier sampled setting.",
        ]
    else:
        lines.append(
            f"# Operator {t.fusion.label} alone (the settings suit it, and the other operators reuse "
            f"them); {where}; Optuna + ASHA, scored on validation accuracy only."
        )
    for dataset, found in best.items():
        if isinstance(found, Ranking):
            lines += _ranking_lines(dataset, found, plan.spec.name)
        else:
            lines.append(
                f"# {dataset}: best val_acc {found.value:.4f} of {found.trials} trials "
                f"(MLflow experiment {plan.spec.name}, run {found.run_id})"
            )
    lines.append(
        "# List this file in a sweep's `extends:` after the presets: every operator then trains with it."
    )
    return "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False)


def summary(dataset: str, found: Best | Ranking) -> dict[str, float]:
    """The parent run's metrics for one dataset."""
    if isinstance(found, Ranking):
        chosen = found.settings[0]
        return {
            f"{dataset}.mean_rank": chosen.mean_rank,
            f"{dataset}.mean_{METRIC}": chosen.mean_score,
        }
    return {f"{dataset}.{METRIC}": found.value}


class FragmentExistsError(RefusedError):
    """The fragment an HPO command would write is there already: the settings are tuned, and a
    sweep may extend them. ``--overwrite`` replaces it on purpose; without it nothing is run."""


def exists_message(output: Path) -> str:
    """Why a fragment that exists is not replaced, and how to replace it."""
    return (
        f"{output} exists; pass --overwrite to replace it (new values give new cell ids, so a "
        "sweep that extends it then runs its cells again)"
    )


Stamp = tuple[int, int, int] | None
"""A file's inode, size and modification time (nanoseconds), or None when it does not exist."""


def stamp(path: Path) -> Stamp:
    """What tells one version of ``path`` from another (None: no file)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def refuse_if_tuned(output: Path, name: str, seen: Stamp, *, overwrite: bool) -> None:
    """Under the lease, before anything runs: ``FragmentExistsError`` when the fragment
    ``output`` of HPO ``name`` exists and ``--overwrite`` was not given, or when it changed since
    this command looked (``seen``): another driver of the same file tuned while this one waited
    for the lease."""
    now = stamp(output)
    if now is None or (overwrite and now == seen):
        return
    if now == seen:
        raise FragmentExistsError(exists_message(output))
    raise FragmentExistsError(
        f"{output} was written by another driver of HPO {name!r} after this "
        "command started (it tuned while this one waited for the lease): nothing was run and "
        "the fragment is left as that driver wrote it. Run the command again with --overwrite "
        "only to tune again and replace it"
    )


def write_fragment_file(path: Path, text: str, *, overwrite: bool) -> None:
    """The fragment put in place whole, so no reader sees half a file: written beside it, then
    renamed over it (``overwrite``) or linked to its name, which fails when a file has that name
    (``FragmentExistsError``: it is never replaced without ``overwrite``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text, encoding="utf-8")
    try:
        if overwrite:
            os.replace(partial, path)
        else:
            _create(partial, path, text)
    finally:
        partial.unlink(missing_ok=True)


def _create(partial: Path, path: Path, text: str) -> None:
    """``partial`` given the name ``path`` only if no file has it."""
    try:
        try:
            os.link(partial, path)
        except FileExistsError:
            raise
        except OSError:  # a file system without hard links: an exclusive create instead
            with path.open("x", encoding="utf-8") as out:
                out.write(text)
    except FileExistsError:
        raise FragmentExistsError(exists_message(path)) from None
