"""report.html: report.md as one self-contained page, logged to the sweep's parent run, and the
experiment's description that says where it is.

One small synthetic sweep on a real (sqlite) MLflow store, its names hostile: the experiment
``html <i>exp</i> `x```, an operator ``gate<script>alert`1`</script>``, a dataset holding an
``<img onerror>`` and the parent run's description a ``<script>``. The report is built and
logged with its figures, then report.html is read with ``html.parser``: every image is one of
report.md's figures as a data: URI (the same bytes as the PNG), nothing points anywhere but
the page itself or the report's folder, no script, no handler attribute, the hostile names
show as text. The renderer's own guard is checked on Markdown that report.md never holds (a
``javascript:`` link, images outside the folder or on the web).
"""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from analysis.load import Experiment
from analysis.report import ReportOptions, build_report
from analysis.report.html import (
    HTML_FILE,
    NOTE_MARK,
    NOTE_TAG,
    describe_experiment,
    render_html,
)
from tests.synthetic import SyntheticSweep, log_synthetic_sweep

pytestmark = pytest.mark.unit

EXPERIMENT = "html <i>exp</i> `x`"
SCRIPT_OP = "gate<script>alert`1`</script>"
IMG_DATASET = "d<img src=x onerror=alert`2`>"
DESCRIPTION = "Two operators <script>alert`3`</script> on one dataset"
SEEDS = (0, 1, 2, 3)


class Page(HTMLParser):
    """Every start tag of a page with its attributes, its text, and its <style> text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.styles: list[str] = []
        self.in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        self.in_style = tag == "style"

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        self.in_style = False

    def handle_data(self, data: str) -> None:
        (self.styles if self.in_style else self.text).append(data)

    def named(self, tag: str) -> list[dict[str, str]]:
        """The attributes of every ``tag`` element, in page order."""
        return [attrs for t, attrs in self.tags if t == tag]


def _page(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


@pytest.fixture(scope="module")
def report(tmp_path_factory, mlflow_store):
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("report_html")
    uri = mlflow_store()  # on the RAM disk
    spec = SyntheticSweep(
        name=EXPERIMENT,
        datasets={IMG_DATASET: "long"},
        operators=("add", SCRIPT_OP),
        effects={SCRIPT_OP: 0.3},
        seeds=SEEDS,
        test_size=60,
        predictions=False,
    )
    ids = log_synthetic_sweep(spec, uri, artifact_location=str(root / "art"))
    client = MlflowClient(uri)
    client.set_tag(ids["parent_run_id"], NOTE_TAG, DESCRIPTION)  # the sweep's description
    result = build_report(EXPERIMENT, uri, ReportOptions(out=root / "report"))
    html = (result.out_dir / HTML_FILE).read_text(encoding="utf-8")
    return {"result": result, "uri": uri, "ids": ids, "html": html, "page": _page(html)}


def test_every_figure_of_report_md_is_embedded_as_its_png(report):
    out = report["result"].out_dir
    referenced = re.findall(
        r"!\[[^\n]*\]\((figures/[^)\s]+\.png)\)", (out / "report.md").read_text()
    )
    assert len(referenced) >= 2
    images = report["page"].named("img")
    assert len(images) == len(referenced)
    prefix = "data:image/png;base64,"
    assert all(img["src"].startswith(prefix) for img in images)
    embedded = [base64.b64decode(img["src"][len(prefix) :]) for img in images]
    assert embedded == [(out / rel).read_bytes() for rel in referenced]


def test_nothing_is_fetched_and_nothing_runs(report):
    out, page = report["result"].out_dir, report["page"]
    assert page.named("script") == [] and page.named("iframe") == []
    assert page.named("link") == [] and page.named("base") == []
    for tag, attrs in page.tags:
        assert not [a for a in attrs if a.startswith("on")], (tag, attrs)
        assert "style" not in attrs or tag in ("th", "td"), (tag, attrs)
        for name in ("src", "href", "srcset", "action", "poster", "data"):
            value = attrs.get(name)
            if value is None:
                continue
            assert not re.match(r"\s*(https?:)?//", value), (tag, name, value)
            if name == "src":
                assert value.startswith("data:image/png;base64,"), (tag, value)
            else:  # a heading of the page or a file of the report's folder
                assert value.startswith("#") or (out / value).resolve().is_relative_to(out)
    css = "".join(page.styles)
    assert "url(" not in css and "@import" not in css and "http" not in css
    (csp,) = [m["content"] for m in page.named("meta") if m.get("http-equiv")]
    assert "default-src 'none'" in csp and "img-src data:" in csp
    hrefs = [a["href"] for a in page.named("a") if "href" in a]
    assert "#summary" in hrefs  # the contents list links the page's own headings


def test_hostile_names_show_as_text_never_as_tags(report):
    page, html = report["page"], report["html"]
    text = "".join(page.text)
    assert SCRIPT_OP in text and IMG_DATASET in text
    assert "<script" not in html and "&lt;script&gt;" in html
    assert page.named("i") == [] and all("onerror" not in attrs for _, attrs in page.tags)
    assert f"Fusion analysis: {EXPERIMENT}" in text  # the title and the heading


def test_report_html_is_logged_to_the_parent_run(report):
    from mlflow import MlflowClient

    result, parent = report["result"], report["ids"]["parent_run_id"]
    assert result.logged_to == parent and result.out_dir / HTML_FILE in result.files
    client = MlflowClient(report["uri"])
    paths = {a.path for a in client.list_artifacts(parent, "analysis")}
    assert f"analysis/{HTML_FILE}" in paths
    got = Path(
        client.download_artifacts(parent, f"analysis/{HTML_FILE}", str(result.out_dir.parent))
    )
    assert got.read_bytes() == (result.out_dir / HTML_FILE).read_bytes()


def test_the_experiment_description_names_the_sweep_and_the_report(report):
    from mlflow import MlflowClient

    client = MlflowClient(report["uri"])
    note = client.get_experiment(report["ids"]["experiment_id"]).tags[NOTE_TAG]
    parent = report["ids"]["parent_run_id"]
    runs = len(SEEDS) * 2
    assert f"`analysis/{HTML_FILE}`" in note and f"`{parent}`" in note
    assert f"{runs} trial runs ({runs} FINISHED)" in note
    # the parent run's description as prose: its code span kept, its tags escaped
    assert "Two operators &lt;script&gt;alert`3`&lt;/script&gt; on one dataset" in note
    assert "html &lt;i&gt;exp&lt;/i&gt; \\`x\\`" in note  # the sweep's name, escaped
    assert re.search(r"<\s*[A-Za-z/]", note) is None and note.rstrip().endswith(".")
    assert NOTE_MARK in note


def test_the_parent_runs_description_says_where_the_report_is_once(report):
    from mlflow import MlflowClient

    from analysis.load import load_experiment
    from analysis.report.html import describe_parent

    client = MlflowClient(report["uri"])
    parent = report["ids"]["parent_run_id"]
    note = client.get_run(parent).data.tags[NOTE_TAG]
    assert note.startswith("Two operators <script>alert`3`</script> on one dataset")
    assert note.endswith(f"Report: `analysis/{HTML_FILE}` (one page, figures included; also "
                         "`analysis/report.md`) among this run's artifacts.")  # fmt: skip
    exp = load_experiment(EXPERIMENT, report["uri"])
    describe_parent(client, exp, "analysis")  # a second report writes it again, not twice
    assert client.get_run(parent).data.tags[NOTE_TAG] == note


def test_a_description_written_by_hand_is_kept(report):
    from mlflow import MlflowClient

    client = MlflowClient(report["uri"])
    exp_id = client.create_experiment("by_hand")
    runs = pd.DataFrame({"status": ["FINISHED", "FAILED"]})
    exp = Experiment("by_hand", exp_id, report["uri"], runs, parent_run_id="abc")
    client.set_experiment_tag(exp_id, NOTE_TAG, "Our own words.")
    assert describe_experiment(client, exp, "analysis", "now") is False
    assert client.get_experiment(exp_id).tags[NOTE_TAG] == "Our own words."
    client.set_experiment_tag(exp_id, NOTE_TAG, f"An older report's note.\n\n{NOTE_MARK} then.")
    assert describe_experiment(client, exp, "analysis", "now") is True
    note = client.get_experiment(exp_id).tags[NOTE_TAG]
    assert "2 trial runs (1 FINISHED, 1 FAILED)" in note and "older" not in note


def test_the_renderer_keeps_only_links_into_the_page_or_its_folder(tmp_path):
    (tmp_path / "figures").mkdir()
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    (tmp_path / "figures" / "a.png").write_bytes(png)
    (tmp_path / "stats.csv").write_text("x\n1\n")
    (tmp_path.parent / "outside.png").write_bytes(png)
    text = "\n\n".join(
        [
            "# T",
            "[js](javascript:alert(1)) [web](https://example.org/x) [csv](stats.csv) "
            "[up](../outside.png) <http://example.org> <b onclick=x>raw</b>",
            "![ok](figures/a.png) ![web](http://example.org/a.png) ![up](../outside.png) "
            "![abs](/etc/passwd) ![svg](figures/none.svg)",
        ]
    )
    page = _page(render_html(text, tmp_path, "T <script>"))
    links = page.named("a")
    assert [a.get("href") for a in links] == [None, None, "stats.csv", None]
    (img,) = page.named("img")
    assert base64.b64decode(img["src"].split(",", 1)[1]) == png
    assert page.named("b") == [] and "<b onclick=x>raw</b>" in "".join(page.text)
    assert "T <script>" in "".join(page.text) and page.named("script") == []
    assert "".join(page.text).count("figure not in the report's folder") == 4
