"""An example fusion-ray plug-in: a gated fusion operator, a data source, a decision rule and a
launch target.

Nothing here is imported by fusion-ray itself: the entry points in pyproject.toml make the
registries load these classes by name, in the driver and in every Ray worker.
"""
