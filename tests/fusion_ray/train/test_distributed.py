"""Ray Train DDP for real: two gloo workers on CPU through TorchTrainer, and a killed worker group
that resumes from its checkpoint and ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fusion_ray.data.spec import DataSpec
from fusion_ray.model.spec import ModelSpec
from fusion_ray.train import TrainSpec, TrialConfig, run_trial
from fusion_ray.train.report import TrainReporter

pytestmark = pytest.mark.ray


@dataclass
class RecordingReporter(TrainReporter):
    """A real Ray Train reporter that also writes what this rank saw to ``out_dir``."""

    out_dir: str = ""
    crash_in_epoch: int | None = None
    snapshot: str = ""
    """The run's checkpoint manager snapshot, which the controller rewrites as it registers
    each checkpoint."""

    def on_train_batch(self, epoch: int, indices: list[int]) -> None:
        with open(Path(self.out_dir, f"batches_rank{self.rank}.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": epoch, "indices": [int(i) for i in indices]}) + "\n")

    def on_epoch_end(self, epoch: int, model: torch.nn.Module) -> None:
        digest = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
        with open(Path(self.out_dir, f"weights_rank{self.rank}.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": epoch, "sha": digest.hexdigest()}) + "\n")
        # Die hard at the end of epoch `crash_in_epoch`: no exception handling, no cleanup. First
        # wait until the controller has registered the previous epochs' checkpoints (a checkpoint
        # is durable only once it is registered): the restart then always resumes from there.
        marker = Path(self.out_dir, "crashed")
        if epoch == self.crash_in_epoch and self.rank == 1 and not marker.exists():
            marker.write_text(f"rank 1 killed itself at the end of epoch {epoch}")
            _wait_for_checkpoints(Path(self.snapshot), epoch)
            os._exit(1)


def _wait_for_checkpoints(snapshot: Path, count: int, timeout: float = 300) -> None:
    """Until Ray Train's checkpoint manager snapshot lists ``count`` registered checkpoints."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if len(json.loads(snapshot.read_text())["checkpoint_results"]) >= count:
                return
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or mid-write
            pass
        assert time.monotonic() < deadline, f"{count} checkpoint(s) never registered: {snapshot}"
        time.sleep(0.1)


def recording_worker(config: dict) -> None:
    base = TrainReporter.from_context()
    reporter = RecordingReporter(
        world_size=base.world_size,
        rank=base.rank,
        local_rank=base.local_rank,
        device=base.device,
        out_dir=config["out_dir"],
        crash_in_epoch=config.get("crash_in_epoch"),
        snapshot=config["snapshot"],
    )
    final = run_trial(config["trial"], reporter)
    if reporter.rank == 0:
        Path(config["out_dir"], "final.json").write_text(json.dumps(final))


def ddp_trial(cache: str) -> TrialConfig:
    return TrialConfig(
        dataset="short",
        data=DataSpec(
            source="synthetic",
            source_kwargs={
                "regime": "short",
                "n_train": 190,
                "n_validation": 48,
                "n_test": 48,
                "window": 48,
            },
            tokenizer="word",
            max_length=64,
            cache_dir=cache,
        ),
        model=ModelSpec(d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=64, fusion="concat"),
        train=TrainSpec(epochs=3, batch_size=32, lr=2e-3, latency_repeats=2, latency_batch_size=4),
        seed=7,
    )


def fit(out_dir: Path, storage: Path, trial: TrialConfig, **extra) -> None:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out_dir.mkdir(parents=True)
    snapshot = storage / out_dir.name / "checkpoint_manager_snapshot.json"
    TorchTrainer(
        recording_worker,
        train_loop_config={
            "trial": trial,
            "out_dir": str(out_dir),
            "snapshot": str(snapshot),
            **extra,
        },
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            name=out_dir.name,
            storage_path=str(storage),
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_two_worker_ddp_disjoint_shards_identical_weights_and_exact_recovery(
    tmp_path, ray_session, data_cache
):
    trial = ddp_trial(data_cache)
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    fit(clean, tmp_path / "storage", trial)

    # each epoch, the two ranks train on disjoint shards that together cover the training split
    seen = {rank: _lines(clean / f"batches_rank{rank}.jsonl") for rank in (0, 1)}
    for epoch in range(3):
        shards = [{i for b in seen[r] if b["epoch"] == epoch for i in b["indices"]} for r in (0, 1)]
        assert shards[0] and shards[1] and not shards[0] & shards[1]
        assert len(shards[0] | shards[1]) == 190
        steps = [sum(1 for b in seen[r] if b["epoch"] == epoch) for r in (0, 1)]
        assert steps[0] == steps[1]
    # after every epoch both ranks hold byte-identical weights
    w0, w1 = _lines(clean / "weights_rank0.jsonl"), _lines(clean / "weights_rank1.jsonl")
    assert w0 == w1 and len(w0) == 3

    # rank 1 dies at the end of epoch 1; Ray Train restarts the group from the epoch-0 checkpoint
    fit(crashed, tmp_path / "storage", trial, crash_in_epoch=1)
    assert (crashed / "crashed").exists()
    epochs = [w["epoch"] for w in _lines(crashed / "weights_rank1.jsonl")]
    assert epochs == [0, 1, 1, 2], (
        f"the restart must continue after epoch 0, not from scratch: {epochs}"
    )
    assert _lines(crashed / "weights_rank0.jsonl")[-1] == w0[-1], (
        "final weights differ from the clean run"
    )
    clean_final, crashed_final = (
        json.loads((d / "final.json").read_text()) for d in (clean, crashed)
    )
    for key in ("test_correct", "test_total", "best_val_acc", "best_epoch", "test_loss"):
        assert crashed_final[key] == clean_final[key], key
