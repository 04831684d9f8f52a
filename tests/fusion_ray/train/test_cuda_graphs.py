"""``train.cuda_graphs``: a full batch's training step recorded once per shape as a CUDA graph and
replayed. It must change how fast a step runs and nothing else: on a GPU the run with graphs
equals the run without bitwise (dropout included: the replays draw from the generator at the
same positions as the eager steps), also across a resume; on a CPU the setting does nothing; a
sweep that cannot use it is refused before anything runs; it never enters a cell's id.

cuDNN's attention backward pass is not deterministic (PyTorch warns and goes on under
``warn_only``): on the H100 two eager IMDB runs differed in the fifth digit of the training loss,
so there graphs can only be held to that spread. On this test's tiny model and on AG News eager
runs were reproducible, and graphs equalled them bitwise (bench/RESULTS.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from fusion_ray.config import load_sweep
from fusion_ray.config.grid import expand
from fusion_ray.train import TrainSpec, run_local
from fusion_ray.train import graphs as graphs_module
from fusion_ray.train.report import load_checkpoint_dir
from fusion_ray.train.spec import check_train_spec
from tests.conftest import tiny_sweep
from tests.helpers import sweep_with, tiny_trial

pytestmark = pytest.mark.unit

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

EPOCH_KEYS = ("epoch", "train_loss", "val_loss", "val_acc")
FINAL_KEYS = ("test_acc", "test_loss", "best_val_acc", "best_epoch")


def _epochs(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [{k: r[k] for k in EPOCH_KEYS} for r in rows if "val_loss" in r and "test_acc" not in r]


def _last_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint_dir(sorted((out / "checkpoints").glob("report_*"))[-1])["model"]


# ----------------------------------------------------------------------------- checks (CPU)


def test_cuda_graphs_needs_one_worker_one_pass_and_few_shapes() -> None:
    ok = TrainSpec(batch_size=32, cuda_graphs=True, pad_to_multiple=64)
    assert check_train_spec(ok) == []
    assert check_train_spec(TrainSpec(cuda_graphs=True, padding="max_length")) == []
    (workers,) = check_train_spec(ok, workers=2)
    assert workers.startswith("cuda_graphs: needs a one-worker trial (got 2 DDP workers)")
    micro = TrainSpec(batch_size=32, cuda_graphs=True, pad_to_multiple=64, micro_batch_size=8)
    (problem,) = check_train_spec(micro)
    assert "micro_batch_size (8)" in problem
    (shapes,) = check_train_spec(TrainSpec(cuda_graphs=True))
    assert "set pad_to_multiple" in shapes


def test_a_sweep_that_cannot_use_cuda_graphs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cuda_graphs: one graph is recorded per batch shape"):
        load_sweep(sweep_with(tmp_path, cuda_graphs=True))
    resources = {"workers": 2, "cpus_per_worker": 1}
    two_workers = tiny_sweep(tmp_path / "ddp", resources=resources)
    raw = yaml.safe_load(two_workers.read_text())
    raw["defaults"]["train"].update(cuda_graphs=True, pad_to_multiple=8)
    two_workers.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="cuda_graphs: needs a one-worker trial"):
        load_sweep(two_workers)


def test_cuda_graphs_never_changes_a_cell_id(tmp_path: Path) -> None:
    """How a step is launched, not what it computes: a sweep that turns graphs on keeps the ids
    (and finished cells) it had without them (tests/fusion_ray/config/test_config.py pins Table 1's)."""
    base = [c.cell_id for c in expand(load_sweep(sweep_with(tmp_path / "a", pad_to_multiple=8)))]
    on = expand(load_sweep(sweep_with(tmp_path / "b", pad_to_multiple=8, cuda_graphs=True)))
    assert {c.trial.train.cuda_graphs for c in on} == {True}
    assert [c.cell_id for c in on] == base


def test_on_a_cpu_cuda_graphs_changes_nothing(tmp_path: Path, data_cache: str) -> None:
    eager = run_local(tiny_trial(data_cache, pad_to_multiple=8, epochs=2), str(tmp_path / "e"))
    graphed = run_local(
        tiny_trial(data_cache, pad_to_multiple=8, epochs=2, cuda_graphs=True),
        str(tmp_path / "g"),
    )
    assert _epochs(tmp_path / "g") == _epochs(tmp_path / "e")
    assert {k: graphed[k] for k in FINAL_KEYS} == {k: eager[k] for k in FINAL_KEYS}


# ----------------------------------------------------------------------------- on a GPU


@needs_cuda
def test_graphed_training_equals_eager_training_bitwise(
    tmp_path: Path, data_cache: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    captures: list[tuple] = []
    capture = graphs_module.GraphedSteps._capture

    def counting_capture(self, input_ids, mask, labels):
        captures.append((tuple(input_ids.shape), mask is not None))
        return capture(self, input_ids, mask, labels)

    monkeypatch.setattr(graphs_module.GraphedSteps, "_capture", counting_capture)
    cuda = torch.device("cuda")
    trial = tiny_trial(data_cache, pad_to_multiple=8)
    assert trial.model.dropout > 0
    eager = run_local(trial, str(tmp_path / "eager"), device=cuda)
    assert captures == []
    graphed_trial = tiny_trial(data_cache, pad_to_multiple=8, cuda_graphs=True)
    graphed = run_local(graphed_trial, str(tmp_path / "graphed"), device=cuda)
    assert captures, "no step was graphed"
    assert len(set(captures)) == len(captures), "a shape was captured twice"
    assert _epochs(tmp_path / "graphed") == _epochs(tmp_path / "eager")
    assert {k: graphed[k] for k in FINAL_KEYS} == {k: eager[k] for k in FINAL_KEYS}
    w_eager, w_graphed = _last_weights(tmp_path / "eager"), _last_weights(tmp_path / "graphed")
    assert all(torch.equal(w_eager[k], w_graphed[k]) for k in w_eager)

    # resumed after epoch 0 (optimiser state and learning rate from the checkpoint), graphed
    with pytest.raises(KeyboardInterrupt):
        run_local(graphed_trial, str(tmp_path / "resumed"), device=cuda, stop_after_reports=1)
    resumed = run_local(graphed_trial, str(tmp_path / "resumed"), device=cuda)
    assert {k: resumed[k] for k in FINAL_KEYS} == {k: eager[k] for k in FINAL_KEYS}
    w_resumed = _last_weights(tmp_path / "resumed")
    assert all(torch.equal(w_eager[k], w_resumed[k]) for k in w_eager)
