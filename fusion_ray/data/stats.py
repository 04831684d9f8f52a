"""Length statistics of a split, in tokens before truncation."""

from __future__ import annotations

import numpy as np


def length_stats(lengths: np.ndarray, max_length: int, dropped_empty: int = 0) -> dict[str, float]:
    """n_docs, dropped_empty, mean, median, p90, p99, max tokens and the clip rate at max_length."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        nan = float("nan")
        return {
            "n_docs": 0.0,
            "dropped_empty": float(dropped_empty),
            "mean": nan,
            "median": nan,
            "p90": nan,
            "p99": nan,
            "max": nan,
            "clip_rate": nan,
        }
    return {
        "n_docs": float(len(lengths)),
        "dropped_empty": float(dropped_empty),
        "mean": float(lengths.mean()),
        "median": float(np.median(lengths)),
        "p90": float(np.percentile(lengths, 90)),
        "p99": float(np.percentile(lengths, 99)),
        "max": float(lengths.max()),
        "clip_rate": float(np.mean(lengths > max_length)),
    }


def format_stats(stats: dict[str, dict[str, float]]) -> str:
    """A small fixed-width table of per-split statistics (for logs and the README)."""
    cols = ["n_docs", "dropped_empty", "mean", "median", "p90", "p99", "clip_rate"]
    lines = ["split       " + " ".join(f"{c:>13}" for c in cols)]
    for split, s in stats.items():
        cells = []
        for c in cols:
            v = s.get(c, float("nan"))
            cells.append(f"{v:>13.3f}" if c == "clip_rate" else f"{v:>13.1f}")
        lines.append(f"{split:<12}" + " ".join(cells))
    return "\n".join(lines)
