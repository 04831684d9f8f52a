"""The length section says when a dataset's longest bucket is mostly truncated (its long-short
contrast then measures truncation as much as length)."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.sections.study.lengths import truncation_notes

pytestmark = pytest.mark.unit


def test_a_mostly_truncated_longest_bucket_gets_a_note_and_a_short_one_none():
    buckets = pd.DataFrame(
        {
            "dataset": ["short", "short", "long", "long"],
            "bucket": ["0", "1", "0", "1"],
            "truncated_share": [0.0, 0.1, 0.2, 1.0],
        }
    )
    notes = [n for n in truncation_notes(buckets) if n]
    assert len(notes) == 1
    assert notes[0].startswith("**long**: 100% of the longest bucket")
    assert truncation_notes(buckets.iloc[:2]) == []
