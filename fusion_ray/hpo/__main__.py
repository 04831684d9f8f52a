"""``python -m fusion_ray.hpo HPO.yaml``."""

import sys

from fusion_ray.hpo.cli import main

if __name__ == "__main__":
    sys.exit(main())
