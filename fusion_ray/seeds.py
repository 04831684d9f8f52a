"""One recipe for every seed derived from a trial's paired seed.

``derive_seed(seed, name)`` seeds each submodule's initialisation (``model/encoder``,
``model/fusion``, ...) and each rank's dropout stream (``train/rank0``, ...): the same (seed,
name) gives the same stream on every machine and in every process (sha256, not Python's salted
``hash``), and different names give independent streams.
"""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed for the stream ``name`` of the paired seed ``seed``."""
    digest = hashlib.sha256(f"fusion_ray:{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)
