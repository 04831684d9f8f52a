"""Kept for commands written before the launch package: ``python -m fusion_ray.k8s SWEEP ...`` is
``fusion-ray cluster k8s SWEEP ...`` (``fusion_ray.launch.k8s``)."""

import sys

from fusion_ray.launch.k8s import main

if __name__ == "__main__":
    sys.exit(main())
