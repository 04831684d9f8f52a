"""Draws docs/assets/dataflow.svg, the data-flow diagram of the Home and Architecture pages:
``python docs/dataflow.py`` (tests/docs/test_docs_tables.py checks that the committed file
shows every box this draws)."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).resolve().parent / "assets" / "dataflow.svg"

# (x, y, text, fill): the boxes, top to bottom in two columns
BOXES = [
    (0.0, 7.0, "sweeps/*.yaml\na sweep file", "#e8eaf6"),
    (0.0, 5.8, "fusion_ray.config\nvalidate everything first, build every grid point", "#c5cae9"),
    (0.0, 4.6, "config.grid + policy.plan\ncells, stable cell ids, what is FINISHED", "#c5cae9"),
    (0.0, 3.4, "fusion_ray.policy\nfixed seeds, or adaptive: what decisions still need", "#c5cae9"),
    (0.0, 2.2, "Ray Tune (one trial per cell)\nRay Train DDP when workers > 1", "#ffe0b2"),
    (0.0, 1.0, "fusion_ray.train\nthe per-worker loop: metrics, checkpoints", "#ffe0b2"),
    (6.2, 1.0, "fusion_ray.driver.tracking\nthe one MLflow writer", "#c8e6c9"),
    (6.2, 2.2, "MLflow runs\none run per cell; the sweep's parent run", "#c8e6c9"),
    (6.2, 3.4, "fusion_ray.decide\none closed test over every hypothesis", "#f8bbd0"),
    (6.2, 4.6, "analysis\nload, pair, verdicts, statistics", "#b3e5fc"),
    (6.2, 5.8, "the report\nreport.md / .html, tables, figures", "#b3e5fc"),
]
# (from box, to box, label)
ARROWS = [
    (0, 1, ""), (1, 2, ""), (2, 3, ""), (3, 4, "cells needed now"), (4, 5, ""),
    (5, 6, "results"), (6, 7, ""), (7, 8, "finished runs (driver and report)"),
    (8, 3, "open hypotheses"), (9, 10, ""), (8, 9, "the same verdicts, from the runs"),
]  # fmt: skip
W, H = 5.0, 0.8


def draw() -> bytes:
    """The diagram as SVG text (no date in it: the same drawing gives the same bytes)."""
    fig = Figure(figsize=(9.5, 5.6))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-0.2, 11.4)
    ax.set_ylim(0.85, 7.95)
    ax.axis("off")
    for x, y, text, fill in BOXES:
        ax.add_patch(FancyBboxPatch((x, y), W, H, boxstyle="round,pad=0.05", fc=fill, ec="0.3"))
        head, rest = text.split("\n")
        ax.text(x + W / 2, y + 0.55, head, ha="center", va="center", fontsize=9, weight="bold")
        ax.text(x + W / 2, y + 0.25, rest, ha="center", va="center", fontsize=7.5)
    for a, b, label in ARROWS:
        (xa, ya), (xb, yb) = _anchor(a, b), _anchor(b, a)
        ax.add_patch(
            FancyArrowPatch((xa, ya), (xb, yb), arrowstyle="-|>", mutation_scale=12, color="0.25",
                            connectionstyle="arc3,rad=0.0" if xa == xb or ya == yb else "arc3,rad=0.15")
        )  # fmt: skip
        if label:
            ax.text((xa + xb) / 2 + 0.08, (ya + yb) / 2, label, fontsize=7, color="0.2",
                    ha="left" if xa == xb else "center", va="center",
                    bbox={"fc": "white", "ec": "none", "pad": 0.5})  # fmt: skip
    out = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: searchable, small
        fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue().encode()


def _anchor(a: int, b: int) -> tuple[float, float]:
    """Where an arrow between boxes a and b leaves a: its side facing b."""
    xa, ya, _, _ = BOXES[a]
    xb, yb, _, _ = BOXES[b]
    if xa == xb:
        return xa + W / 2, ya + (0 if yb < ya else H)
    return xa + (W if xb > xa else 0), ya + H / 2


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(draw())
    print(f"wrote {OUT}")
