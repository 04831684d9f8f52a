"""The MLflow schema: the contract between fusion_ray, which writes runs, and ``analysis``, which
reads them (docs/reference/mlflow-schema.md).

One module, shared by both sides. It holds the tag, metric, param and artifact names, plus
``axis_text``, the one spelling of a grid-axis value as tag text; it imports nothing beyond the
standard library. It lives in fusion_ray, the writer that defines the contract, and
``analysis`` imports its names from here: ``fusion_ray/__init__.py`` imports nothing, so
``import fusion_ray.schema`` loads no torch, Ray or pydantic, and ``analysis`` still needs
nothing else of fusion_ray (``tests/test_architecture.py`` checks both). Runs logged by any
other code that follows these names are analysed the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

#: Tag that tells a sweep's parent run from its trial runs.
ROLE_TAG = "role"
ROLE_TRIAL = "trial"
ROLE_SWEEP = "sweep"
#: MLflow's own tag linking a trial run to the sweep's parent run.
PARENT_TAG = "mlflow.parentRunId"

#: Tags every trial run carries.
TRIAL_TAGS = (
    "cell_id",
    "dataset",
    "position",
    "attention_position",
    "fusion",
    "seed",
    "sweep",
    "git_sha",
)
#: Where a trial's latest checkpoint lives (a path or URI), so a later invocation resumes it.
CHECKPOINT_TAG = "checkpoint_path"
LEASE_TOKEN_TAG = "lease_token"
OVERRIDES_TAG = "overrides"
"""Parent-run tag: the command line's ``key=value`` overrides of the sweep or HPO file (JSON list)."""
CPU_REHEARSAL_TAG = "smoke_gpu_trials_on_cpu"
"""Parent-run tag ("true") of a --smoke run, sweep or HPO, that trained a GPU file's trials on
CPUs because its Ray had no GPUs."""
"""Trial-run tag: the lease token of the driver that marked the run FINISHED."""
#: Experiment tag MLflow 3's UI reads to choose its view: "custom_model_development" opens an
#: experiment on its runs (training), not on the LLM-tracing dashboard it shows without one.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
#: Why a FAILED trial run failed (the end of its traceback).
FAILURE_TAG = "failure_reason"
#: Trial-run tag of a FAILED run: "trial" (its code raised: the failure counts against its arm
#: in every decision) or "infrastructure" (its process or node was lost, after Tune's retries:
#: not scored; an adaptive sweep runs the cell again on its next invocation).
FAILURE_KIND_TAG = "failure_kind"
#: Trial-run tag of a cell whose trial could not load its checkpoint (a truncated or damaged
#: file, or a state of another model) and started again from scratch: ``<checkpoint>: <reason>;
#: set aside as <checkpoint>.unreadable`` (a URI: ``; left in place``). Its epoch metrics logged
#: before that are of the attempt set aside; the later ones, from epoch 0 again, of the new one.
CHECKPOINT_SET_ASIDE_TAG = "checkpoint_set_aside"

#: A trainable's trial run (``trainable: NAME``): the names of the final metrics its trainable
#: returned, a JSON list in the order returned (the first is the decision metric when the sweep
#: names none); its intermediate reports are logged under their own names, step = ``step``.
RETURNED_TAG = "metrics_returned"
STEP_METRIC = "step"
#: A trainable's trial run: the trainable's registered name.
TRAINABLE_RUN_TAG = "trainable"


def returned_metrics(tags: dict[str, str]) -> list[str]:
    """``RETURNED_TAG`` of a run's tags as a list (empty: none, or not a trainable's run)."""
    try:
        names = json.loads(tags.get(RETURNED_TAG, "[]"))
    except ValueError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def decided_metric(named: str | None, returned: Sequence[str]) -> str | None:
    """The metric a trainable's sweep decides on: the one its file names (``metric: {name}``),
    else the first its trainable returned (None: it named none and returned none)."""
    return named or next(iter(returned), None)


#: Metrics logged once per epoch (step = epoch); search_runs returns their last value.
EPOCH_METRICS = ("train_loss", "val_loss", "val_acc", "epoch_seconds")
#: Metrics logged once, when the trial ends (test metrics at the best validation epoch).
#: Final metrics of every trial for the length question inside its dataset: correct and total
#: documents in the shortest and in the longest length quarter of its test split (lengths
#: before truncation; ``fusion_ray.decide.questions.bucket_edges``). Runs logged before trials
#: reported them have none, and their sweeps decide no ``length_within`` hypothesis.
LENGTH_QUARTER_METRICS = (
    "test_correct_shortest",
    "test_total_shortest",
    "test_correct_longest",
    "test_total_longest",
)
FINAL_METRICS = (
    "test_acc",
    "best_val_acc",
    "best_epoch",
    "test_correct",
    "test_total",
    "test_loss",
    "epochs_run",
    "latency_ms_per_sample",
    "num_params",
    "train_seconds",
    "loop_seconds",
)

#: The sweep's cell ids as the sweep file stands, logged to its parent run at every invocation:
#: a trial run belongs to the sweep only while its cell_id is in this list.
CELLS_ARTIFACT = "sweep_cells.json"

#: The per-document test predictions of a trial run, and its columns.
PREDICTIONS_FILE = "test_predictions.parquet"
PREDICTION_COLUMNS = ("length", "label", "pred")

#: Params are the trial's config flattened with dots; these say which operator a run used.
OPERATOR_PARAM = "model.fusion"
OPERATOR_KWARGS_PREFIX = "model.fusion_kwargs."
#: Params that say how a run was executed, not what it computed (``train.cuda_graphs`` replays
#: the eager step's kernels): logged, but out of cell ids and allowed to differ inside a pair.
EXECUTION_PARAMS = ("train.cuda_graphs",)

#: Grid axes beyond datasets, positions, attention_positions and fusions (any dotted setting such
#: as ``model.scale_embeddings``). Each trial run carries the tag ``axis.<dotted key>`` with the
#: value as text (``true``/``false``, numbers as written in the sweep file); analysis pairs runs
#: within each combination of these axes.
AXIS_TAG_PREFIX = "axis."
#: On a sweep's parent run: JSON ``{dotted key: [value texts in the sweep file's order]}``; the
#: first value of an axis is its reference level in interaction tests.
GRID_AXES_TAG = "grid_axes"
#: On a trainable sweep's parent run: JSON ``{"trainable", "axis", "baseline", "metric",
#: "mode", "trend"}``: what its runs were made by, the compared axis and its baseline level, the
#: decision metric (null: the first each run returned, ``RETURNED_TAG``) with its direction, and
#: the ordered axis of its trend question (null: none).
TRAINABLE_TAG = "trainable_sweep"
#: On a sweep's parent run: JSON ``{"operator": [...], "dataset": [...]}``, the sweep's
#: operators in the fusion registry's order (the built-ins as registered, then plug-ins) and its
#: datasets in the sweep file's order. The report shows them in this order (datasets by median
#: test-document length where the lengths are known); without it, by name.
DISPLAY_ORDER_TAG = "display_order"


def axis_text(value: Any) -> str:
    """A setting-axis value as text: the ``axis.<key>`` tags, the ``grid_axes`` tag, exclude
    rules and messages. Booleans ``true``/``false``, ``null``, numbers and strings as
    written, anything else as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, sort_keys=True)


#: Measured on the model as initialised, before any training step: the RMS over the vocabulary of
#: the token embeddings as they enter the fusion (times sqrt(d_model) when scale_embeddings is
#: true), and the RMS of the input-level position signal P over positions 0..max_length-1 (0 when
#: the input carries no position signal). Logged once, with the final metrics.
INIT_METRICS = ("init_token_rms", "init_position_rms")

#: Gated operators (H = g * E + (1 - g) * P): at the best validation epoch, the gate g on the test
#: split averaged by position bucket, one row per bucket. ``gate_mean`` is the mean weight on E
#: over the bucket's non-padding tokens (and features, for feature-wise gates).
GATES_FILE = "gate_by_position.parquet"
GATE_COLUMNS = ("bucket_start", "bucket_end", "tokens", "gate_mean", "gate_std")
#: Trial-run tag, ``true`` or ``false``: whether the run's fusion operator has a gate (its class
#: is a gated fusion), so its run carries GATES_FILE. The analysis selects gated runs by this
#: tag, not by operator name, so a plug-in's gated operator gets the gate diagnostics too.
GATED_TAG = "gated"

#: Trial runs whose input-level position is another registry entry under a second name (the same
#: initial values and the same forward, e.g. ``relative_table`` is ``learned``) carry this tag with
#: that entry's name; the report tests each distinct model once.
POSITION_ALIAS_TAG = "position_alias_of"

#: Inference latency of the trial's model over that of the sweep's baseline operator built with
#: the same settings, both timed in the trial's process after training, interleaved on the same
#: batches (so the ratio does not depend on which trials shared the device). Logged once, with
#: the final metrics, when the trial's operator is not the baseline (1.0 when it is).
LATENCY_RATIO_METRIC = "latency_ratio_to_baseline"

#: Train short, test long: with ``data.eval_lengths`` set, every test document is also evaluated
#: truncated at each listed length (longer than the training length included), at the best
#: validation epoch. Final metrics ``test_acc_at_<L>``, ``test_correct_at_<L>`` and
#: ``test_total_at_<L>`` per length L, and one artifact with a row per document and length.
EVAL_LENGTH_METRIC_PREFIXES = ("test_acc_at_", "test_correct_at_", "test_total_at_")
BAG_OF_WORDS_METRIC = "reference.bag_of_words.test_acc"
"""A trial's dataset's bag-of-words baseline (TF-IDF + logistic regression on the same tokens)."""
MAJORITY_METRIC = "reference.majority.test_acc"
"""The test accuracy of always answering the most frequent training class (chance)."""
REFERENCE_METRICS = (BAG_OF_WORDS_METRIC, "reference.bag_of_words.val_acc", MAJORITY_METRIC)
REFERENCE_METRIC_PREFIX = "reference."
"""Final metrics of a dataset's reference baselines, the same on every run of it:
``reference.<baseline>.test_acc`` and ``.val_acc`` (``bag_of_words``: TF-IDF + logistic
regression on the same tokens, position-blind)."""
PARENT_BASELINE_PREFIX = "baseline."
"""Parent-run metrics: ``baseline.<dataset>.<baseline>.test_acc``."""
LENGTH_PREDICTIONS_FILE = "test_predictions_by_length.parquet"
#: ``doc``: the document's index in the test split; ``length``: its length in tokens before any
#: truncation; ``eval_length``: the truncation length it was evaluated at.
LENGTH_PREDICTION_COLUMNS = ("doc", "length", "label", "eval_length", "pred")

#: Sweep-parent-run tag of an adaptive sweep: its rule as JSON (``first``, ``max``, ``alpha``,
#: ``margin``, ``rule``, ``rule_options``, ``decide``) and the ``regimes`` and axis ``levels``
#: its family was built on, so the report decides the same hypotheses with the same rule the
#: driver scheduled by (a tag without ``rule`` was written by the ``sign`` rule, the only one).
ADAPTIVE_TAG = "adaptive_seeds"
#: Sweep-parent-run artifact: one row per hypothesis (``fusion_ray.decide.questions``: operator
#: comparisons, length contrasts, interactions) with its anytime-valid decision
#: (``DECISION_COLUMNS``), written by the driver of an adaptive sweep at its end: its kind,
#: state and verdict (in its kind's words), the rule, seeds, e-values, family p, the
#: simultaneous sequence (``cs_*``), the e-BY interval of a decided one (``ci_*`` at
#: ``ci_level``), mean / median / Hodges-Lehmann of its values, its failed runs and a note.
DECISIONS_FILE = "decisions.csv"
DECISION_COLUMNS = (
    "comparison",
    "kind",
    "state",
    "verdict",
    "rule",
    "null",
    "margin",
    "seeds_used",
    "decided_at_seed",
    "e_value",
    "e_max",
    "e_equivalent",
    "p_anytime",
    "p_family",
    "cs_low",
    "cs_high",
    "ci_low",
    "ci_high",
    "ci_level",
    "mean",
    "median",
    "hodges_lehmann",
    "failed_runs",
    "failed_by_operator",
    "note",
)
#: Sweep-parent-run tags ``decisions.<state>``: how many comparisons are in each state.
DECISIONS_TAG_PREFIX = "decisions."
#: Sweep-parent-run metrics of an adaptive sweep, logged while it runs (step = the hypothesis's
#: seeds so far): ``decision/<key>.<name>`` for each name of ``DECISION_METRICS``, ``<key>`` the
#: hypothesis's short key in the family's order (``h01``, ``h02``, ...), so that MLflow's charts
#: group them in one section, ``decision``, and neither split nor cut a title; and the thresholds
#: ``decision/log10_threshold_least`` (1/alpha) and ``decision/log10_threshold_enough``
#: (m/alpha), which the log10 e-values are charted against.
DECISION_METRIC_PREFIX = "decision/"
DECISION_METRICS = ("log10_e_value", "log10_e_equivalent", "p_family", "decided")
#: Sweep-parent-run tags ``decision.<key>``: the hypothesis's full name; ``decision.<key>.state``:
#: its state at its last look (open, better, worse, equivalent, futile).
DECISION_TAG_PREFIX = "decision."
