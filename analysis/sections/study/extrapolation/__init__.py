"""Train short, test long: the operator effect at evaluation lengths beyond the training length.

A sweep with ``data.eval_lengths`` evaluates each run's best model (the epoch chosen on
validation at the training length, param ``data.max_length``) on the test split truncated at
every evaluation length L, and logs per L the final metrics ``test_acc_at_<L>``,
``test_correct_at_<L>`` and ``test_total_at_<L>`` (columns of the tidy frame, ``analysis.load``)
and the artifact ``test_predictions_by_length.parquet`` (a row per test document and L). From
them, for the runs of a Pairing:

- curves: accuracy against L per operator and setting, mean and sd over seeds (``accuracy``);
- the operator effect at each L: integer paired deltas against the baseline with the main
  comparisons' statistics (``analysis.stats.describe_deltas``), Holm over every (comparison, L)
  test, a family apart from the main one (``stats``);
- does the effect change with L: per seed, the least-squares slope of the delta (pp) against
  log2(L); exact two-sided Wilcoxon signed-rank test over seeds, Holm over the comparisons
  (``slopes``);
- the truncation ladder: for consecutive lengths L1 < L2, accuracy at L2 minus accuracy at L1 on
  the same documents, per run, from the predictions (each run's file read once, in place for a
  local artifact store); its mean per operator, and the paired delta of that gain against the
  baseline (``ladder``, its own Holm family). Documents longer than L2 are cut at both lengths,
  so their gain comes from seeing more of each document; documents that fit in L2 (longer than
  L1, at most L2 tokens) are read whole at L2.

``EXTRAPOLATION`` is the report's section of this analysis (``analysis.sections.base``): its tables,
markdown, figure, CSV files and stats.json block.

The package: ``compute`` (the numbers, pure of any output), ``present`` (the tables, the
stats.json record, the markdown and the figure, from those numbers) and ``section`` (the
report section that joins them).
"""

from analysis.sections.study.extrapolation.compute import (
    COUNT_COLUMNS,
    CSV_FILES,
    FIT,
    LADDER_FAMILY,
    LADDER_RUN_COLUMNS,
    LONGER,
    SCORE_DECIMALS,
    SLOPE_FAMILY,
    STATS_FAMILY,
    TRAIN_LENGTH_PARAM,
    Extrapolation,
    accuracy_curves,
    analyse_extrapolation,
    docs_key,
    finish_slopes,
    ladder_comparisons,
    ladder_counts,
    length_comparisons,
    length_counts,
    logged_lengths,
    paired_counts,
    read_all,
    run_ladder,
    seed_scores,
    slope_tests,
    slope_weights,
    train_lengths,
)
from analysis.sections.study.extrapolation.present import (
    LADDER_TEXT,
    extrapolation_figure,
    extrapolation_markdown,
    extrapolation_record,
    extrapolation_tables,
    fire_input_ceiling,
    fire_note,
    ladder_table,
    length_table,
    slope_table,
    written_files,
)
from analysis.sections.study.extrapolation.section import (
    EXTRAPOLATION,
    ExtrapolationSection,
)

__all__ = [
    "COUNT_COLUMNS",
    "CSV_FILES",
    "EXTRAPOLATION",
    "Extrapolation",
    "ExtrapolationSection",
    "FIT",
    "LADDER_FAMILY",
    "LADDER_RUN_COLUMNS",
    "LADDER_TEXT",
    "LONGER",
    "SCORE_DECIMALS",
    "SLOPE_FAMILY",
    "STATS_FAMILY",
    "TRAIN_LENGTH_PARAM",
    "accuracy_curves",
    "analyse_extrapolation",
    "docs_key",
    "extrapolation_figure",
    "extrapolation_markdown",
    "extrapolation_record",
    "extrapolation_tables",
    "finish_slopes",
    "fire_input_ceiling",
    "fire_note",
    "ladder_comparisons",
    "ladder_counts",
    "ladder_table",
    "length_comparisons",
    "length_counts",
    "length_table",
    "logged_lengths",
    "paired_counts",
    "read_all",
    "run_ladder",
    "seed_scores",
    "slope_table",
    "slope_tests",
    "slope_weights",
    "train_lengths",
    "written_files",
]
