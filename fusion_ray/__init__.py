"""fusion-ray: seed-paired sweeps of positional-encoding fusion operators on Ray."""

__version__ = "0.1.0"
