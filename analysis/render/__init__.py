"""Rendering, below every report section: ``escape`` (run data as Markdown, HTML and LaTeX text),
``tables`` (Tables 1-3 and the other DataFrame tables, written as Markdown, LaTeX and CSV) and
``drawing`` (how each kind of figure is drawn with matplotlib). Knows the statistics' column
names (``analysis.stats``), nothing of the report's sections."""
