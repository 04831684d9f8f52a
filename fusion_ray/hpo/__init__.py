"""Tune the shared settings before the paired grid: ``python -m fusion_ray.hpo HPO.yaml``.

Optuna (Ray Tune's ``OptunaSearch``) searches each dataset's shared training settings (learning
rate, dropout, batch size, warm-up, ...), scored on the validation split only. The chosen values
are written as a YAML fragment, ``datasets: {NAME: {train: {...}, model: {...}}}``, that sweep
files list under ``extends:`` after their presets, so every operator of the grid then trains with
the same settings. Trials are MLflow runs of the HPO file's own experiment.

Which operators the settings are chosen on matters:

- ``tune.fusion`` (one operator, ``add`` by default): ASHA stops unpromising trials early and the
  trial with the best validation accuracy wins. Tuning the baseline alone favours the baseline:
  the settings are chosen for it and then reused by the other operators, so in the grid the
  baseline trains with the best of ``num_samples`` settings for it, the others with settings
  picked for another operator.
- ``tune.fusions`` (several operators): every sampled setting is trained once per operator, with
  the same tuning seed, and the setting with the lowest mean validation rank across the operators
  wins (``rank_settings``), so no single operator picks the settings. Grid operators left out of
  the list still train with settings chosen on others. Each operator of a setting is its own Tune
  trial (Ray Tune's ``Repeater``); Optuna is told one number per setting, the mean of its
  operators' best validation accuracies: a rank depends on the other settings and changes as
  trials finish, so it is no objective a sampler can model, and the mean accuracy is the
  per-setting number closest to it. There is no early stopping: ASHA would stop one operator's
  trials by comparing them with another operator's, and a setting is ranked on full runs only.

An HPO file has a sweep file's keys for what is tuned (``datasets``, ``defaults``, ``resources``,
``storage_path``, ``tracking_uri``, ``retries``, ``address``, ``extends``) plus ``tune:`` (which
datasets, the operator or operators, the seed, the search space, the trial budget and ASHA),
``output:`` (the fragment's path) and ``sweeps:`` (the sweep files the fragment is for), both
relative to the HPO file. The tuning seed must be none of those sweeps' seeds. The file is
validated as a whole, with every problem reported at once, before Ray starts.

The package: ``spec`` (the file, its validation and the plan), ``ranking`` (the pure choice by
mean validation rank), ``run`` (the Tune trials and the study per dataset), ``fragment`` (the
YAML written) and ``cli`` (``python -m fusion_ray.hpo``, ``fusion-ray hpo``; the package does not
import it: the command line sits above the rest). ``run`` drives its trials in the same driver
session as a sweep (``fusion_ray.driver.session``).
"""

from fusion_ray.hpo.fragment import fragment_text
from fusion_ray.hpo.ranking import Ranking, ScoredSetting, rank_settings
from fusion_ray.hpo.run import OPERATOR_INDEX, run_hpo, tune_dataset
from fusion_ray.hpo.spec import (
    METRIC,
    Asha,
    Distribution,
    HpoFileError,
    HpoPlan,
    TuneSection,
    load_hpo,
    smoke_plan,
    sweep_seeds,
)

__all__ = [
    "METRIC",
    "OPERATOR_INDEX",
    "Asha",
    "Distribution",
    "HpoFileError",
    "HpoPlan",
    "Ranking",
    "ScoredSetting",
    "TuneSection",
    "fragment_text",
    "load_hpo",
    "rank_settings",
    "run_hpo",
    "smoke_plan",
    "sweep_seeds",
    "tune_dataset",
]
