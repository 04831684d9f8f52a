"""``python -m fusion_ray.launch TARGET ...``: the same as ``fusion-ray cluster TARGET ...``."""

import sys

from fusion_ray.launch import main

if __name__ == "__main__":
    sys.exit(main())
