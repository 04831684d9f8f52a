"""A run's artifacts read through the tracking URI the runs were logged to (a server's
``mlflow-artifacts:``, S3 or a local store alike; a local one read in place), a missing file told
apart from an unreadable one, and what the sweep's parent run holds: its cells
(``sweep_cells.json``) and an adaptive sweep's logged verdicts (``decisions.csv``).
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pandas as pd

from analysis.load.frame import AnalysisError
from fusion_ray.redact import redact
from fusion_ray.schema import CELLS_ARTIFACT, DECISIONS_FILE


def local_artifact_path(artifact_uri: str) -> Path | None:
    """The folder of a local artifact store's URI (a path or ``file://``), else None."""
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and artifact_uri[1:3] == ":\\"):
        return Path(artifact_uri)
    return None


def read_run_parquet(
    artifact_uri: str,
    name: str,
    columns: Sequence[str],
    *,
    run_id: str | None = None,
    client: Any = None,
) -> pd.DataFrame | None:
    """The parquet artifact ``name`` of a run (``columns`` only), or None when the run has none.
    A local artifact store is read in place; any other (an MLflow server's
    ``mlflow-artifacts:``, S3, ...) is listed and downloaded through ``client``, an
    ``MlflowClient`` of the runs' tracking URI. An unreadable file, or a store that does not
    answer, raises: it is not a missing artifact."""
    import pyarrow.parquet as pq

    local = local_artifact_path(artifact_uri)
    if local is not None:
        path = local / name
        return pq.read_table(path, columns=list(columns)).to_pandas() if path.exists() else None
    if client is None or run_id is None:
        raise ValueError(
            "a remote artifact store needs the run id and a client of its tracking URI"
        )
    if name not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, name, tmp)
        return pq.read_table(path, columns=list(columns)).to_pandas()


@dataclass
class RunArtifacts:
    """One parquet artifact of each of a set of runs, as ``read_run_artifacts`` found it."""

    frames: dict[str, pd.DataFrame]
    """Run id -> the artifact, for the runs that have a readable one."""
    broken: dict[str, Exception]
    """Run id -> why its artifact could not be read."""
    missing: list[str]
    """Run ids without the artifact, sorted."""

    @property
    def runs(self) -> int:
        return len(self.frames) + len(self.broken) + len(self.missing)


def read_run_artifacts(
    runs: pd.DataFrame,
    name: str,
    columns: Sequence[str],
    max_workers: int = 8,
    tracking_uri: str | None = None,
) -> RunArtifacts:
    """The parquet artifact ``name`` (``columns`` only) of each run of ``runs`` (columns
    ``run_id`` and ``artifact_uri``), read once per run in a thread pool (the work is I/O),
    through the runs' ``tracking_uri`` where the store is not local. A run whose file cannot
    be read is reported in ``broken``, apart from the runs that have no such file."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)

    def read(run_id: str) -> pd.DataFrame | None | Exception:
        try:
            return read_run_parquet(uris[run_id], name, columns, run_id=run_id, client=client)
        except Exception as err:  # noqa: BLE001 - reported per run, the caller decides
            return err

    uris = dict(zip(runs["run_id"], runs["artifact_uri"], strict=True))
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        found = dict(zip(uris, pool.map(read, list(uris)), strict=True))
    return RunArtifacts(
        frames={r: f for r, f in found.items() if isinstance(f, pd.DataFrame)},
        broken={r: f for r, f in found.items() if isinstance(f, Exception)},
        missing=sorted(r for r, f in found.items() if f is None),
    )


def unreadable_artifacts(
    found: RunArtifacts, name: str, what: str, tracking_uri: str | None
) -> AnalysisError:
    """The error for artifacts that exist but could not be read: the run, the cause, the fix."""
    run_id, err = next(iter(found.broken.items()))
    return AnalysisError(
        f"{what}: {name} of {len(found.broken)} of {found.runs} runs could not be read (run "
        f"{run_id}: {redact(f'{type(err).__name__}: {err}')}). Check that the tracking store "
        f"{redact(tracking_uri or 'the default store')} and its artifact store answer and that "
        "the files are intact, then build the report again, or leave the analysis out "
        "(--no-lengths)."
    )


def _parent_artifact_text(client: Any, parent: Any, name: str) -> str | None:
    """The text of artifact ``name`` of the sweep's parent run ``parent`` (an MLflow ``Run``),
    or None when it has none. A local artifact store is read in place; any other is listed once
    and the file downloaded once, through ``client``."""
    run_id, artifact_uri = parent.info.run_id, parent.info.artifact_uri
    local = local_artifact_path(artifact_uri) if artifact_uri else None
    if local is not None:
        path = local / name
        return path.read_text(encoding="utf-8") if path.is_file() else None
    if not any(a.path == name for a in client.list_artifacts(run_id)):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        return Path(client.download_artifacts(run_id, name, tmp)).read_text(encoding="utf-8")


def read_sweep_cells(client: Any, parent: Any) -> list[str] | None:
    """The cell ids in ``sweep_cells.json`` of the sweep's parent run ``parent`` (an MLflow
    ``Run``), or None when it has no such artifact (an older sweep, or another tool's runs)."""
    text = _parent_artifact_text(client, parent, CELLS_ARTIFACT)
    return None if text is None else parse_sweep_cells(text, parent.info.run_id)


def read_logged_decisions(client: Any, parent: Any) -> pd.DataFrame | None:
    """The verdicts of an adaptive sweep as its driver last logged them: ``decisions.csv`` of
    the parent run ``parent``, one row per hypothesis in the family's order; None when it has
    none (a sweep of fixed seeds, an older sweep, another tool's runs)."""
    text = _parent_artifact_text(client, parent, DECISIONS_FILE)
    return None if text is None else pd.read_csv(io.StringIO(text))


def parse_sweep_cells(text: str, run_id: str) -> list[str]:
    """The ``cells`` list of a ``sweep_cells.json`` text; AnalysisError when it is not one."""
    try:
        payload = json.loads(text)
        cells = payload["cells"] if isinstance(payload, dict) else None
    except (ValueError, KeyError) as err:
        cells, problem = None, f"{type(err).__name__}: {err}"
    else:
        problem = "no list of cell-id strings under 'cells'"
    if isinstance(cells, list) and all(isinstance(c, str) for c in cells):
        return cells
    raise AnalysisError(
        f"artifact {CELLS_ARTIFACT} of the sweep's parent run {run_id} is unreadable "
        f'({problem}); it should be {{"sweep": NAME, "cells": [CELL_ID, ...], "written": '
        "TIME}. Running the sweep again rewrites it; deleting it makes the analysis use every "
        "trial run of the experiment."
    )


def split_sweep_cells(
    trials: pd.DataFrame, cells: Sequence[str] | None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the trial runs whose ``cell_id`` is in ``cells``, the others); every run is the
    sweep's when ``cells`` is None."""
    if cells is None:
        return trials, trials.iloc[:0]
    mine = trials["cell_id"].isin(set(cells))
    return trials[mine].reset_index(drop=True), trials[~mine].reset_index(drop=True)
