"""`python -m keras_isobn`: fit IsoBN on anisotropic data and show its effect."""

import numpy as np

import keras_isobn

__all__ = ["main"]


def main():
    """Prints the spread of feature stds, EV_3 and total variance, in & out."""
    rng = np.random.default_rng(0)
    # Embeddings like pre-trained [CLS] vectors: stds over four decades and
    # a few highly correlated groups of features.
    mixing = rng.normal(size=(64, 64)) * np.logspace(-2, 2, 64)
    layer = keras_isobn.IsoBatchNormalization()
    for _ in range(200):
        batch = (rng.normal(size=(32, 64)) @ mixing).astype("float32")
        layer(batch, training=True)
    probe = (rng.normal(size=(2048, 64)) @ mixing).astype("float32")
    out = np.asarray(layer(probe))
    for name, x in (("input", probe), ("IsoBN output", out)):
        std = x.std(axis=0)
        eigenvalues = np.linalg.eigvalsh(np.cov(x, rowvar=False))[::-1]
        ev3 = eigenvalues[:3].sum() / eigenvalues.sum()
        print(
            f"{name:>12}: std max/min {std.max() / std.min():10.1f}, "
            f"EV_3 {ev3:.3f}, total variance {std.dot(std):.1f}"
        )


if __name__ == "__main__":
    main()
