"""A fixed anisotropic map: what makes MiniLM's pooled output look like BERT's.

`M = R1 @ diag(s) @ R2 @ diag(t)`, with `R1`, `R2` random rotations,
`s_i = (i + 1) ** -p` a steep spectrum (a few directions dominate, and `R2`
spreads them over every feature, so features form correlated groups), `t`
per-feature scales log-uniform over two orders of magnitude, `p` fitted by
bisection to a target EV_3, and `M` scaled to keep the total variance.
`with_map` puts it, frozen, after a classifier's backbone.
"""

import numpy as np

__all__ = [
    "random_rotation",
    "anisotropic_map",
    "statistics",
    "wrap_backbone",
    "with_map",
]


def random_rotation(rng, dim):
    """A random orthogonal matrix (QR of a Gaussian, signs fixed)."""
    q, r = np.linalg.qr(rng.normal(size=(dim, dim)))
    return q * np.sign(np.diag(r))


def anisotropic_map(pooled, target_ev=0.86, k=3, seed=0):
    """Fits the fixed map `M` to the pre-trained pooled outputs.

    Args:
        pooled: `(examples, features)` pre-trained pooled outputs.
        target_ev: EV_k of `pooled @ M` to reach.
        k: The number of principal components of EV_k.
        seed: Seed of the rotations and the per-feature scales.

    Returns:
        `(M, p)`: the `(features, features)` float64 map and the spectrum's
        exponent.
    """
    from keras_isobn.isotropy import explained_variance

    pooled = np.asarray(pooled, np.float64)
    dim = pooled.shape[1]
    rng = np.random.default_rng(seed)
    r1, r2 = random_rotation(rng, dim), random_rotation(rng, dim)
    t = 10.0 ** rng.uniform(-2.0, 0.0, size=dim)
    total = np.sum(np.var(pooled, axis=0))

    def build(p):
        m = r1 @ np.diag((np.arange(dim) + 1.0) ** -p) @ r2 @ np.diag(t)
        scale = np.sqrt(total / np.sum(np.var(pooled @ m, axis=0)))
        return m * scale

    def ev(p):
        return float(explained_variance(pooled @ build(p), [k])[0])

    low, high = 0.0, 8.0
    if not ev(low) < target_ev < ev(high):
        raise ValueError(
            f"EV_{k} = {target_ev} is out of reach: {ev(low):.3f} with a "
            f"flat spectrum, {ev(high):.3f} with the steepest tried."
        )
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if ev(middle) < target_ev else (low, middle)
    p = (low + high) / 2
    return build(p), p


def statistics(x, k=3):
    """EV_k, std spread and mean squared correlation (IsoBN's gamma)."""
    from keras_isobn.isotropy import isotropy_summary

    summary = isotropy_summary(x, k=[k])
    keys = (
        f"ev{k}",
        "std_min",
        "std_median",
        "std_max",
        "gamma_median",
        "gamma_max",
    )
    return {key: summary[key] for key in keys}


def wrap_backbone(backbone, matrix):
    """`backbone` whose `"pooled_output"` is multiplied by a frozen matrix."""
    import keras

    inputs = backbone.input
    outputs = dict(backbone(inputs))
    fixed = keras.layers.Dense(
        matrix.shape[1],
        use_bias=False,
        trainable=False,
        dtype=backbone.dtype_policy,
        name="anisotropic_map",
    )
    outputs["pooled_output"] = fixed(outputs["pooled_output"])
    fixed.set_weights([matrix.astype("float32")])
    return keras.Model(inputs, outputs, name="anisotropic_backbone")


def with_map(classifier, matrix):
    """A classifier like `classifier` on the wrapped backbone."""
    config = classifier.get_config()
    config.update(
        backbone=wrap_backbone(classifier.backbone, matrix),
        preprocessor=classifier.preprocessor,
        normalization=config.get("normalization"),
    )
    return type(classifier)(**config)
