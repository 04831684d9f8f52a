"""fusion-ray: seed-paired sweeps of positional-encoding fusion operators on Ray.

``fusion_ray.__version__`` is the installed distribution's version (``fusion_ray.version``;
``pyproject.toml`` holds the one copy), read on first use: importing ``importlib.metadata``
costs tens of milliseconds, which every command would pay at start-up."""


def __getattr__(name: str) -> str:
    if name == "__version__":
        # lazy: importlib.metadata, tens of milliseconds at every command's start-up
        from fusion_ray.version import version

        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
