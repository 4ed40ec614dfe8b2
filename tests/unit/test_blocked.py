import numpy as np
import pytest

from adawidth.blocked import BlockedCorpus
from adawidth.prefix import exact_prefix_search, prefix_normalize
from tests.hybrid_support import unit_data


def _data(seed=0, n=300, d=64):
    return unit_data(seed, n, d)


def test_blocked_scan_equals_direct_prefix_cosines_and_counts_work():
    X, q = _data()
    bc = BlockedCorpus(X, block=16)
    s16 = bc.extend(bc.start(), q, 16)
    s48 = bc.extend(s16, q, 48)
    direct = prefix_normalize(X, 48) @ prefix_normalize(q[None], 48)[0]
    assert np.allclose(bc.cosines(s48), direct, atol=1e-5)
    assert s48.work == 300 * 48 and s16.work == 300 * 16
    # extending in two steps equals one step
    assert np.allclose(bc.extend(bc.start(), q, 48).dots, s48.dots, atol=1e-5)
    rows, cos = bc.shortlist(s48, 10)
    assert rows.tolist() == exact_prefix_search(q[None], X, 48, 10)[0].tolist()


def test_partial_scores_continue_to_rescoring_width():
    X, q = _data(1)
    bc = BlockedCorpus(X, block=16)
    s = bc.extend(bc.start(), q, 16)
    rows, _ = bc.shortlist(s, 50)
    p = bc.partial_scores(s, rows).extend(q, bc.full_matrix(), 64)
    direct = prefix_normalize(X[rows], 64) @ prefix_normalize(q[None], 64)[0]
    assert np.allclose(p.cosine(), direct, atol=1e-5)


def test_invalid_widths():
    X, q = _data(2)
    bc = BlockedCorpus(X, block=16)
    s = bc.extend(bc.start(), q, 32)
    with pytest.raises(ValueError):
        bc.extend(s, q, 16)
    with pytest.raises(ValueError):
        bc.extend(s, q, 40)
    with pytest.raises(ValueError):
        BlockedCorpus(X[:, :40], block=16)
