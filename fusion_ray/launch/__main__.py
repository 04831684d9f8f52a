"""``python -m fusion_ray.launch TARGET ...``: the same as ``fusion-ray cluster TARGET ...``."""

import sys

from fusion_ray.launch import main

sys.exit(main())
