"""Item groups (stagesplit/itemgroups.py): grouping items by their exact layer set."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from stagesplit.model.itemgroups import ItemGroups, _unique_rows


@given(st.integers(1, 4).flatmap(lambda words: st.lists(
    st.lists(st.sampled_from([0, 1, 2**63, 2**64 - 1, 7]), min_size=words, max_size=words), max_size=60)),
    st.integers(1, 4))
@settings(max_examples=80, deadline=None)
def test_unique_rows_is_numpys_unique_over_rows(rows, words):
    rows = np.array(rows, np.uint64).reshape(len(rows), -1) if rows else np.zeros((0, words), np.uint64)
    _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    got_first, got_inverse = _unique_rows(rows)
    assert got_first.tolist() == first.tolist()
    assert got_inverse.tolist() == inverse.reshape(-1).tolist()


def test_groups_by_exact_layer_set_over_many_words():
    # 3 operations on layers 0, 70 and 130 (three 64-bit words); items 0..4
    offsets = np.array([0, 3, 5, 7])
    values = np.array([0, 1, 2, 1, 3, 1, 2])          # op 0: items 0,1,2; op 1: 1,3; op 2: 1,2
    groups = ItemGroups.of(offsets, values, np.array([0, 70, 130]), num_items=5, num_layers=140)
    assert groups.shared.tolist() == [False, False, False, False, True]
    layer_sets = {item: groups.group_layers[g].tolist() for item, g in enumerate(groups.group.tolist()) if g >= 0}
    assert layer_sets == {0: [0], 1: [0, 70, 130], 2: [0, 130], 3: [70]}
    assert groups.group[4] == -1
