"""Peak memory of one ArXiv-preset training step with and without gradient accumulation.

Every position method (as in ``bench/attention_memory.py``: each attention-level position with
sinusoidal P, each input-level position with none) trains one optimiser step of ``--batch``
full-length documents through the training loop's own ``accumulate_gradients`` (forward, loss
and backward per micro-batch, then clipping and Adam), once as one pass and once in
micro-batches of ``--micro`` documents, unpadded (the mask dropped) and padded (one document
half padding, so a mask is sent). The optimiser state exists before the step (allocated by a
zero-gradient step), as in training, so the step's extra memory is gradients and activations.

Peak memory is the step's peak above the memory in use just before it. On CUDA that is
``torch.cuda.max_memory_allocated`` (bf16 autocast, as the loop on a GPU); on CPU (fp32, as the
loop on a CPU) it is the process's peak resident set (``ru_maxrss``, which cannot be reset, so
each measurement runs in a fresh process) minus its resident set before the step.

    python bench/accumulation.py --device cpu --length 512 --batch 16 --micro 4
    python bench/accumulation.py --device cuda --length 4096 --batch 64 --micro 16
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from study_data import preset_model, study_preset  # noqa: E402

from fusion_ray.data import TokenizedSplit  # noqa: E402
from fusion_ray.model import ATTENTION_POSITIONS, POSITIONS, build_classifier  # noqa: E402
from fusion_ray.train.loop import accumulate_gradients, make_optimizer  # noqa: E402
from fusion_ray.train.spec import TrainSpec  # noqa: E402

VOCAB, CLASSES = 50_000, 11


def arxiv_specs(length: int, position: str, attention: str, micro: int | None, batch: int):
    """The ArXiv preset's model (sinusoidal P replaced by ``position``) and training settings."""
    model = preset_model("arxiv", max_len=length, position=position, attention_position=attention)
    train = {**study_preset("arxiv")["train"], "batch_size": batch, "micro_batch_size": micro}
    return model, TrainSpec(**train)


def full_length_split(batch: int, length: int, padded: bool) -> TokenizedSplit:
    """``batch`` documents of ``length`` random tokens; with ``padded`` the last is half as long."""
    rng = np.random.default_rng(0)
    lengths = [length] * batch
    if padded:
        lengths[-1] = length // 2
    return TokenizedSplit(
        ids=[rng.integers(1, VOCAB, size=n).astype(np.int64) for n in lengths],
        labels=rng.integers(0, CLASSES, size=batch).astype(np.int64),
        lengths=np.asarray(lengths, dtype=np.int64),
    )


def resident_bytes() -> int:
    """This process's resident set now (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def one_step(run: dict, device: torch.device) -> dict:
    """Peak MiB above the memory before the step, and the step's seconds, for one measurement."""
    model_spec, spec = arxiv_specs(
        run["length"], run["position"], run["attention"], run["micro"], run["batch"]
    )
    model = build_classifier(model_spec, VOCAB, CLASSES, seed=0).to(device).train()
    optimiser = make_optimizer(model, spec)
    for p in model.parameters():  # allocate Adam's state without changing the weights
        p.grad = torch.zeros_like(p)
    optimiser.step()
    optimiser.zero_grad(set_to_none=True)
    split = full_length_split(run["batch"], run["length"], run["padded"])
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    else:
        before = resident_bytes()
        high_water_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB
    started = time.perf_counter()
    indices = list(range(run["batch"]))
    accumulate_gradients(model, split, indices, len(indices), 1, spec, None, device)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimiser.step()
    if cuda:
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    seconds = time.perf_counter() - started
    if not cuda and peak <= high_water_before:
        # The step never rose above an earlier peak (building the model): its own is unknown.
        raise RuntimeError("the step's peak is hidden by an earlier one; use a larger --batch")
    result = {**run, "peak_mib": (peak - before) / 2**20, "seconds": seconds}
    if cuda:  # as bench/attention_memory.py reports it: everything allocated, model included
        result["total_peak_gib"] = peak / 2**30
    return result


def measure(run: dict, device: torch.device) -> dict:
    """One measurement: on CPU in a fresh process (its peak resident set starts clean), on CUDA
    here (the peak counter is reset); a step that does not fit has ``peak_mib`` None."""
    if device.type == "cuda":
        try:
            return one_step(run, device)
        except torch.OutOfMemoryError:
            return {**run, "peak_mib": None, "seconds": None}
        finally:
            torch.cuda.empty_cache()
    out = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(run)], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"the measurement {run} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def methods() -> list[tuple[str, str]]:
    """(input position, attention position) pairs, as in bench/attention_memory.py."""
    pairs = [("sinusoidal", a) for a in ATTENTION_POSITIONS.names()]
    return pairs + [(p, "none") for p in POSITIONS.names() if p != "sinusoidal"]


def row_text(run: dict, one_pass: dict) -> str:
    micro = (
        "one pass" if run["micro"] is None else f"{run['batch'] // run['micro']} x {run['micro']}"
    )
    padding = "padded" if run["padded"] else "unpadded"
    if run["peak_mib"] is None:
        return f"{run['position']:<16} {run['attention']:<9} {padding:<8} {micro:<9} out of memory"
    ratio = ""
    if run is not one_pass and one_pass["peak_mib"]:
        ratio = f"{run['peak_mib'] / one_pass['peak_mib']:>6.2f}x"
    return (
        f"{run['position']:<16} {run['attention']:<9} {padding:<8} {micro:<9} "
        f"{run['peak_mib']:>10.1f} {run['seconds']:>8.2f} {ratio}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--length", type=int, default=4096, help="tokens per document")
    parser.add_argument("--batch", type=int, default=64, help="documents per optimiser step")
    parser.add_argument("--micro", type=int, default=16, help="documents per micro-batch")
    parser.add_argument("--out", default=None, help="JSON results file")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a CPU child process
    args = parser.parse_args()
    if args.one is not None:
        torch.manual_seed(0)
        print(json.dumps(one_step(json.loads(args.one), torch.device("cpu"))))
        return
    if args.batch % args.micro:
        parser.error(f"--micro {args.micro} must divide --batch {args.batch}")
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    precision = "bf16 autocast" if device.type == "cuda" else "fp32"
    print(
        f"device: {name} | torch {torch.__version__} | {torch.get_num_threads()} threads | "
        f"L = {args.length} | batch {args.batch} | micro-batches of {args.micro} | {precision}"
    )
    print(
        f"{'position':<16} {'attention':<9} {'padding':<8} {'passes':<9} {'peak MiB':>10} "
        f"{'s/step':>8} vs one pass"
    )
    rows = []
    for position, attention in methods():
        for padded in (False, True):
            base = {"position": position, "attention": attention, "padded": padded}
            base |= {"length": args.length, "batch": args.batch}
            one_pass = measure({**base, "micro": None}, device)
            accumulated = measure({**base, "micro": args.micro}, device)
            for run in (one_pass, accumulated):
                print(row_text(run, one_pass), flush=True)
            rows += [one_pass, accumulated]
    if args.out:
        Path(args.out).write_text(json.dumps({"device": name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
