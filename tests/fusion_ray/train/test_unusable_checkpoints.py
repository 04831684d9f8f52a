"""A checkpoint that cannot be loaded (a truncated, empty or garbage state file) or does not fit the
trial's model (other weights or shapes, a key missing) is set aside, renamed
``<folder>.unreadable``, and the trial starts again from scratch, exactly as a fresh run: its
first report carries one note naming the checkpoint and why (``CHECKPOINT_SET_ASIDE``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from fusion_ray.model import build_classifier
from fusion_ray.train import run_trial
from fusion_ray.train.checkpoint import Progress, checkpoint_state, resume
from fusion_ray.train.loop import make_optimizer, run_local
from fusion_ray.train.report import LocalReporter, load_checkpoint_dir, set_aside_folder
from fusion_ray.train.result import CHECKPOINT_SET_ASIDE, SetAside, TrialResult
from tests.helpers import tiny_trial

pytestmark = pytest.mark.unit

TIMING = ("latency_ms_per_sample", "train_seconds", "loop_seconds")


def _without_timing(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in TIMING}


def _checkpoints(out_dir: Path) -> list[Path]:
    return sorted((out_dir / "checkpoints").iterdir())


def _last_weights(out_dir: Path) -> dict[str, torch.Tensor]:
    folders = [p for p in _checkpoints(out_dir) if p.suffix != ".unreadable"]
    return load_checkpoint_dir(folders[-1])["model"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory, data_cache) -> tuple[dict, Path]:
    """The tiny trial's final metrics and folder, run once from scratch."""
    out = tmp_path_factory.mktemp("clean")
    return run_local(tiny_trial(data_cache), str(out)), out


DAMAGES = {
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "garbage": lambda data: b"not a checkpoint\n" * 64,
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_an_unreadable_checkpoint_is_set_aside_and_the_trial_starts_again(
    tmp_path, data_cache, clean, damage
):
    trial = tiny_trial(data_cache)
    with pytest.raises(KeyboardInterrupt):
        run_local(trial, str(tmp_path), stop_after_reports=2)  # checkpoints of epochs 0 and 1
    latest = _checkpoints(tmp_path)[-1]
    state = latest / "state.pt"
    state.write_bytes(DAMAGES[damage](state.read_bytes()))

    reporter = LocalReporter(out_dir=str(tmp_path))
    final = run_trial(trial, reporter)  # today: a torch.load traceback, on every rerun

    assert [m.get("epoch") for m in reporter.history] == [0, 1, 2, None]  # from epoch 0 again
    note = reporter.history[0][CHECKPOINT_SET_ASIDE]
    assert note.startswith(f"{latest}: state.pt: ")
    assert note.endswith(f"; set aside as {latest}.unreadable")
    assert all(CHECKPOINT_SET_ASIDE not in m for m in reporter.history[1:])  # one note
    assert Path(f"{latest}.unreadable", "state.pt").exists()  # kept as it was, to look at
    assert _without_timing(final) == _without_timing(clean[0])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[2])[CHECKPOINT_SET_ASIDE] == note  # after the two earlier reports
    # a rerun resumes from the new run's checkpoints, not from the one set aside
    rerun = LocalReporter(out_dir=str(tmp_path))
    assert _without_timing(run_trial(trial, rerun)) == _without_timing(clean[0])
    assert [m.get("epoch") for m in rerun.history] == [None]  # only re-tested
    assert all(CHECKPOINT_SET_ASIDE not in m for m in rerun.history)


def test_a_checkpoint_of_another_model_is_set_aside_and_training_starts_from_scratch(
    tmp_path, data_cache, clean
):
    trial = tiny_trial(data_cache)
    wider = dataclasses.replace(trial, model=dataclasses.replace(trial.model, d_model=32))
    run_local(wider, str(tmp_path))  # a finished run of another d_model in the same folder
    latest = _checkpoints(tmp_path)[-1]

    reporter = LocalReporter(out_dir=str(tmp_path))
    final = run_trial(trial, reporter)

    note = TrialResult.of(reporter.history[0]).set_aside
    assert note is not None and note.path == str(latest)
    assert note.reason.startswith("the saved weights do not fit the model: ")
    assert "(the model's (" in note.reason and note.moved_to == f"{latest}.unreadable"
    assert Path(note.moved_to).is_dir() and reporter.history[0]["epoch"] == 0
    # started from scratch exactly: the weights and metrics of a fresh run with the same seed
    assert _without_timing(final) == _without_timing(clean[0])
    fresh, resumed = _last_weights(clean[1]), _last_weights(tmp_path)
    assert fresh.keys() == resumed.keys()
    for name in fresh:
        assert torch.equal(fresh[name], resumed[name]), name


def _misfits() -> dict:
    def drop(key):
        return lambda s: {k: v for k, v in s.items() if k != key}

    def weights(change):
        return lambda s: {**s, "model": change(dict(s["model"]))}

    first = "encoder.blocks.0.norm1.weight"
    return {
        "a key missing": (drop("scheduler"), "the state has no 'scheduler'"),
        "progress of another shape": (
            lambda s: {**s, "progress": {**s["progress"], "epochs": 3}},
            "the saved progress does not fit: ",
        ),
        "a weight missing": (
            weights(lambda w: {k: v for k, v in w.items() if k != first}),
            f"the saved weights do not fit the model: missing {first}",
        ),
        "an unexpected weight": (
            weights(lambda w: {**w, "extra.weight": torch.zeros(2)}),
            "the saved weights do not fit the model: unexpected extra.weight",
        ),
        "a weight of another shape": (
            weights(lambda w: {**w, first: torch.zeros(3)}),
            f"the saved weights do not fit the model: shape {first} (3,) (the model's (16,))",
        ),
        "best weights of another shape": (
            lambda s: {**s, "best_model": {**s["model"], first: torch.zeros(3)}},
            "the saved best weights do not fit the model: shape",
        ),
        "other optimizer groups": (
            lambda s: {
                **s,
                "optimizer": {
                    **s["optimizer"],
                    "param_groups": [{**s["optimizer"]["param_groups"][0], "params": [0, 1]}],
                },
            },
            "the saved optimizer has groups of [2] parameters, not [",
        ),
        "not a training state": (lambda s: [1, 2], "the state is a list, not a training state"),
        "an RNG state of another size": (
            lambda s: {**s, "rng": [{"torch": torch.zeros(3, dtype=torch.uint8)}]},
            "the saved RNG state is not a generator's",
        ),
    }


CPU = torch.device("cpu")


def _fresh(trial, vocab_size: int = 40):
    """A model as built for ``trial`` (another seed), its optimiser and schedule."""
    model = build_classifier(trial.model, vocab_size, 2, trial.seed + 1)
    optimizer = make_optimizer(model, trial.train)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


@pytest.mark.parametrize("case", sorted(_misfits()))
def test_a_state_that_does_not_fit_is_set_aside_before_anything_is_loaded(
    tmp_path, data_cache, case
):
    change, says = _misfits()[case]
    trial = tiny_trial(data_cache)
    model = build_classifier(trial.model, 40, 2, trial.seed)
    optimizer = make_optimizer(model, trial.train)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    optimizer.zero_grad()
    model(torch.ones(2, 5, dtype=torch.long), None).sum().backward()
    optimizer.step()  # an optimiser with state, as a checkpoint holds it
    state = checkpoint_state(
        model, optimizer, scheduler, Progress(epochs_done=1), None, trial, torch.device("cpu")
    )
    folder = tmp_path / "checkpoints" / "report_0000"
    folder.mkdir(parents=True)
    torch.save(change(state), folder / "state.pt")
    fresh, fresh_optimizer, fresh_scheduler = _fresh(trial)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}

    reporter = LocalReporter(out_dir=str(tmp_path))
    assert resume(reporter, fresh, fresh_optimizer, fresh_scheduler, 0, CPU) is None

    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())  # untouched
    assert fresh_optimizer.state_dict()["state"] == {}
    note = SetAside.parse(reporter.with_note({})[CHECKPOINT_SET_ASIDE])
    assert note.reason.startswith(says), note.reason
    assert note.path == str(folder) and note.moved_to == f"{folder}.unreadable"
    assert not folder.exists() and Path(note.moved_to, "state.pt").exists()
    assert reporter.with_note({"epoch": 0}) == {"epoch": 0}  # the note goes with one report


def test_a_folder_set_aside_twice_keeps_both_and_an_empty_one_is_left_alone(tmp_path):
    for _ in range(2):
        folder = tmp_path / "checkpoint_000001"
        folder.mkdir()
        (folder / "state.pt").write_bytes(b"damaged")
        moved = set_aside_folder(folder, leave_empty=True)
        assert moved is not None and (moved / "state.pt").exists()
        assert folder.is_dir() and not any(folder.iterdir())  # where Ray looks for it
        folder.rmdir()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["checkpoint_000001.unreadable", "checkpoint_000001.unreadable.1"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert set_aside_folder(empty) is None and empty.is_dir()


@pytest.mark.parametrize(
    "note",
    [
        "/s/t/checkpoint_000002: state.pt: EOFError: the file is empty or cut short; set aside "
        "as /s/t/checkpoint_000002.unreadable",
        "s3://bucket/sweep/checkpoint_000002: state.pt: RuntimeError: bad; left in place",
    ],
)
def test_the_note_reads_back_as_written(note):
    read = SetAside.parse(note)
    assert read.text == note and read.reason.startswith("state.pt: ")
    assert read.path.endswith("checkpoint_000002")
    assert (read.moved_to is None) == note.startswith("s3://")


@pytest.mark.parametrize("source", ["resume_from", "tune's own", "remote"])
def test_a_tune_trial_sets_aside_its_checkpoint_or_resume_from(
    tmp_path, data_cache, monkeypatch, source
):
    """``resume_from`` (an earlier invocation's) is renamed; Tune's own checkpoint too, with an
    empty folder left where it was (Tune deletes it once newer ones come); one on a remote file
    system is left in place."""
    import pyarrow.fs
    from ray import tune
    from ray.train import Checkpoint

    from fusion_ray.train.report import TuneReporter

    folder = tmp_path / "storage" / "trial" / "checkpoint_000001"
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(b"not a checkpoint\n" * 64)
    own = {
        "tune's own": Checkpoint(str(folder)),
        "remote": Checkpoint(
            "storage/trial/checkpoint_000001",
            pyarrow.fs.SubTreeFileSystem(str(tmp_path), pyarrow.fs.LocalFileSystem()),
        ),
    }.get(source)
    monkeypatch.setattr(tune, "get_checkpoint", lambda: own)
    reporter = TuneReporter(resume_from=str(folder) if source == "resume_from" else None)

    assert resume(reporter, *_fresh(tiny_trial(data_cache)), 0, CPU) is None

    note = SetAside.parse(reporter.with_note({})[CHECKPOINT_SET_ASIDE])
    assert note.reason.startswith("state.pt: UnpicklingError: ")
    if source == "remote":
        assert note.path == "subtree://storage/trial/checkpoint_000001"
        assert note.moved_to is None and (folder / "state.pt").exists()  # left in place
        return
    assert note.path == str(folder) and note.moved_to == f"{folder}.unreadable"
    assert Path(note.moved_to, "state.pt").exists()
    assert folder.is_dir() == (source == "tune's own") and not any(folder.glob("*"))
