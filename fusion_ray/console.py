"""What a sweep says on the console: the dry run's cells, the outcome, the summary table.

Pure text from values (a spec, a plan, an outcome) and, for the summary table, the sweep's
FINISHED runs; the commands print it (``fusion_ray.sweep``) and the Python API returns it.
"""

from __future__ import annotations

from collections import defaultdict

from fusion_ray.config.grid import axis_counts, expand
from fusion_ray.config.trainable import TrainableSweep, trainable_cells
from fusion_ray.config.workload import AnySweep
from fusion_ray.driver.runner import SweepOutcome
from fusion_ray.policy.plan import Plan
from fusion_ray.policy.seed_policy import policy_for
from fusion_ray.redact import redact


def dry_run_text(spec: AnySweep, todo: Plan) -> str:
    """What ``--dry-run`` prints: the cells, how many each axis has, which are FINISHED, and
    for an adaptive sweep its first wave, cap and worst case."""
    if isinstance(spec, TrainableSweep):
        return trainable_dry_run_text(spec, todo)
    cells, done = todo.cells, todo.done
    out = [
        f"sweep {spec.name}: {len(cells)} cells ({len(done)} already FINISHED in MLflow at {redact(spec.tracking_uri)})"
    ]
    out += policy_for(spec, todo).plan_lines()
    for axis, counts in axis_counts(cells).items():
        out.append(f"  {axis:<19} " + ", ".join(f"{k} x{v}" for k, v in counts.items()))
    note = todo.other_settings_note(spec.name)
    if note:
        out.append(f"  note: {note}")
    axes = list(spec.grid.settings)
    columns = ", ".join(["seed", "dataset", "position", "attention_position", "fusion", *axes])
    out.append(f"  {'seed-major order':<19} ({columns}, status, cell_id):")
    for cell in cells:
        status = "FINISHED" if cell.cell_id in done else "pending"
        settings = "".join(f"{text:<8} " for _, text in cell.axes)
        out.append(
            f"    {cell.seed:>4}  {cell.dataset:<12} {cell.position:<16} {cell.attention_position:<12} {cell.fusion:<22} {settings}{status:<8} {cell.cell_id}"
        )
    return "\n".join(out)


def what_it_compares(spec: TrainableSweep) -> str:
    """``trainable digits_mlp: label_smoothing levels against 0.0 on test_acc (more is
    better)``: what a trainable's sweep decides."""
    metric = spec.metric.name or "its first returned metric"
    better = "more" if spec.metric.mode == "max" else "less"
    return (
        f"trainable {spec.trainable}: {spec.axis} levels against {spec.baseline_text} on "
        f"{metric} ({better} is better)"
    )


def trainable_dry_run_text(spec: TrainableSweep, todo: Plan) -> str:
    """``dry_run_text`` of a trainable's sweep: its cells by grid axis and seed."""
    cells, done = todo.cells, todo.done
    out = [
        f"sweep {spec.name}: {len(cells)} cells ({len(done)} already FINISHED in MLflow at "
        f"{redact(spec.tracking_uri)}); {what_it_compares(spec)}"
    ]
    out += policy_for(spec, todo).plan_lines()
    for key in spec.grid:
        counts: dict[str, int] = {}
        for cell in cells:
            text = dict(cell.axes)[key]
            counts[text] = counts.get(text, 0) + 1
        out.append(f"  {key:<19} " + ", ".join(f"{k} x{v}" for k, v in counts.items()))
    note = todo.other_settings_note(spec.name)
    if note:
        out.append(f"  note: {note}")
    columns = ", ".join(["seed", *spec.grid])
    out.append(f"  {'seed-major order':<19} ({columns}, status, cell_id):")
    for cell in cells:
        status = "FINISHED" if cell.cell_id in done else "pending"
        levels = "".join(f"{text:<12} " for _, text in cell.axes)
        out.append(f"    {cell.seed:>4}  {levels}{status:<8} {cell.cell_id}")
    return "\n".join(out)


def print_outcome(spec: AnySweep, outcome: SweepOutcome, note: bool = True) -> None:
    """What the sweep did; ``note``: also what the experiment holds beyond its cells (the
    report says it too, so the CLI leaves it to the report when there is one)."""
    print()
    print(
        f"sweep {spec.name}: {outcome.cells} cells; {outcome.already_finished} were already finished, "
        f"{len(outcome.finished)} finished now, {len(outcome.failed)} failed, {len(outcome.interrupted)} interrupted"
    )
    if note and outcome.other_settings:
        print(f"  note: {outcome.other_settings}")
    for cid, reason in outcome.failed.items():
        what = "LOST (its process or node, not its code)" if cid in outcome.lost else "FAILED"
        print(f"  {what} {cid}: {reason.splitlines()[-1] if reason else ''}")
    if outcome.lost:
        print(
            f"  {len(outcome.lost)} cell(s) lost their process or node after Tune's retries: "
            "not scored in any decision; re-run the same command to run them again"
        )
    if spec.adaptive is not None and len(outcome.failed) > len(outcome.lost):
        print(
            "  a failed cell of an adaptive sweep counts as a loss for its arm and is not run "
            "again (delete its run in MLflow to retry it)"
        )
    if (outcome.failed and spec.adaptive is None) or outcome.interrupted:
        print(
            "  re-run the same command to retry failed cells and resume interrupted ones from their checkpoints"
        )
    print()


def trainable_summary_table(spec: TrainableSweep) -> str:
    """The decision metric's mean and finished seeds per grid point of a trainable's sweep,
    over this sweep's cells only."""
    # lazy: tracking imports mlflow (~1.3 s); kept out of --dry-run and --help
    from fusion_ray.driver.tracking import Tracker
    from fusion_ray.schema import decided_metric, returned_metrics

    tracker = Tracker.existing(spec.tracking_uri, spec.name)
    if tracker is None:
        return "no runs yet"
    cells = {c.cell_id: c for c in trainable_cells(spec)}
    values: dict[tuple[str, ...], list[float]] = defaultdict(list)
    shown = spec.metric.name
    for run in tracker.trial_runs():
        cell = cells.get(run.data.tags.get("cell_id", ""))
        name = decided_metric(spec.metric.name, returned_metrics(run.data.tags))
        if cell is None or run.info.status != "FINISHED" or name not in run.data.metrics:
            continue
        shown = shown or name
        values[tuple(text for _, text in cell.axes)].append(run.data.metrics[name])
    head = "".join(f"{key:<17} " for key in spec.grid)
    lines = [head + f"{'seeds':>5} {shown or 'metric':>12}"]
    for key in sorted(values):
        got = values[key]
        levels = "".join(f"{text:<17} " for text in key)
        lines.append(f"{levels}{len(got):>5} {sum(got) / len(got):>12.4g}")
    return "\n".join(lines)


def summary_table(spec: AnySweep) -> str:
    """Mean test accuracy and finished seeds per grid point (dataset, position, attention
    position, fusion and setting-axis values), over this sweep's cells only (runs of other
    settings in the experiment are left out)."""
    if isinstance(spec, TrainableSweep):
        return trainable_summary_table(spec)
    # lazy: tracking imports mlflow (~1.3 s); kept out of --dry-run and --help
    from fusion_ray.driver.tracking import Tracker

    tracker = Tracker.existing(spec.tracking_uri, spec.name)
    if tracker is None:
        return "no runs yet"
    cells = {c.cell_id: c for c in expand(spec)}
    accuracies: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for run in tracker.trial_runs():
        cell = cells.get(run.data.tags.get("cell_id", ""))
        if cell is None or run.info.status != "FINISHED" or "test_acc" not in run.data.metrics:
            continue
        key: tuple[str, ...] = (cell.dataset, cell.position, cell.attention_position, cell.fusion)
        accuracies[key + tuple(text for _, text in cell.axes)].append(run.data.metrics["test_acc"])
    axes = [key.rsplit(".", 1)[-1] for key in spec.grid.settings]
    head = f"{'dataset':<12} {'position':<16} {'attention':<12} {'fusion':<22} "
    lines = [head + "".join(f"{a:<17} " for a in axes) + f"{'seeds':>5} {'test_acc':>9}"]
    for key in sorted(accuracies):
        accs = accuracies[key]
        settings = "".join(f"{text:<17} " for text in key[4:])
        lines.append(
            f"{key[0]:<12} {key[1]:<16} {key[2]:<12} {key[3]:<22} {settings}{len(accs):>5} {100 * sum(accs) / len(accs):>8.2f}%"
        )
    return "\n".join(lines)
