"""Adaptive seeds on the driver: which cells the evidence needs (a pure function of the finished
cells), and an adaptive sweep on Ray that stops each comparison when it is decided."""

from __future__ import annotations

import pytest
import yaml

from fusion_ray.config import load_sweep
from fusion_ray.config.grid import expand
from fusion_ray.decide.questions import FAILURE_SCALE, operator_hypothesis
from fusion_ray.policy.schedule import SeedSchedule, group_of
from tests.conftest import tiny_sweep


def _adaptive_sweep(tmp_path, first=2, most=12, name="adaptive", **seeds):
    """Three operators on one dataset; the operator comparisons only unless ``decide`` says."""
    path = tiny_sweep(tmp_path, name=name)
    raw = yaml.safe_load(path.read_text())
    raw["seeds"] = {"adaptive": True, "first": first, "max": most, "decide": ["operator"]}
    raw["seeds"] |= seeds
    raw["grid"]["fusions"] = ["add", "gate_scalar", "concat"]
    path.write_text(yaml.safe_dump(raw))
    return load_sweep(path)


def _schedule(spec):
    return SeedSchedule(expand(spec), "add", spec.adaptive)


def _finish(schedule, cells, accuracy):
    for cell in cells:
        schedule.results[cell.cell_id] = accuracy(cell)


@pytest.mark.unit
def test_the_first_wave_runs_every_cell_and_then_only_open_comparisons_get_seeds(tmp_path):
    spec = _adaptive_sweep(tmp_path, first=2, most=12)
    schedule = _schedule(spec)
    assert spec.seeds == list(range(12)) and len(schedule.cells) == 36
    wave = schedule.needed()
    assert {c.seed for c in wave} == {0, 1} and len(wave) == 6
    # gate_scalar always 10 points better, concat always exactly equal to add (no sign: open)
    acc = {"add": 0.5, "gate_scalar": 0.6, "concat": 0.5}
    _finish(schedule, wave, lambda c: acc[c.fusion])
    while schedule.needed():
        _finish(schedule, schedule.needed(), lambda c: acc[c.fusion])
    states = {name: s[-1] for name, s in schedule.states().items()}
    group = group_of(schedule.cells[0])
    better = operator_hypothesis(group, "gate_scalar", "add").name
    tied = operator_hypothesis(group, "concat", "add").name
    assert states[better] == "better"
    decided_at = schedule.states()[better].index("better")
    # gate_scalar stopped once decided; the tied comparison (every delta 0: its e-value stays 1)
    # stopped at seed 7, when its 4 remaining seeds, each at most doubling it, could no longer
    # lift it to 1/alpha = 20 (2^4 = 16): futile
    ran = {(c.fusion, c.seed) for c in schedule.cells if c.cell_id in schedule.results}
    assert max(s for f, s in ran if f == "gate_scalar") == decided_at < 11
    assert states[tied] == "futile" and max(s for f, s in ran if f == "concat") == 7
    assert max(s for f, s in ran if f == "add") == max(decided_at, 7)


@pytest.mark.unit
def test_a_baseline_seed_is_shared_by_the_comparisons_of_its_family(tmp_path):
    spec = _adaptive_sweep(tmp_path, first=2, most=12)
    schedule = _schedule(spec)
    acc = {"add": 0.5, "gate_scalar": 0.6, "concat": 0.4}
    for _ in range(4):
        _finish(schedule, schedule.needed(), lambda c: acc[c.fusion])
    needed = schedule.needed()
    seeds = {c.seed for c in needed}
    assert len(seeds) == 1  # one next seed, for both comparisons
    assert sorted(c.fusion for c in needed) == ["add", "concat", "gate_scalar"]  # one add cell


@pytest.mark.unit
def test_a_restarted_schedule_from_the_same_results_asks_for_the_same_cells(tmp_path):
    spec = _adaptive_sweep(tmp_path, first=3, most=12)
    one = _schedule(spec)
    acc = {"add": 0.5, "gate_scalar": 0.62, "concat": 0.47}
    for _ in range(5):
        _finish(one, one.needed(), lambda c: acc[c.fusion] + 0.01 * (c.seed % 3))
    two = SeedSchedule(expand(spec), "add", spec.adaptive, dict(one.results))
    assert [c.cell_id for c in two.needed()] == [c.cell_id for c in one.needed()]
    assert two.states() == one.states()


@pytest.mark.unit
def test_a_failed_cell_counts_as_a_loss_for_its_arm_and_is_not_run_again(tmp_path):
    spec = _adaptive_sweep(tmp_path, first=3, most=12)
    schedule = _schedule(spec)
    wave = schedule.needed()
    accuracy = {"add": 0.50, "gate_scalar": 0.60, "concat": 0.55}
    for cell in wave:
        operator_failed = cell.fusion == "gate_scalar" and cell.seed == 2
        baseline_failed = cell.fusion == "add" and cell.seed == 1
        failed = operator_failed or baseline_failed
        schedule.results[cell.cell_id] = None if failed else accuracy[cell.fusion]
    deltas = schedule.deltas()
    group = group_of(wave[0])
    # seed 0: +10 and +5 points; seed 1: the baseline failed, a gain of FAILURE_SCALE x the RMS
    # of the values so far for both operators; seed 2: gate_scalar's run failed, a loss as large
    c = FAILURE_SCALE
    assert deltas[operator_hypothesis(group, "gate_scalar", "add").name] == [10.0, c * 10, -c * 10]
    assert deltas[operator_hypothesis(group, "concat", "add").name] == [5.0, c * 5, 5.0]
    assert not any(c.cell_id in schedule.results for c in schedule.needed())


@pytest.mark.ray
def test_an_adaptive_sweep_on_ray_runs_what_the_evidence_needs_once(
    tmp_path, ray_session, data_cache, mlflow_store
):
    """The searcher suggests the first wave, then only what the evidence needs; nothing runs
    twice, and the schedule rebuilt from the tracking store agrees with what ran."""
    from fusion_ray.driver.runner import run_sweep
    from fusion_ray.driver.tracking import Tracker
    from fusion_ray.policy.plan import plan
    from fusion_ray.policy.schedule import finished_results
    from fusion_ray.policy.seed_policy import AdaptiveSeedPolicy

    # Two entries that build the same model (gate_mlp's hidden width defaults to d_model = 16):
    # every paired delta is exactly 0, so the comparison never gains a sign. With the sign rule
    # (chosen by name in the file): after the first wave (seeds 0-1) its 7 remaining seeds could
    # still reach e = 20 (E_7 = 26.8): seed 2 runs; then 6 remaining cannot (E_6 = 14.4):
    # futile, and the sweep stops at 3 seeds of 9.
    path = tiny_sweep(tmp_path, name="adaptive_ray", tracking_uri=mlflow_store())
    raw = yaml.safe_load(path.read_text())
    raw["seeds"] = {"adaptive": True, "first": 2, "max": 9, "rule": "sign"}
    raw["grid"]["fusions"] = ["gate_mlp", {"name": "gate_mlp", "hidden": 16}]
    raw["defaults"]["train"]["epochs"] = 1
    path.write_text(yaml.safe_dump(raw))
    spec = load_sweep(path)
    outcome = run_sweep(spec)
    assert not outcome.failed and outcome.ran == len(outcome.finished) == 6
    tracker = Tracker(spec.tracking_uri, spec.name)
    runs = tracker.trial_runs()
    ids = [r.data.tags["cell_id"] for r in runs if r.info.status == "FINISHED"]
    assert len(ids) == len(set(ids)) == len(outcome.finished)  # no cell twice
    # the schedule rebuilt from the store needs nothing more, and every finished cell was needed
    todo = plan(spec, tracker)
    schedule = AdaptiveSeedPolicy(spec, todo).schedule
    assert schedule.needed() == []
    replay = SeedSchedule(todo.cells, spec.baseline_label, spec.adaptive)
    by_id = {c.cell_id: c for c in todo.cells}
    ran = set()
    while replay.needed():
        batch = [c for c in replay.needed() if c.cell_id in ids]
        assert batch, "a needed cell was never run"
        ran |= {c.cell_id for c in batch}
        replay.results.update(finished_results(batch, todo.existing))
    assert ran == set(ids) and {by_id[i].seed for i in ids} == {0, 1, 2}
    assert [s[-1] for s in schedule.states().values()] == ["futile", "futile"]
    # the operator comparison, and (one dataset) the length question inside it: the trials
    # reported their shortest and longest quarter, and the identical models tie on both
    row, within = outcome.decisions
    assert (row["state"], row["seeds_used"], row["decided_at_seed"]) == ("futile", 3, 2)
    assert within["kind"] == "length_within" and within["comparison"].startswith("short:longest")
    assert (within["state"], within["seeds_used"], within["mean"]) == ("futile", 3, 0.0)
    parent = tracker.client.search_runs([tracker.experiment_id], "tags.role = 'sweep'")[0]
    assert parent.data.tags["decisions.futile"] == "2"
    # the dataset's reference baseline, reported by its trials, is on the parent run too
    bow = parent.data.metrics["baseline.short.bag_of_words.test_acc"]
    trial = next(r for r in runs if r.info.status == "FINISHED")
    assert bow == trial.data.metrics["reference.bag_of_words.test_acc"] and 0 < bow <= 1
    assert '"max":9' in parent.data.tags["adaptive_seeds"]
    assert '"rule":"sign"' in parent.data.tags["adaptive_seeds"] and row["rule"] == "sign"
    assert '"regimes":["short"]' in parent.data.tags["adaptive_seeds"]  # the report's family
    assert (row["kind"], row["verdict"], row["failed_runs"]) == ("operator", "futile", 0)
    assert "decisions.csv" in {a.path for a in tracker.client.list_artifacts(parent.info.run_id)}
    # the evidence as it formed, one step per seed, on the parent run (the MLflow UI charts it)
    # (short keys in the family's order, h01 first; the full name and the state as tags)
    (key, _) = sorted(
        k for k in parent.data.metrics if k.startswith("decision/") and k.endswith(".decided")
    )
    assert key == "decision/h01.decided"
    assert parent.data.tags["decision.h01.state"] == "futile"
    assert parent.data.tags["decision.h01"] == row["comparison"]
    history = tracker.client.get_metric_history(parent.info.run_id, key)
    # every look as it came, then the final state logged again at the last step: the metric's
    # last point says whether decisions.csv has it decided
    points = sorted((m.step, m.timestamp, m.value) for m in history)
    assert [(step, value) for step, _, value in points][:3] == [(1, 0), (2, 0), (3, 1)]
    assert {step for step, _, _ in points} == {1, 2, 3}
    assert points[-1][2] == 1 == parent.data.metrics[key]
    e_key = "decision/h01.log10_e_value"
    assert {m.value for m in tracker.client.get_metric_history(parent.info.run_id, e_key)} == {0}
    again = run_sweep(spec)  # a second driver finds nothing left to run
    assert again.ran == 0 and not again.finished


def _two_regimes(tmp_path, **seeds):
    path = tiny_sweep(tmp_path, name="two_regimes")
    raw = yaml.safe_load(path.read_text())
    raw["seeds"] = {"adaptive": True, "first": 6, "max": 14, **seeds}
    raw["grid"]["datasets"] = ["short", "long"]
    raw["datasets"]["long"] = yaml.safe_load(yaml.safe_dump(raw["datasets"]["short"]))
    path.write_text(yaml.safe_dump(raw))
    spec = load_sweep(path)
    return SeedSchedule(expand(spec), "add", spec.adaptive, regimes=["short", "long"])


@pytest.mark.unit
def test_a_length_contrast_keeps_running_the_cells_it_needs_and_a_restart_agrees(tmp_path):
    """gate_scalar is far better on both regimes (both comparisons decided after the first
    wave or soon after), but by a different, noisy amount: the long-short contrast stays open
    and alone asks for more seeds of all four cells; a schedule rebuilt from the same results
    asks for the same cells."""
    schedule = _two_regimes(tmp_path)
    names = [h.name for h in schedule.family]
    assert [h.kind for h in schedule.family] == ["operator", "operator", "length"]
    noise = [3.0, -4.0, 1.0, -2.0, 4.0, -3.0, 2.0, -1.0, 3.5, -2.5, 1.5, -3.5, 2.5, -1.5]

    def acc(cell):
        gain = 0.30 if cell.dataset == "short" else 0.32 + noise[cell.seed] / 100
        return 0.5 + (gain if cell.fusion == "gate_scalar" else 0.0)

    for _ in range(4):
        _finish(schedule, schedule.needed(), acc)
    states = {n: s[-1] for n, s in schedule.states().items()}
    assert states[names[0]] == states[names[1]] == "better" and states[names[2]] == "open"
    needed = schedule.needed()
    assert {(c.dataset, c.fusion) for c in needed} == {
        (d, f) for d in ("short", "long") for f in ("add", "gate_scalar")
    }
    again = SeedSchedule(
        expand(load_sweep(tmp_path / "two_regimes.yaml")),
        "add",
        schedule.rule,
        dict(schedule.results),
        regimes=["short", "long"],
    )
    assert [c.cell_id for c in again.needed()] == [c.cell_id for c in needed]
    assert again.states() == schedule.states()
    only = _two_regimes(tmp_path / "ops", decide=["operator"])
    assert [h.kind for h in only.family] == ["operator", "operator"]


@pytest.mark.unit
def test_the_time_left_uses_the_open_hypotheses_and_the_status_line_fits(tmp_path):
    from fusion_ray.driver.callbacks import MLflowSweepCallback
    from fusion_ray.driver.progress import LINE_WIDTH, fit_line, time_left
    from fusion_ray.policy.plan import plan
    from fusion_ray.policy.seed_policy import AdaptiveSeedPolicy

    spec = _adaptive_sweep(tmp_path, first=2, most=12)
    policy = AdaptiveSeedPolicy(spec, plan(spec, None))
    assert policy.cells_left() == (6, 36)  # the first wave now; every cell at the cap
    opened, family = policy.hypotheses_open()
    assert opened == family == len(policy.schedule.family) > 0  # nothing decided yet
    acc = {"add": 0.5, "gate_scalar": 0.6, "concat": 0.5}
    while policy.schedule.needed():
        _finish(policy.schedule, policy.schedule.needed(), lambda c: acc[c.fusion])
    assert policy.cells_left() == (0, 0) and policy.hypotheses_open()[0] == 0
    text = time_left(3, 20.0, worst=30)
    assert text == "; about 60 s left, at most 10 min"
    assert time_left(3, 20.0) == "; about 60 s left" and time_left(0, 5.0, worst=0) == ""
    # the status line and each trial's line fit the console
    callback = MLflowSweepCallback(
        None, {c.cell_id: c for c in policy.schedule.cells}, {}, "parent", str(tmp_path),
        at_most=True, cells_left=lambda: (4, 30), hypotheses_open=lambda: (3, 5),
    )  # fmt: skip
    status = callback.status_line(12, "at most 36")
    assert status.startswith("status ") and "12/at most 36 trials, 3/5 hypotheses open" in status
    assert "left, at most" in status and len(status) <= LINE_WIDTH
    # a trial's line: where it ran shortened to its dataset before anything else is cut
    cell = next(iter(callback.cells.values()))
    callback.started_at[cell.cell_id] = 0.0
    callback.finished.add(cell.cell_id)
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        callback._progress(cell.cell_id, "test_acc 91.80% " + "z" * 40)
    (line,) = printed.getvalue().splitlines()
    lead = cell.run_name.rsplit(" | ", 1)[0]
    assert line.startswith(f"[1/at most {len(callback.cells)}] {lead} | {cell.dataset}: test_acc")
    assert len(line) <= LINE_WIDTH
    name = "gate_scalar scale_embeddings=false seed 13 | " + "x" * 80
    line = fit_line("[101/at most 168] ", name, ": FAILED: " + "y" * 200 + " (5.2 s)")
    assert len(line) == LINE_WIDTH and line.startswith("[101/at most 168] gate_scalar")


@pytest.mark.unit
def test_a_one_regime_sweep_decides_its_length_question_inside_the_dataset(tmp_path):
    """By default a sweep of one dataset asks whether each operator's effect differs between
    its longest and shortest test documents: its trials' quarter accuracies (what the searcher
    reads from each final result) feed those hypotheses; a run without them ends their rows."""
    spec = _adaptive_sweep(tmp_path, first=2, most=12, decide=None)
    schedule = _schedule(spec)
    kinds = [h.kind for h in schedule.family]
    assert kinds == ["operator", "operator", "length_within", "length_within"]
    gains = {"add": (0.0, 0.0), "gate_scalar": (0.05, 0.35), "concat": (0.02, 0.03)}

    def scores(cell):
        short, long = gains[cell.fusion]
        return {"all": 0.5 + (short + long) / 2, "shortest": 0.5 + short, "longest": 0.4 + long}

    _finish(schedule, schedule.needed(), scores)
    within = schedule.by_name
    values = schedule.deltas()
    trend = next(n for n in within if n.startswith("short:longest-shortest") and "gate" in n)
    assert values[trend] == pytest.approx([30.0, 30.0])
    while schedule.needed():
        _finish(schedule, schedule.needed(), scores)
    assert schedule.states()[trend][-1] == "better"
    assert schedule.by_name[trend].verdict("better") == "grows"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing", "infrastructure"),
        ("ray.exceptions.RayActorError: The actor died because its node has died. Node ID: ab", "infrastructure"),
        ("ray.exceptions.NodeDiedError: Task failed due to the node dying.", "infrastructure"),
        ("the spot instance was preempted", "infrastructure"),
        ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", "trial"),
        ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory", "trial"),
        ("FloatingPointError: the training loss is nan at epoch 1: lower train.lr", "trial"),
        ("", "trial"),
    ],
)  # fmt: skip
def test_a_lost_process_or_node_is_told_apart_from_a_trials_own_failure(reason, kind):
    """An operator that runs out of memory, or diverges, failed by its own doing (it counts);
    a process or node that died did not (Tune retried it; it is not scored)."""
    from fusion_ray.driver.callbacks import failure_kind

    assert failure_kind(reason) == kind


@pytest.mark.unit
def test_a_cell_lost_to_the_infrastructure_is_no_result_and_runs_again(tmp_path):
    from fusion_ray.driver.tracking import CellRun
    from fusion_ray.policy.schedule import finished_results
    from fusion_ray.policy.searcher import AdaptiveSeedSearcher

    spec = _adaptive_sweep(tmp_path, first=2, most=6)
    schedule = _schedule(spec)
    cells = schedule.needed()
    lost, failed = cells[0], cells[1]
    runs = {
        lost.cell_id: CellRun("r1", "FAILED", None, infrastructure=True),
        failed.cell_id: CellRun("r2", "FAILED", None),
    }
    results = finished_results(schedule.cells, runs)
    assert lost.cell_id not in results and results[failed.cell_id] is None
    # during a run: Tune scores the error first, the callback then says it was lost
    changes = []
    searcher = AdaptiveSeedSearcher(schedule, changes.append)
    first = searcher.suggest("t1")["cell_id"]
    searcher.on_trial_complete("t1", error=True)
    assert schedule.results[first] is None
    searcher.lost(first)
    assert first not in schedule.results and len(changes) == 2
    assert all(searcher.suggest(f"t{i}")["cell_id"] != first for i in range(2, 6))
