"""The trainable registry, the report a trainable is given, and the contract suite: what is
accepted as a trainable and what is refused with the reason; ``check_trainable`` on every
registered trainable (the study's encoder included) and on trainables that break each part of
the contract."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fusion_ray.seeds import derive_seed
from fusion_ray.testing import check_trainable
from fusion_ray.trainables import (
    TRAINABLES,
    Report,
    as_trainable,
    register_trainable,
    run_trainable,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def registered() -> Iterator[list[str]]:
    """Names registered by a test, removed after it."""
    names: list[str] = []
    yield names
    for name in names:
        TRAINABLES.unregister(name)


def _register(names: list[str], name: str, **declared):
    def decorator(function):
        register_trainable(name, **declared)(function)
        names.append(name)
        return function

    return decorator


def _noisy(config, seed, report):
    """A deterministic toy: a value drawn from the seed, shifted by the config's effect; one
    report per step, each with a checkpoint of the step reached."""
    rng = np.random.default_rng(derive_seed(seed, "toy"))
    start = 0
    if report.resume_from is not None:
        start = json.loads(Path(report.resume_from, "state.json").read_text())["step"]
        rng = np.random.default_rng(derive_seed(seed, f"toy/{start}"))
    value = 0.0
    for step in range(start, config["steps"]):
        value = float(rng.normal()) + config["effect"]
        rng = np.random.default_rng(derive_seed(seed, f"toy/{step + 1}"))
        folder = Path(config["tmp"], f"step{step}")
        folder.mkdir(parents=True, exist_ok=True)
        Path(folder, "state.json").write_text(json.dumps({"step": step + 1}))
        report({"value": value}, step=step, checkpoint=folder)
    return {"score": value, "train_seconds": 0.1 * seed}


def test_every_registered_trainable_keeps_the_contract():
    """Over the registry as installed: the study's encoder (entry point ``study``) and any
    plug-in's; each returns a metric, repeats itself where it says so, differs by seed and
    resumes from its checkpoint."""
    assert "study" in TRAINABLES.names()
    for name in TRAINABLES.names():
        assert check_trainable(name)


def test_the_study_trainable_returns_test_accuracy_first():
    assert check_trainable("study") == "test_acc"


def test_a_function_and_a_class_are_trainables_and_declare_themselves(registered, tmp_path):
    config = {"steps": 3, "effect": 0.5, "tmp": str(tmp_path)}

    @_register(registered, "toy_function", deterministic=True, example=config)
    def toy(config, seed, report):
        return _noisy(config, seed, report)

    class Toy:
        deterministic = True
        example_config = config

        def __call__(self, config, seed, report):
            return _noisy(config, seed, report)

    TRAINABLES.register("toy_class")(as_trainable(Toy))
    registered.append("toy_class")
    assert check_trainable("toy_function") == "score"
    assert check_trainable("toy_class") == "score"
    entry = TRAINABLES.get("toy_class")
    assert entry.deterministic and entry.example == config


@pytest.mark.parametrize(
    ("candidate", "says"),
    [
        (3, "is not callable"),
        (lambda config, seed: {}, "takes (config, seed); a trainable takes (config, seed, report)"),
        (lambda: {}, "takes (nothing)"),
    ],
)
def test_what_cannot_be_a_trainable_is_refused_with_the_reason(candidate, says):
    with pytest.raises(TypeError, match=says.replace("(", r"\(").replace(")", r"\)")):
        as_trainable(candidate)


def test_an_unknown_trainable_name_lists_the_registered_ones_and_the_close_one():
    with pytest.raises(ValueError, match=r"unknown trainable 'stduy'.*did you mean 'study'"):
        TRAINABLES.get("stduy")


@pytest.mark.parametrize(
    ("metrics", "options", "says"),
    [
        ({"acc": "0.9"}, {}, "metric 'acc' is a str, not a number"),
        ({"": 1.0}, {}, "metric names must be non-empty strings"),
        ([("acc", 1.0)], {}, "metrics must be a mapping"),
        ({"acc": 1.0}, {"step": -1}, "step must be an int >= 0"),
        ({"acc": 1.0}, {"step": True}, "step must be an int >= 0"),
        ({"acc": 1.0}, {"checkpoint": "/no/such/folder"}, "is not a directory"),
    ],
)
def test_a_bad_report_is_refused_at_the_call_naming_what_is_wrong(metrics, options, says):
    seen = []
    report = Report(lambda m, c: seen.append(m), name="trainable 'toy'")
    with pytest.raises((TypeError, ValueError), match=f"trainable 'toy' report: .*{says}"):
        report(metrics, **options)
    assert seen == [] and report.reports == 0


def test_a_report_forwards_numbers_the_step_and_the_checkpoint(tmp_path):
    seen = []
    report = Report(lambda m, c: seen.append((m, c)))
    report({"acc": np.float32(0.5), "n": 3, "ok": True}, step=2, checkpoint=tmp_path)
    assert seen == [({"acc": 0.5, "n": 3.0, "ok": 1.0, "step": 2.0}, str(tmp_path))]
    assert report.reports == 1


@pytest.mark.parametrize(
    ("returned", "says"), [({}, "returned no metrics"), (0.9, "must be a mapping")]
)
def test_a_trainable_must_return_its_final_metrics(returned, says):
    entry = as_trainable(lambda config, seed, report: returned)
    with pytest.raises(TypeError, match=says):
        run_trainable(entry, {}, 0, Report(lambda m, c: None))


def test_the_trainable_gets_a_copy_of_the_config():
    config = {"nested": {"lr": 0.1}}

    def changes(config, seed, report):
        config["nested"]["lr"] = 99
        return {"x": 1.0}

    run_trainable(as_trainable(changes), config, 0, Report(lambda m, c: None))
    assert config == {"nested": {"lr": 0.1}}


def test_the_contract_suite_catches_a_trainable_that_ignores_its_seed(registered):
    @_register(registered, "seedless", example={})
    def seedless(config, seed, report):
        return {"score": 0.5}

    with pytest.raises(AssertionError, match="same metrics at seeds 0 and 1: it ignores its seed"):
        check_trainable("seedless")


def test_the_contract_suite_catches_a_false_claim_of_determinism(registered):
    draws = iter(range(100))

    @_register(registered, "drifting", deterministic=True, example={})
    def drifting(config, seed, report):
        return {"score": seed + next(draws)}

    with pytest.raises(AssertionError, match="declares itself deterministic.*score"):
        check_trainable("drifting")


def test_timings_are_not_held_to_determinism_or_counted_as_seed_differences(registered):
    calls = iter(range(100))

    @_register(registered, "timed", deterministic=True, example={})
    def timed(config, seed, report):
        return {"score": float(seed), "train_seconds": float(next(calls))}

    assert check_trainable("timed") == "score"

    @_register(registered, "only_timings_differ", example={})
    def only_timings_differ(config, seed, report):
        return {"score": 0.5, "latency_ms": float(next(calls))}

    with pytest.raises(AssertionError, match="ignores its seed"):
        check_trainable("only_timings_differ")


def test_the_contract_suite_catches_a_trainable_that_restarts_instead_of_resuming(
    registered, tmp_path
):
    config = {"steps": 3, "effect": 0.0, "tmp": str(tmp_path)}

    @_register(registered, "forgetful", deterministic=True, example=config)
    def forgetful(config, seed, report):
        report.resume_from = None  # never reads its checkpoint
        return _noisy(config, seed, report)

    with pytest.raises(AssertionError, match="made 3 reports, as many as a fresh run"):
        check_trainable("forgetful")


def test_the_contract_suite_names_a_bad_report(registered):
    @_register(registered, "chatty", example={})
    def chatty(config, seed, report):
        report({"phase": "warm-up"})
        return {"score": float(seed)}

    with pytest.raises(AssertionError, match="trainable 'chatty' at seed 0: .*'phase' is a str"):
        check_trainable("chatty")


def test_a_trainable_without_an_example_needs_a_config(registered):
    @_register(registered, "bare")
    def bare(config, seed, report):
        return {"score": float(seed + config["shift"])}

    with pytest.raises(AssertionError, match="declares no example config"):
        check_trainable("bare")
    assert check_trainable("bare", {"shift": 1}) == "score"
