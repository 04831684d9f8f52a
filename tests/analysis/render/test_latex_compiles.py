"""Every ``.tex`` the report writes compiles with pdflatex (TeX Live's, with booktabs, the one
package the tables ask for), whatever text the tracking store holds: a table of hostile cells
(control characters, line breaks, Unicode beyond Latin, LaTeX's special characters, code
spans, marks after numbers), the tables of a report on hostile names, those of an adaptive
sweep's report (its anytime marks and their caption) and a trainable's report's. Skipped,
saying so, where pdflatex is not installed (``.ci/run`` installs Debian's texlive-latex-base
and texlive-latex-recommended).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from analysis.render.tables import Table
from tests.analysis.report.test_report_escaping import report  # noqa: F401 (a module fixture)
from tests.test_one_verdict import sweep  # noqa: F401 (a module fixture)

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(shutil.which("pdflatex") is None, reason="needs pdflatex (TeX Live)"),
]

HOSTILE = [
    "a\x00b\x01c\x1b[31m",  # NUL and the sentinels the old escaping used, an ANSI escape
    "line\nbreak\r\nand\u2028more",
    "名前 😀 \u202egnp.exe ünï",
    "\\textbf{x} \\\\ \\end{table}",
    "50% & #1 $x$ ^_~ {unbalanced",
    "} closing first {",
    "<script>|pipe</script>",
    "`code with \\ and {` and ``two ` ticks``",
    "66.00 ± 1.63*",
    "85.14 ± 2.39↑ (n=11)",
    "≈ Δ − – — … ≤ ≥ × α θ",
]


def _compile(folder: Path, tex_files: list[Path]) -> subprocess.CompletedProcess:
    body = "\n".join(f"\\input{{{path.resolve()}}}\n\\clearpage" for path in tex_files)
    doc = folder / "all_tables.tex"
    doc.write_text(
        "\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
        f"{body}\n\\end{{document}}\n",
        encoding="utf-8",
    )
    return subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", doc.name],
        cwd=folder, capture_output=True, text=True, errors="replace", timeout=300,
    )  # fmt: skip


def _assert_compiles(folder: Path, tex_files: list[Path]) -> None:
    assert tex_files, "no .tex file to compile"
    done = _compile(folder, tex_files)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (folder / "all_tables.pdf").stat().st_size > 0


def test_a_table_of_hostile_cells_compiles(tmp_path):
    frame = pd.DataFrame({"name": HOSTILE, "value": list(range(len(HOSTILE)))})
    hostile_header = pd.DataFrame({"a_b & {c}": ["x"], "α≈β\n": ["y"]})
    tables = [
        Table("hostile", "Caption with ≈, Δ, ↑ / ↓, 100% & a `code_span` {", frame, frame,
              footnotes=HOSTILE),
        Table("header", "Headers", hostile_header, hostile_header, footnotes=[]),
    ]  # fmt: skip
    paths = [tmp_path / f"{t.name}.tex" for t in tables]
    for table, path in zip(tables, paths, strict=True):
        path.write_text(table.to_latex(), encoding="utf-8")
    _assert_compiles(tmp_path, paths)


def test_every_table_of_a_report_on_hostile_names_compiles(report, tmp_path):  # noqa: F811
    _assert_compiles(tmp_path, sorted((report.out_dir / "tables").glob("*.tex")))


def test_every_table_of_an_adaptive_sweeps_report_compiles(sweep, tmp_path):  # noqa: F811
    tex = sorted((sweep.out / "tables").glob("*.tex"))
    text = "\n".join(path.read_text(encoding="utf-8") for path in tex)
    assert "$^{\\uparrow}$" in text and "↑" not in text and "≈" not in text
    _assert_compiles(tmp_path, tex)


def test_a_trainables_tables_compile_with_hostile_comparison_names(tmp_path):
    """A trainable's grid levels are its own text (``label_smoothing=50% & #1``): its report's
    paired statistics and decisions tables (``analysis.report.trainable``) compile whatever they
    hold, with the values a real sweep leaves missing (an open hypothesis's interval, a
    comparison of one seed)."""
    from analysis.report.trainable import decisions_table, paired_table

    n = len(HOSTILE)
    paired = pd.DataFrame(
        {
            "comparison": [f"{name} vs base" for name in HOSTILE],
            "n_seeds": [1 + i % 4 for i in range(n)],
            "failed_runs": [i % 2 for i in range(n)],
            "mean": [0.5 * i - 2 for i in range(n)],
            "sd": [float("nan") if i == 0 else 0.3 * i for i in range(n)],
            "hodges_lehmann": [0.4 * i - 2 for i in range(n)],
            "hl_low": [0.4 * i - 3 for i in range(n)],
            "hl_high": [0.4 * i - 1 for i in range(n)],
            "sign_consistency": [float("nan") if i == 0 else i / n for i in range(n)],
            "wilcoxon_p": [float("nan") if i == 0 else 0.5 / (i + 1) for i in range(n)],
            "p_holm": [float("nan") if i == 0 else min(1.0, 5.0 / (i + 1)) for i in range(n)],
        }
    )
    states = ["decided", "open", "futile"]
    decisions = pd.DataFrame(
        {
            "comparison": [f"{name}: a vs b" for name in HOSTILE],
            "verdict": [["better", "open", "futile"][i % 3] for i in range(n)],
            "state": [states[i % 3] for i in range(n)],
            "seeds_used": [4 + i for i in range(n)],
            "mean": [0.7 * i - 3 for i in range(n)],
            "ci_low": [0.7 * i - 4 for i in range(n)],
            "ci_high": [0.7 * i - 2 for i in range(n)],
            "p_family": [1.0 / (i + 2) for i in range(n)],
        }
    )
    tables = [paired_table(paired, adaptive=True), paired_table(paired, False)]
    tables.append(decisions_table(decisions))
    paths = [tmp_path / f"{t.name}-{i}.tex" for i, t in enumerate(tables)]
    for table, path in zip(tables, paths, strict=True):
        path.write_text(table.to_latex(), encoding="utf-8")
    _assert_compiles(tmp_path, paths)
