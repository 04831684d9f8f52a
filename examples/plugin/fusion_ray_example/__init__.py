"""An example fusion-ray plug-in: a gated fusion operator and a data source.

Nothing here is imported by fusion-ray itself: the entry points in pyproject.toml make the
registries load these classes by name, in the driver and in every Ray worker.
"""
