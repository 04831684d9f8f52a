"""Kept for SLURM scripts already rendered: their node-wait step runs ``python -m fusion_ray.slurm
wait-for-nodes ...`` (``fusion_ray.launch.join``), and ``python -m fusion_ray.slurm
SWEEP ...`` is ``fusion-ray cluster slurm SWEEP ...``. New code imports from
``fusion_ray.launch.slurm``."""

import sys
from collections.abc import Sequence

from fusion_ray.launch import slurm
from fusion_ray.launch.join import wait_main


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["wait-for-nodes"]:
        return wait_main(args[1:], prog="python -m fusion_ray.slurm")
    return slurm.main(args)


if __name__ == "__main__":
    sys.exit(main())
