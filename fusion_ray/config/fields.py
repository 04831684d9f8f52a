"""The sweep files' shared text fields, each checked where it is read: a sweep's name, its
description, a storage path, a tracking URI (the stores fusion-ray supports, credentials
refused in the file) and a Ray address. The study's sweep file (``config.spec``), a
trainable's (``config.trainable``) and the HPO file use them."""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field

from fusion_ray.checks import address_problem
from fusion_ray.redact import credentials_problem


def _text_problem(value: str) -> str | None:
    """Why ``value`` cannot be a path or URI: empty, or with characters no path or URI means (a
    NUL, a newline, an invisible one such as a right-to-left override)."""
    if not value.strip():
        return "must not be empty"
    hidden = next((c for c in value if unicodedata.category(c) in ("Cc", "Cf")), None)
    if hidden is not None:
        return f"must not contain control or invisible characters (found U+{ord(hidden):04X})"
    return None


def _a_path(value: str) -> str:
    problem = _text_problem(value)
    if problem:
        raise ValueError(f"{problem}; give a folder, or a URI such as s3://bucket/prefix")
    scheme, sep, rest = value.partition("://")
    if sep and scheme.lower() != "file" and not rest.split("/", 1)[0].split("?", 1)[0]:
        raise ValueError(
            f"{scheme}:// names no bucket; write {scheme}://BUCKET/PREFIX (or a local folder)"
        )
    return value


def _a_description(value: str) -> str:
    hidden = next(
        (c for c in value if unicodedata.category(c) in ("Cc", "Cf") and c not in "\n\t"), None
    )
    if hidden is not None:
        raise ValueError(
            f"must not contain control or invisible characters but line breaks and tabs "
            f"(found U+{ord(hidden):04X})"
        )
    return value


def _an_address(value: str | None) -> str | None:
    problem = address_problem(value) if value is not None else None
    if problem:
        raise ValueError(problem)
    return value


TRACKING_STORES = "sqlite:///PATH (a local file) or http(s)://HOST:PORT (an MLflow server)"
"""What ``tracking_uri`` may be, in messages (a database URI such as postgresql://... too)."""
_DATABASES = ("postgresql", "mysql", "mssql")


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` names no MLflow store a sweep can use, or None. Supported: ``sqlite:///PATH``
    (PATH a file, relative to the working directory; ``sqlite:////abs/path`` for an absolute
    one), ``http(s)://HOST[:PORT]`` (a tracking server) and the database URIs MLflow's
    SQLAlchemy store takes (``postgresql://``, ``mysql://``, ``mssql://``, each with an optional
    ``+driver``). Not ``file://`` or a bare folder: MLflow 3 keeps its file store only in
    maintenance mode, and refuses it unless told otherwise."""
    problem = _text_problem(uri)
    if problem:
        return f"{problem}; use {TRACKING_STORES}"
    problem = credentials_problem(uri, "the URI")
    if problem:
        return problem
    found = re.match(r"([A-Za-z][A-Za-z0-9+.-]+):", uri)  # one letter: a Windows drive
    scheme = found.group(1).lower() if found else ""
    if scheme in ("", "file"):
        return (
            "MLflow's file store (file:// or a bare folder) is not supported: MLflow 3 keeps it "
            f"only in maintenance mode; use {TRACKING_STORES}"
        )
    if scheme == "sqlite":
        path = uri[len("sqlite:///") :] if uri.lower().startswith("sqlite:///") else ""
        if not path or path.endswith("/") or path == ":memory:":
            return (
                "a sqlite store needs a database file after the three slashes: "
                "sqlite:///mlflow.db (relative to the working directory) or "
                "sqlite:////abs/path/mlflow.db"
            )
        return None
    if scheme in ("http", "https"):
        try:
            host = urlsplit(uri).hostname
        except ValueError:
            host = None
        return None if host else f"names no server; use {TRACKING_STORES}"
    if scheme.partition("+")[0] in _DATABASES:
        return None
    return f"{scheme}: is not an MLflow store fusion-ray supports; use {TRACKING_STORES}"


def _a_tracking_uri(uri: str) -> str:
    problem = tracking_uri_problem(uri)
    if problem:
        raise ValueError(problem)
    return uri


SweepName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)]
"""A sweep's name: letters, digits, ``_``, ``.``, ``-``, from a letter or digit (it names folders)."""
Description = Annotated[str, AfterValidator(_a_description), Field(max_length=10_000)]
StoragePath = Annotated[str, AfterValidator(_a_path)]
TrackingUri = Annotated[str, AfterValidator(_a_tracking_uri)]
Address = Annotated[str | None, AfterValidator(_an_address)]
