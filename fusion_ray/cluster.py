"""Kept for commands and scripts written before the launch package: ``python -m fusion_ray.cluster
TARGET ...`` is ``fusion-ray cluster TARGET ...`` (``fusion_ray.launch``), and the names below are
the ``ray up`` files' (``fusion_ray.launch.rayup``). New code imports from ``fusion_ray.launch``."""

import sys

from fusion_ray.launch import main
from fusion_ray.launch.rayup import EXAMPLE_LAB, Lab, Ports, render_aws, render_onprem

__all__ = ["EXAMPLE_LAB", "Lab", "Ports", "main", "render_aws", "render_onprem"]

if __name__ == "__main__":
    sys.exit(main())
