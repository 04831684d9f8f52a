"""Under DDP every rank resumes from the checkpoint or none does: when one rank cannot load it,
every rank starts again from scratch (a rank that resumed alone would train other weights, or
wait forever in a collective the others never reach), and rank 0 sets it aside naming that rank."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fusion_ray.model import build_classifier
from fusion_ray.train.checkpoint import Progress, checkpoint_state, resume
from fusion_ray.train.loop import make_optimizer
from fusion_ray.train.report import LocalReporter
from fusion_ray.train.result import CHECKPOINT_SET_ASIDE
from tests.helpers import tiny_trial

pytestmark = pytest.mark.process

CPU = torch.device("cpu")


def _model_and_optimizer(data_cache: str):
    trial = tiny_trial(data_cache)
    model = build_classifier(trial.model, 40, 2, trial.seed)
    optimizer = make_optimizer(model, trial.train)
    return trial, model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)


def _rank(rank: int, root: str, data_cache: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=2
    )
    try:
        _, model, optimizer, scheduler = _model_and_optimizer(data_cache)
        # each rank reads its own copy here, so that one rank alone can fail to read it
        reporter = LocalReporter(out_dir=f"{root}/rank{rank}", rank=rank, world_size=2)
        resumed = resume(reporter, model, optimizer, scheduler, rank, CPU)
        note = reporter.with_note({}).get(CHECKPOINT_SET_ASIDE)
        Path(root, f"rank{rank}.json").write_text(
            json.dumps({"resumed": resumed is not None, "note": note})
        )
        # both ranks done before either tears the group down: a rank that destroys it while
        # the other still talks to it can abort in gloo ("terminate called without an active
        # exception"), as one did on a loaded 2-core machine
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # the interpreter's own exit then tears down gloo's threads in static destructors, which
    # aborted a rank the same way once more on 2 cores (2026-12-02, after the barrier above):
    # everything this rank had to say is written, so it leaves at once, exit status 0
    os._exit(0)


@pytest.mark.parametrize("damaged", [[], [1], [0, 1]])
def test_every_rank_resumes_or_none_does(tmp_path, data_cache, damaged):
    trial, model, optimizer, scheduler = _model_and_optimizer(data_cache)
    state = checkpoint_state(model, optimizer, scheduler, Progress(epochs_done=1), None, trial, CPU)
    for rank in (0, 1):
        folder = tmp_path / f"rank{rank}" / "checkpoints" / "report_0000"
        folder.mkdir(parents=True)
        torch.save(state, folder / "state.pt")
        if rank in damaged:
            (folder / "state.pt").write_bytes(b"")

    mp.spawn(_rank, args=(str(tmp_path), data_cache), nprocs=2, join=True)

    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["resumed"] for s in seen] == [not damaged] * 2
    assert seen[1]["note"] is None  # rank 0 speaks for the trial (Ray Train reports its metrics)
    kept = tmp_path / "rank0" / "checkpoints" / "report_0000"
    if not damaged:
        assert seen[0]["note"] is None and kept.is_dir()
        return
    who = "" if 0 in damaged else "rank 1: "
    assert seen[0]["note"].startswith(f"{kept}: {who}state.pt: EOFError")
    assert not kept.exists() and Path(f"{kept}.unreadable", "state.pt").exists()
    assert (tmp_path / "rank1" / "checkpoints" / "report_0000").is_dir()  # rank 0's to move
