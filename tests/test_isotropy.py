import keras
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from keras_isobn import isotropy

SPECTRUM = np.array([10.0, 5.0, 3.0, 2.0, 1.0, 0.5, 0.2, 0.1])


def _orthogonal(rng, size):
    q, r = np.linalg.qr(rng.normal(size=(size, size)))
    return q * np.sign(np.diag(r))


def _known_spectrum(rng, samples=200, singular_values=SPECTRUM):
    """Rows whose centred singular values are exactly `singular_values`."""
    dim = singular_values.size
    columns = rng.normal(size=(samples, dim))
    columns -= columns.mean(axis=0)  # Orthogonal to the all-ones vector.
    u, _ = np.linalg.qr(columns)
    x = u @ np.diag(singular_values) @ _orthogonal(rng, dim).T
    return x + rng.normal(size=dim) * 3.0  # An arbitrary mean.


def _ev_eigh(x, k):
    """EV_k from the eigenvalues of the float64 covariance (independent)."""
    eigenvalues = np.sort(np.linalg.eigvalsh(np.cov(np.float64(x).T)))[::-1]
    return eigenvalues[:k].sum() / eigenvalues.sum()


def test_explained_variance_known_spectrum_on_float32(rng):
    x = _known_spectrum(rng).astype("float32")
    expected = np.cumsum(SPECTRUM**2) / np.sum(SPECTRUM**2)
    got = isotropy.explained_variance(x, k=list(range(1, 9)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    single = isotropy.explained_variance(x, k=3)
    assert isinstance(single, float)
    assert abs(single - expected[2]) < 1e-6


def test_explained_variance_of_isotropic_data_is_k_over_d(rng):
    x = _known_spectrum(rng, singular_values=np.full(8, 2.0))
    got = isotropy.explained_variance(x, k=[1, 3, 8])
    np.testing.assert_allclose(got, [1 / 8, 3 / 8, 1.0], rtol=0, atol=1e-12)


def test_explained_variance_accepts_backend_tensors(rng):
    x = rng.normal(size=(50, 6)).astype("float32") * [5, 4, 3, 2, 1, 1]
    got = isotropy.explained_variance(keras.ops.convert_to_tensor(x), k=3)
    assert abs(got - _ev_eigh(x, 3)) < 1e-6


def test_explained_variance_invariant_to_row_order_rotation_and_shift(rng):
    x = rng.normal(size=(300, 10)) @ rng.normal(size=(10, 10))
    ks = [1, 3, 10]
    reference = isotropy.explained_variance(x, k=ks)
    np.testing.assert_allclose(reference[:2], [_ev_eigh(x, 1), _ev_eigh(x, 3)])
    permuted = isotropy.explained_variance(x[rng.permutation(300)], k=ks)
    rotated = isotropy.explained_variance(x @ _orthogonal(rng, 10), k=ks)
    shifted = isotropy.explained_variance(x + 100.0, k=ks)
    for values in (permuted, rotated, shifted):
        np.testing.assert_allclose(values, reference, rtol=0, atol=1e-10)


def test_explained_variance_with_fewer_samples_than_features(rng):
    x = rng.normal(size=(3, 8))  # Centred rank 2.
    got = isotropy.explained_variance(x, k=[1, 2, 3, 8])
    assert got[0] < 1.0
    np.testing.assert_allclose(got[1:], 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "k, match",
    [(0, r"\[1, 4\]"), (5, r"\[1, 4\]"), ([1, 0], r"\[1, 4\]"),
     (1.5, "integer"), ([], "integer"), (True, "integer")],
)
def test_explained_variance_rejects_bad_k(rng, k, match):
    with pytest.raises(ValueError, match=match):
        isotropy.explained_variance(rng.normal(size=(10, 4)), k=k)


@pytest.mark.parametrize(
    "x, match",
    [(np.ones((1, 4)), "At least 2 samples"),
     (np.ones(4), r"\(samples, features\)"),
     (np.ones((5, 3, 4)), r"reshape"),
     (np.full((5, 4), np.nan), "NaN"),
     (np.ones((5, 4)), "without variance")],
)
def test_explained_variance_rejects_bad_embeddings(x, match):
    with pytest.raises(ValueError, match=match):
        isotropy.explained_variance(x, k=1)


def test_feature_std_matches_numpy(rng):
    x = (rng.normal(size=(100, 5)) * [1e-3, 1, 10, 100, 0]).astype("float32")
    expected = np.std(np.float64(x), axis=0)
    np.testing.assert_allclose(isotropy.feature_std(x), expected, rtol=1e-12)
    from_tensor = isotropy.feature_std(keras.ops.convert_to_tensor(x))
    np.testing.assert_allclose(from_tensor, expected, rtol=1e-12)


def test_clustered_correlation_puts_groups_in_blocks(rng):
    groups, per_group = 3, 4
    latent = rng.normal(size=(500, groups))
    # Feature j follows latent factor j % 3: the groups are interleaved.
    group_of = np.arange(groups * per_group) % groups
    x = latent[:, group_of] + 0.2 * rng.normal(size=(500, group_of.size))
    correlation, order = isotropy.clustered_correlation(x)
    assert sorted(order.tolist()) == list(range(group_of.size))
    np.testing.assert_allclose(
        correlation, np.corrcoef(x.T)[np.ix_(order, order)], atol=1e-12
    )
    blocks = group_of[order].reshape(groups, per_group)
    assert all(len(set(block)) == 1 for block in blocks.tolist())
    assert len(set(blocks[:, 0].tolist())) == groups


def test_clustered_correlation_with_a_constant_feature(rng):
    x = rng.normal(size=(50, 4))
    x[:, 2] = 7.0
    correlation, order = isotropy.clustered_correlation(x)
    assert np.all(np.isfinite(correlation))
    position = int(np.flatnonzero(order == 2)[0])
    expected = np.zeros(4)
    expected[position] = 1.0
    np.testing.assert_array_equal(correlation[position], expected)


def test_isotropy_summary_matches_numpy_statements(rng):
    z = rng.normal(size=(3000, 3))
    # Features 0-2 one group (copies of z0, scaled), 3-4 a second, 5 alone.
    x = np.stack([z[:, 0], 2 * z[:, 0], -z[:, 0] + 0.01 * z[:, 2],
                  z[:, 1], 5 * z[:, 1], z[:, 2] * 100], axis=1)  # fmt: skip
    summary = isotropy.isotropy_summary(x, k=[1, 3], threshold=0.5)
    rho = np.corrcoef(x, rowvar=False)
    gamma = np.mean(rho**2, axis=1)
    std = x.std(axis=0)
    np.testing.assert_allclose(summary["ev1"], _ev_eigh(x, 1), rtol=1e-9)
    np.testing.assert_allclose(summary["ev3"], _ev_eigh(x, 3), rtol=1e-9)
    np.testing.assert_allclose(summary["gamma_max"], gamma.max(), rtol=1e-9)
    np.testing.assert_allclose(
        summary["group_size_median"], 6 * np.median(gamma), rtol=1e-9
    )
    assert round(summary["group_size_max"], 2) == 3.0
    assert summary["correlated_share"] == pytest.approx(5 / 6)
    np.testing.assert_allclose(summary["std_max"], std.max(), rtol=1e-12)
    np.testing.assert_allclose(
        summary["std_p95_p5"],
        np.percentile(std, 95) / np.percentile(std, 5),
        rtol=1e-12,
    )
    off = np.abs(rho[~np.eye(6, dtype=bool)])
    np.testing.assert_allclose(
        summary["mean_abs_correlation"], off.mean(), rtol=1e-9
    )
    assert summary["constant_features"] == 0


def test_isotropy_summary_of_isotropic_data_and_a_constant_feature(rng):
    x = rng.normal(size=(5000, 64))
    summary = isotropy.isotropy_summary(x)
    assert summary["correlated_share"] == 0.0
    assert summary["group_size_max"] < 1.1
    assert summary["std_p95_p5"] < 1.1
    x[:, 3] = 1.0
    summary = isotropy.isotropy_summary(x)
    assert summary["constant_features"] == 1
    assert summary["std_p95_p5"] < 1.1  # The 5th percentile skips it.
    assert all(np.isfinite(v) for v in summary.values())


def test_logit_variance_share_matches_projected_logits(rng):
    x = rng.normal(size=(400, 6)) @ rng.normal(size=(6, 6))
    kernel = rng.normal(size=(6, 3))
    centred = x - x.mean(axis=0)
    _, _, components = np.linalg.svd(centred, full_matrices=False)
    # Variance of the logits of the data projected on each component.
    per_component = np.array(
        [
            np.var(centred @ np.outer(v, v) @ kernel, axis=0).sum()
            for v in components
        ]
    )
    total = np.var(centred @ kernel, axis=0).sum()
    assert abs(per_component.sum() - total) < 1e-9 * total
    got = isotropy.logit_variance_share(x, kernel)
    np.testing.assert_allclose(got, per_component / total, atol=1e-10)


def test_logit_variance_share_of_a_single_direction(rng):
    x = rng.normal(size=(1000, 4)) * [4.0, 3.0, 2.0, 1.0]
    top = np.linalg.svd(x - x.mean(axis=0), full_matrices=False)[2][0]
    got = isotropy.logit_variance_share(x, top)  # A (features,) kernel.
    np.testing.assert_allclose(got, [1.0, 0.0, 0.0, 0.0], atol=1e-10)
    two_d = isotropy.logit_variance_share(x, top[:, None])
    np.testing.assert_allclose(two_d, got, atol=1e-15)


def test_logit_variance_share_rejects_a_mismatched_kernel(rng):
    with pytest.raises(ValueError, match=r"features=4"):
        isotropy.logit_variance_share(rng.normal(size=(10, 4)), np.ones(3))


def test_optimal_logit_variance_share_uses_logistic_regression(rng):
    x = rng.normal(size=(600, 3)) * [5.0, 3.0, 1.0]
    labels = (x[:, 2] > 0).astype(int)  # Only the smallest component.
    got = isotropy.optimal_logit_variance_share(x, labels)
    kernel = LogisticRegression(max_iter=1000).fit(x, labels).coef_.T
    np.testing.assert_allclose(
        got, isotropy.logit_variance_share(x, kernel), atol=1e-12
    )
    assert got[-1] > 0.9
    assert abs(got.sum() - 1.0) < 1e-12


def test_optimal_logit_variance_share_rejects_bad_labels(rng):
    x = rng.normal(size=(20, 3))
    with pytest.raises(ValueError, match="two classes"):
        isotropy.optimal_logit_variance_share(x, np.zeros(20))
    with pytest.raises(ValueError, match="one entry per row"):
        isotropy.optimal_logit_variance_share(x, np.arange(10) % 2)


def test_isobn_reference_scale_keeps_the_total_variance(rng):
    x = rng.normal(size=(500, 6)) * np.logspace(0, 2, 6)
    covariance = np.cov(x, rowvar=False, bias=True)
    std = np.sqrt(np.diag(covariance))
    scale = isotropy.isobn_reference_scale(covariance, std, epsilon=0.0)
    assert scale.dtype == np.float64 and scale.shape == (6,)
    np.testing.assert_allclose(
        np.sum(np.diag(covariance) * scale**2), np.trace(covariance)
    )
    unit = isotropy.isobn_reference_scale(covariance, std, output_variance="unit")
    np.testing.assert_allclose(
        np.sum(np.diag(covariance) * unit**2), 6, rtol=1e-3
    )


def test_docstring_examples():
    import doctest

    import keras_isobn.isotropy

    result = doctest.testmod(keras_isobn.isotropy)
    assert result.attempted >= 2 and result.failed == 0
