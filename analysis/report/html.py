"""report.html, the report as one self-contained page, and the experiment's description.

``render_html`` turns report.md's Markdown (``analysis.report.markdown``, the same text) into one HTML
page that needs nothing else: every figure of the report's folder is embedded as a base64
``data:`` URI, the tables are styled by a ``<style>`` element, and the page has no script and
fetches nothing (no CDN, no remote font; a Content-Security-Policy ``<meta>`` forbids any fetch
but the embedded images, should anything try). It reads the same opened from disk or in the
MLflow UI, whose artifact viewer shows an ``.html`` artifact in a frame but cannot resolve
report.md's relative image links.

Every value from the runs is escaped in the Markdown already (``analysis.render.escape``). The
renderer adds its own guard, so that no text from a run can become markup: it takes no raw
HTML (a tag in the text shows as text), makes no autolinks, keeps only the attributes it
writes itself, embeds an image only when it is a PNG, JPEG or GIF file inside the report's
folder (any other image shows as its caption), and keeps a link only when it points at a
heading of the page or at a file of the folder (a link elsewhere keeps its text, not its
target).

``describe_experiment`` sets the MLflow experiment's description (tag ``mlflow.note.content``,
Markdown, which the UI shows at the top of the experiment): the sweep's name and description
(the description of the sweep's parent run), its trial runs, and where the report is. A
description someone wrote by hand is kept.
"""

from __future__ import annotations

import base64
import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

import markdown
from markdown.extensions.toc import TocExtension
from markdown.treeprocessors import Treeprocessor

from analysis.load import Experiment
from analysis.render.escape import md, md_code, md_prose

__all__ = [
    "HTML_FILE",
    "NOTE_MARK",
    "NOTE_TAG",
    "describe_experiment",
    "experiment_note",
    "render_html",
    "write_html",
]

HTML_FILE = "report.html"
"""The page, beside report.md in the report's folder (and under ``analysis/`` of the parent run)."""
NOTE_TAG = "mlflow.note.content"
"""MLflow's description of an experiment or a run (a tag; the UI shows it as Markdown)."""
NOTE_MARK = "Written by `python -m analysis.report`"
"""The last line of the description the report writes: a description without it was written
by someone else and is kept."""

#: Image files embedded as data: URIs, by suffix (no SVG: it can carry script).
_IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
}
#: The attributes the page keeps, per element (every other attribute is dropped).
_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "th": {"style", "align"},
    "td": {"style", "align"},
    **{f"h{n}": {"id"} for n in range(1, 7)},
}
#: The only style attribute Markdown tables write: a column's alignment.
_ALIGN_STYLE = re.compile(r"text-align: (left|right|center);")
#: Nothing is fetched but the embedded images; no script, no form, no base URL.
_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
    "form-action 'none'"
)
_CSS = """
:root { color-scheme: light; }
body { margin: 0; background: #eef1f5; color: #1d232b;
  font: 15px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
  sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 36px 56px; background: #fff;
  box-shadow: 0 0 0 1px #dde2e8; }
h1 { font-size: 1.75em; margin: 0 0 .6em; padding-bottom: .3em; border-bottom: 3px solid #2f6db5; }
h2 { font-size: 1.3em; margin: 2em 0 .6em; padding-bottom: .2em; border-bottom: 1px solid #d5dbe2; }
p, li { max-width: 62em; }
code { font: .88em/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono",
  monospace; background: #eef1f4; padding: .1em .3em; border-radius: 3px; }
table { display: block; max-width: 100%; overflow-x: auto; border-collapse: collapse;
  margin: .8em 0 1.2em; font-size: .88em; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d5dbe2; padding: .35em .65em; text-align: left; vertical-align: top; }
th { background: #e6ecf3; font-weight: 600; }
td:first-child { min-width: 12em; max-width: 26em; overflow-wrap: anywhere; }
tbody tr:nth-child(even) { background: #f6f8fa; }
tbody tr:hover { background: #e9f1fb; }
img { display: block; max-width: 100%; height: auto; margin: .4em 0 1.6em;
  border: 1px solid #e1e6eb; }
.toc { margin: 1.2em 0 1.6em; padding: .6em 1em; background: #f6f8fa;
  border: 1px solid #e1e6eb; border-radius: 4px; }
.toc ul { margin: 0; padding: 0; list-style: none; columns: 3 14em; column-gap: 2em; }
.toc a { color: #2f6db5; text-decoration: none; }
.toc a:hover { text-decoration: underline; }
.missing-figure { color: #8a4b00; font-style: italic; }
@media (max-width: 900px) { main { padding: 14px 12px 32px; } body { font-size: 14px; } }
@media print { body { background: #fff; } main { box-shadow: none; max-width: none; }
  table { display: table; } .toc { display: none; } }
"""


def _inside(folder: Path, link: str) -> Path | None:
    """The file or folder of ``folder`` that a relative ``link`` names, or None for a link with
    a scheme or a host, an absolute path, or one that leads out of the folder."""
    parts = urlsplit(link)
    path = unquote(parts.path)
    if parts.scheme or parts.netloc or not path or path.startswith("/") or "\\" in path:
        return None
    root = folder.resolve()
    target = (root / PurePosixPath(path)).resolve()
    if target != root and root not in target.parents:
        return None
    return target if target.exists() else None


def data_uri(path: Path) -> str:
    """The image file ``path`` as a base64 ``data:`` URI."""
    encoded = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"data:{_IMAGE_TYPES[path.suffix.lower()]};base64,{encoded}"


class _SelfContained(Treeprocessor):
    """Embeds the folder's images, keeps only links into the page or the folder, and drops
    every attribute the page does not write itself."""

    def __init__(self, md: markdown.Markdown, folder: Path) -> None:
        super().__init__(md)
        self.folder = folder

    def run(self, root: ET.Element) -> None:
        for el in root.iter():
            for name in list(el.attrib):
                value = el.attrib[name]
                if name not in _ATTRIBUTES.get(el.tag, ()) or (
                    name == "style" and not _ALIGN_STYLE.fullmatch(value)
                ):
                    del el.attrib[name]
            if el.tag == "img":
                self._embed(el)
            elif el.tag == "a":
                href = el.attrib.get("href", "")
                if not (re.fullmatch(r"#[\w-]+", href) or _inside(self.folder, href)):
                    el.attrib.pop("href", None)

    def _embed(self, img: ET.Element) -> None:
        target = _inside(self.folder, img.attrib.get("src", ""))
        if target is not None and target.is_file() and target.suffix.lower() in _IMAGE_TYPES:
            img.attrib["src"] = data_uri(target)
            return
        caption = img.attrib.get("alt", "")
        img.tag, img.text = "span", f"(figure not in the report's folder: {caption})"
        img.attrib.clear()
        img.attrib["class"] = "missing-figure"


def _converter(folder: Path) -> markdown.Markdown:
    """A Markdown converter with tables and a contents list of the ``##`` headings, that takes
    no raw HTML and makes no autolinks."""
    converter = markdown.Markdown(
        extensions=["tables", TocExtension(toc_depth="2-2", marker="")], output_format="html"
    )
    converter.preprocessors.deregister("html_block")
    for pattern in ("html", "autolink", "automail"):
        converter.inlinePatterns.deregister(pattern)
    # analysis.render.escape backslash-escapes these too (CommonMark does; Python-Markdown by default not)
    converter.ESCAPED_CHARS = [*converter.ESCAPED_CHARS, "~", "=", "|"]
    converter.treeprocessors.register(_SelfContained(converter, folder), "self_contained", -10)
    return converter


def render_html(markdown_text: str, folder: Path, title: str) -> str:
    """The page of ``markdown_text`` (report.md's text), its images read from ``folder`` (the
    report's folder) and embedded; ``title`` is plain text (escaped here)."""
    converter = _converter(Path(folder))
    body = converter.convert(markdown_text)
    toc: Any = getattr(converter, "toc", "")
    if toc and "<h2" in body:  # the contents after the header, before the first section
        body = body.replace("<h2", f'<nav aria-label="Contents">{toc}</nav>\n<h2', 1)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{_CSS}</style>",
            "</head>",
            "<body>",
            "<main>",
            body,
            "</main>",
            "</body>",
            "</html>",
            "",
        ]
    )


def write_html(markdown_text: str, folder: Path, title: str) -> Path:
    """Write ``report.html`` into ``folder`` (see ``render_html``); returns its path."""
    path = Path(folder) / HTML_FILE
    path.write_text(render_html(markdown_text, folder, title), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- the description


def experiment_note(experiment: Experiment, artifact_path: str, generated_at: str) -> str:
    """The experiment's description (Markdown, every value escaped): the sweep, its trial runs,
    and where its report is among the parent run's artifacts."""
    about = sweep_description(experiment.parent_tags.get(NOTE_TAG, ""))
    head = f"**Sweep {md_code(experiment.name)}**" + (f": {md_prose(about)}" if about else ".")
    runs = experiment.runs
    counts = ", ".join(f"{n} {md(status)}" for status, n in runs["status"].value_counts().items())
    where = f"{artifact_path}/{HTML_FILE}"
    return "\n".join(
        [
            head,
            "",
            f"{len(runs)} trial runs ({counts}).",
            "",
            f"Report: `{where}` (one page, figures included; also `{artifact_path}/report.md`) "
            f"among the artifacts of the sweep's parent run {md_code(experiment.parent_run_id)}.",
            "",
            f"{NOTE_MARK} at {md(generated_at)}.",
        ]
    )


REPORT_LINE = "Report: `"
"""How the parent run's description names the report, after the sweep's own description."""


def sweep_description(note: str) -> str:
    """The sweep file's ``description`` in a parent run's description (without the report line
    the report adds)."""
    return note.split(f"\n\n{REPORT_LINE}", 1)[0].strip() if note else ""


def describe_parent(client: Any, experiment: Experiment, artifact_path: str) -> None:
    """The sweep's parent run's description: the sweep file's ``description``, then where the
    report is among its artifacts (written again, not added twice, by each report)."""
    if not experiment.parent_run_id:
        return
    about = sweep_description(experiment.parent_tags.get(NOTE_TAG, ""))
    line = (
        f"{REPORT_LINE}{artifact_path}/{HTML_FILE}` (one page, figures included; also "
        f"`{artifact_path}/report.md`) among this run's artifacts."
    )
    # the description as the sweep file wrote it (the driver sets it so at each run)
    text = f"{about}\n\n{line}" if about else f"Sweep {md_code(experiment.name)}.\n\n{line}"
    client.set_tag(experiment.parent_run_id, NOTE_TAG, text)


def describe_experiment(
    client: Any, experiment: Experiment, artifact_path: str, generated_at: str
) -> bool:
    """Set the experiment's description to ``experiment_note`` unless someone wrote one by
    hand (a description without ``NOTE_MARK``); whether it was set. ``client``: an MLflow
    ``MlflowClient`` of the experiment's tracking store."""
    current = client.get_experiment(experiment.experiment_id).tags.get(NOTE_TAG, "")
    if current.strip() and NOTE_MARK not in current:
        return False
    note = experiment_note(experiment, artifact_path, generated_at)
    client.set_experiment_tag(experiment.experiment_id, NOTE_TAG, note)
    return True
