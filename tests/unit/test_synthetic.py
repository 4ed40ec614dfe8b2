"""adawidth.synthetic: the fitted Gaussian reproduces the source's mean and spectrum; rotation and chunking are exact."""

import numpy as np
import pytest

from adawidth.rotation import pca_rotation
from adawidth.synthetic import fit_gaussian, sample_corpus


def _anisotropic(n=20000, D=24, seed=1):
    rng = np.random.default_rng(seed)
    spectrum = 1.0 / np.arange(1, D + 1) ** 1.5  # decaying, like real embeddings
    Q, _ = np.linalg.qr(rng.standard_normal((D, D)))
    return rng.standard_normal((n, D)) * np.sqrt(spectrum) @ Q.T + rng.standard_normal(D) * 0.3, spectrum


def test_fit_and_sample_reproduce_mean_and_spectrum():
    X, spectrum = _anisotropic()
    model = fit_gaussian(X)
    assert np.allclose(model.eigenvalues, spectrum, rtol=0.05, atol=1e-4)
    Y = sample_corpus(model, 40000, seed=3, normalize=False)
    assert Y.dtype == np.float32 and Y.shape == (40000, 24)
    assert np.allclose(Y.mean(0), X.mean(0), atol=0.02)
    w = np.sort(np.linalg.eigvalsh(np.cov(Y, rowvar=False)))[::-1]
    assert np.allclose(w, spectrum, rtol=0.06, atol=2e-4)
    # a different seed gives different draws with the same statistics
    Z = sample_corpus(model, 40000, seed=4, normalize=False)
    assert not np.allclose(Y[:10], Z[:10])


def test_rows_are_unit_norm_and_rotation_is_exact():
    X, _ = _anisotropic(n=5000, D=16)
    model = fit_gaussian(X)
    R = pca_rotation(X).astype(np.float64)
    A = sample_corpus(model, 3000, seed=7, chunk=1000)
    B = sample_corpus(model, 3000, seed=7, chunk=1000, rotation=R)
    assert np.allclose(np.linalg.norm(A, axis=1), 1.0, atol=1e-5)
    assert np.allclose(A @ R.T, B, atol=1e-5)


def test_chunks_are_deterministic_and_fill_out():
    X, _ = _anisotropic(n=2000, D=8)
    model = fit_gaussian(X)
    out = np.zeros((2500, 8), np.float32)
    got = sample_corpus(model, 2500, seed=2, chunk=1000, out=out)
    assert got is out and np.array_equal(out, sample_corpus(model, 2500, seed=2, chunk=1000))
    # the first chunk does not depend on how many rows follow
    assert np.array_equal(sample_corpus(model, 1000, seed=2, chunk=1000), out[:1000])


def test_bad_arguments():
    model = fit_gaussian(np.random.default_rng(0).standard_normal((50, 4)))
    with pytest.raises(ValueError):
        fit_gaussian(np.ones((1, 4)))
    with pytest.raises(ValueError):
        sample_corpus(model, -1)
    with pytest.raises(ValueError):
        sample_corpus(model, 3, rotation=np.eye(3))
    with pytest.raises(ValueError):
        sample_corpus(model, 3, out=np.empty((2, 4), np.float32))
