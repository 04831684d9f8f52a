"""The planner: the sweep's own schedule replayed on simulated results says how many seeds each
hypothesis and how many trials the sweep will take; its 5-95 % band holds what the sweep then
does; a pilot's runs stay the sweep's own; bad input is one message before any replay."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from mlflow import MlflowClient

from fusion_ray import api
from fusion_ray.config import load_sweep
from fusion_ray.config.grid import expand
from fusion_ray.planner import main as plan_main
from fusion_ray.policy.schedule import SeedSchedule, arm_of
from fusion_ray.schema import ROLE_TAG, ROLE_TRIAL
from fusion_ray.study.forecast import (
    ForecastInputError,
    PilotWorld,
    StatedWorld,
    decided_after,
    forecast,
    pilot_rows,
)
from tests.conftest import tiny_sweep

pytestmark = pytest.mark.unit


def _sweep(tmp_path, first=4, most=10, **changes):
    """Two regimes (short, long) x add / gate_scalar: 2 operator comparisons and 1 length trend."""
    path = tiny_sweep(tmp_path, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    raw = yaml.safe_load(path.read_text())
    raw["seeds"] = {"adaptive": True, "first": first, "max": most}
    raw["grid"]["datasets"] = ["short", "long"]
    raw["datasets"]["long"] = raw["datasets"]["short"]
    raw |= changes
    path.write_text(yaml.safe_dump(raw))
    return load_sweep(path), path


def _forecast(spec, world, **kw):
    return forecast(
        expand(spec), spec.baseline_label, spec.adaptive, world, regimes=spec.grid.datasets, **kw
    )


def test_a_clear_effect_is_forecast_decided_and_a_null_one_stopped_as_futile(tmp_path):
    spec, _ = _sweep(tmp_path)
    clear = _forecast(spec, StatedWorld({"gate_scalar": 20.0}, spread=2.0), replays=40)
    null = _forecast(spec, StatedWorld({}, spread=3.5), replays=40)
    operator = [h for h in clear.hypotheses if h.kind == "operator"]
    assert len(operator) == 2 and all(h.decided == 1.0 for h in operator)
    assert all(h.seeds.max() < spec.adaptive.max for h in operator)
    assert all(h.decided <= 0.15 for h in null.hypotheses)  # decided by chance only
    cells = len(expand(spec))
    first_wave = sum(1 for c in expand(spec) if c.seed < spec.adaptive.first)
    for result in (clear, null):
        assert first_wave <= result.trials.min() and result.trials.max() <= cells
        assert result.worst_case == cells and result.done == 0
    # a null stops early as futile (its evidence too low to reach 1/alpha by the cap): fewer
    # trials than the clear effect, which runs to the seeds its closed test needs
    assert all(h.futile >= 0.6 for h in null.hypotheses)
    assert null.trials.mean() < clear.trials.mean()


def test_a_forecast_is_the_same_for_the_same_seed(tmp_path):
    spec, _ = _sweep(tmp_path)
    world = StatedWorld({"gate_scalar": 3.0}, spread=3.5)
    one, two = (_forecast(spec, world, replays=15, seed=7) for _ in range(2))
    assert one.lines() == two.lines()
    assert np.array_equal(one.trials, two.trials)


def test_the_band_holds_the_seeds_the_sweep_then_used(tmp_path):
    """Worlds of known effects; a pilot of the first wave drawn from each; the forecast from the
    pilot alone; then the sweep continued in the same world from that pilot. The seeds each
    hypothesis was decided after (or had, open, at the cap) fall in the forecast's 5-95 % band
    in at least 85 % of cases (bench/planner.py measures the quickstart's design)."""
    spec, _ = _sweep(tmp_path, first=4, most=10)
    cells = expand(spec)
    arms = list(dict.fromkeys(arm_of(c) for c in cells))
    rng = np.random.default_rng(11)
    inside = total = 0
    for w in range(40):
        effects = {f"{d}/gate_scalar": float(rng.choice([0, 2, 4, 8])) for d in ("short", "long")}
        truth = StatedWorld(effects, spread=2.5).replay(rng, arms)
        pilot = {c.cell_id: truth(c.seed)[arm_of(c)] for c in cells if c.seed < 4}
        rows, known = pilot_rows(cells, pilot)
        result = _forecast(spec, PilotWorld(rows), known=known, replays=40, seed=w)
        results = dict(known)
        schedule = SeedSchedule(cells, "add", spec.adaptive, results, regimes=["short", "long"])
        while needed := schedule.needed():
            for cell in needed:
                results[cell.cell_id] = truth(cell.seed)[arm_of(cell)]
        states, deltas = schedule.states(), schedule.deltas()
        for h in result.hypotheses:
            lo, hi = h.band
            inside += lo <= decided_after(states[h.name], len(deltas[h.name])) <= hi
            total += 1
    assert total == 120 and inside / total >= 0.85, inside / total  # 0.91 at this seed


def test_a_pilots_runs_are_kept_and_only_its_complete_seeds_are_drawn_again(tmp_path):
    spec, _ = _sweep(tmp_path)
    cells = expand(spec)
    results = {c.cell_id: 0.5 + 0.1 * (c.fusion == "gate_scalar") for c in cells if c.seed < 4}
    dropped = next(c for c in cells if c.seed == 3)
    del results[dropped.cell_id]  # seed 3 is incomplete: not a row
    rows, known = pilot_rows(cells, results)
    assert len(rows) == 3 and len(known) == len(results)
    rows2, known2 = pilot_rows(cells, results, seeds=2)
    assert len(rows2) == 2 and all(c.seed < 2 for c in cells if c.cell_id in known2)
    result = _forecast(spec, PilotWorld(rows), known=known, replays=10)
    assert result.done == len(known) and result.trials.min() >= len(known)
    with pytest.raises(ForecastInputError, match="at least 2 seeds with a result in every cell"):
        PilotWorld(rows[:1])


def _log_pilot(spec, seeds=4, seconds=30.0):
    """The first wave as a driver logs it: one FINISHED trial run per cell, test_acc and times."""
    client = MlflowClient(spec.tracking_uri)
    experiment = client.create_experiment(spec.name)
    rng = np.random.default_rng(3)
    for cell in expand(spec):
        if cell.seed >= seeds:
            continue
        run = client.create_run(
            experiment, tags={ROLE_TAG: ROLE_TRIAL, "cell_id": cell.cell_id}, start_time=1_000
        )
        acc = 0.7 + (0.06 if cell.fusion == "gate_scalar" else 0.0) + rng.normal(0, 0.02)
        client.log_metric(run.info.run_id, "test_acc", acc)
        client.set_terminated(run.info.run_id, "FINISHED", end_time=1_000 + int(seconds * 1000))


def test_a_pilot_in_the_tracking_store_gives_the_forecast_and_its_trial_hours(tmp_path, capsys):
    spec, path = _sweep(tmp_path)
    _log_pilot(spec)
    result = api.forecast(spec, pilot=spec.name, replays=20)
    assert result.done == 16 and result.hours is not None
    assert result.per_trial == {"short": pytest.approx(30 / 3600), "long": pytest.approx(30 / 3600)}
    # the hours still to run are the trials still to run at 30 s each (CPU trials)
    assert np.allclose(result.hours, (result.trials - 16) * 30 / 3600)
    assert plan_main([str(path), "--pilot", "--replays", "20"]) == 0
    out = capsys.readouterr().out
    assert (
        f"plan {spec.name}: seeds 4 to 10, alpha 0.05, 3 hypotheses; 20 replays from pilot" in out
    )
    assert "trial-hours still to run: mean" in out and "short 30 s, long 30 s per trial" in out
    assert "short/sinusoidal/none: gate_scalar vs add" in out


def test_the_planners_mistakes_are_one_message_and_exit_2(tmp_path, capsys):
    spec, path = _sweep(tmp_path)
    assert plan_main([str(path), "--pilot"]) == 2
    assert f"pilot: no experiment '{spec.name}'" in capsys.readouterr().err
    assert plan_main([str(path), "--effects", "gate_scalr=2"]) == 2
    assert "effects: 'gate_scalr' names no operator of the sweep" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plan_main([str(path), "--effects", "gate_scalar"])
    assert "write OPERATOR=POINTS" in capsys.readouterr().err
    for hours in ("=0.5", "short=half", ","):  # no dataset, no number, nothing
        with pytest.raises(SystemExit):
            plan_main([str(path), "--effects", "gate_scalar=2", "--trial-hours", hours])
        assert "DATASET=HOURS" in capsys.readouterr().err
    fixed = tiny_sweep(tmp_path, name="fixed")
    assert plan_main([str(fixed), "--effects", "gate_scalar=2"]) == 2
    assert "plan forecasts adaptive seeds" in capsys.readouterr().err
    with pytest.raises(ForecastInputError, match="one of them"):
        api.forecast(spec)


def test_stated_effects_print_the_forecast(tmp_path, capsys):
    _, path = _sweep(tmp_path)
    assert plan_main([str(path), "--effects", "gate_scalar=6", "--replays", "20"]) == 0
    out = capsys.readouterr().out
    assert "20 replays from stated effects gate_scalar=6, spread 3.5, shared 0 points" in out
    assert "trials: mean" in out and "hours" not in out
    assert (
        plan_main(
            [
                str(path),
                "--effects",
                "gate_scalar=6",
                "--replays",
                "5",
                "--trial-hours",
                "short=0.5,long=1",
            ]
        )
        == 0
    )
    assert "card-hours still to run: mean" in capsys.readouterr().out


def test_measured_epoch_times_give_the_card_hours_of_the_studys_presets():
    """--chip: an H200 ArXiv trial of 20 epochs is 20 measured epochs and one test pass; AG News
    trials run two to a card at the measured aggregate speed-up."""
    import json

    from fusion_ray.config import Resources
    from fusion_ray.study.forecast import MEASURED_TRIALS, measured_trial_hours

    table = json.loads(MEASURED_TRIALS.read_text())["H200"]["datasets"]
    one_card = Resources(workers=1, use_gpu=True, gpus_per_worker=1)
    hours, text = measured_trial_hours("h200", {"arxiv": (20, one_card), "ag_news": (10, one_card)})
    arxiv, news = table["arxiv"], table["ag_news"]
    assert hours["arxiv"] == pytest.approx(
        (20 * arxiv["epoch_seconds"] + arxiv["test_seconds"]) / 3600
    )
    assert hours["ag_news"] == pytest.approx(
        (10 * news["epoch_seconds"] + news["test_seconds"]) / news["speedup"] / 3600
    )
    assert "H200 epoch times measured" in text and "upper bound" in text
    with pytest.raises(
        ForecastInputError, match="no measured epoch times for it; measured: H100, H200"
    ):
        measured_trial_hours("A10G", {"arxiv": (20, one_card)})
    with pytest.raises(ForecastInputError, match="no H100 times for short"):
        measured_trial_hours("H100", {"short": (5, one_card)})
    ddp = Resources(workers=4, use_gpu=True, gpus_per_worker=1)
    with pytest.raises(ForecastInputError, match="one card per trial"):
        measured_trial_hours("H100", {"arxiv": (20, ddp)})
