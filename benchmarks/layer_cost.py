"""Cost of IsoBN beside BatchNormalization, whitening and its covariance.

Times one layer on a `(batch, d)` input, compiled, in train mode (with
the input gradient of a scalar loss) and in inference mode, for `METHODS`
(whitening from `benchmarks.whitening`), and the pieces of IsoBN's train
step alone (`PIECES`, forward only: `covariance` is the centred float32
`Y^T Y / n` IsoBN cannot avoid, `noop` the cost of a compiled call). The
methods are timed in alternation; each result is the median of
`--repeats` blocks.

Usage: `python -m benchmarks.layer_cost [--backend jax] [--dims 768]`.
"""

import functools
import os
import sys

import keras
import numpy as np
from keras import ops

import keras_isobn
from benchmarks import harness
from benchmarks.harness import DTYPES
from benchmarks.steps import LayerStep
from benchmarks.whitening import IterNormWhitening
from benchmarks.whitening import ZCAWhitening

METHODS = ("isobn", "batchnorm", "zca", "iternorm")
PIECES = ("noop", "gram", "covariance", "isobn_forward", "isobn_scale")


class Noop(keras.layers.Layer):
    """Returns its inputs: the cost of calling a compiled step at all."""

    def call(self, inputs, training=None):
        return inputs


class CovarianceProduct(keras.layers.Layer):
    """The float32 covariance `Y^T Y / n` (or the Gram matrix `x^T x`).

    Args:
        centred: Whether to subtract the mean first and divide by `n`.
        **kwargs: Base layer keyword arguments.
    """

    def __init__(self, centred=True, **kwargs):
        super().__init__(**kwargs)
        self.centred = centred

    def call(self, inputs, training=None):
        x = ops.cast(inputs, "float32")
        if not self.centred:
            return ops.matmul(ops.transpose(x), x)
        y = x - ops.mean(x, axis=0)
        return ops.matmul(ops.transpose(y), y) / ops.cast(
            ops.shape(x)[0], "float32"
        )


class IsoBNScale(keras_isobn.IsoBatchNormalization):
    """IsoBN's scale from the moving statistics alone."""

    def call(self, inputs, training=None):
        return self.scale()


LAYERS = {
    "isobn": keras_isobn.IsoBatchNormalization,
    "batchnorm": keras.layers.BatchNormalization,
    "zca": ZCAWhitening,
    "iternorm": functools.partial(IterNormWhitening, iterations=5),
    "noop": Noop,
    "none": Noop,
    "gram": functools.partial(CovarianceProduct, centred=False),
    "covariance": CovarianceProduct,
    "isobn_forward": keras_isobn.IsoBatchNormalization,
    "isobn_scale": IsoBNScale,
}


def make_layer(method, policy):
    """The layer timed as `method` under the dtype policy `policy`."""
    if method not in LAYERS:
        raise ValueError(f"Unknown method {method!r}; choose from {LAYERS}.")
    return LAYERS[method](dtype=policy)


def steps_for(dim, dtype, batch_size, methods, jit, seed=0):
    """The compiled steps to time at one size: `{(mode, method): step}`."""
    policy = DTYPES[dtype]
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch_size, dim)).astype(
        keras.DTypePolicy(policy).compute_dtype
    )
    steps = {}
    full = ("noop",) + tuple(methods)
    for method in full + PIECES[1:]:
        layer = make_layer(method, policy)
        layer.build((batch_size, dim))
        if method in full:
            steps["train", method] = LayerStep(layer, x, "train", jit)
            layer = make_layer(method, policy)
            layer.build((batch_size, dim))
            fit_statistics(layer, x)
            steps["inference", method] = LayerStep(layer, x, "inference", jit)
        elif method == "isobn_scale":
            fit_statistics(layer, x)
            steps["train", method] = LayerStep(layer, x, "inference", jit)
        else:
            steps["train", method] = LayerStep(layer, x, "forward_train", jit)
    return steps


def fit_statistics(layer, x):
    """A few eager training calls, so inference sees fitted statistics."""
    if layer.non_trainable_variables:
        for _ in range(3):
            layer(x, training=True)


def measure(args):
    """Times every method at every size on the loaded backend."""
    backend = keras.backend.backend()
    jit = backend != "torch" or args.torch_compile
    results = []
    for dim in args.dims:
        for dtype in args.dtypes:
            load = os.getloadavg()[0]
            steps = steps_for(dim, dtype, args.batch_size, args.methods, jit)
            timings = harness.time_interleaved(
                steps, args.repeats, min_block_s=args.min_block_s,
                max_seconds=args.max_seconds,
            )
            results += [
                dict(t, dim=dim, dtype=dtype, mode=mode, method=method,
                     load_average_before=load)
                for (mode, method), t in timings.items()
            ]
            print(f"[layer_cost] {backend} d={dim} {dtype}: " + ", ".join(
                f"{mode[:5]}/{method}={t['median_s'] * 1e6:.0f}us"
                for (mode, method), t in timings.items()
            ), file=sys.stderr, flush=True)
    compiled = {
        "jax": "jax.jit of stateless_call",
        "tensorflow": "tf.function(jit_compile=True)",
        "torch": "torch.compile" if args.torch_compile else "eager",
    }
    settings = dict(
        batch_size=args.batch_size, dims=args.dims,
        dtypes={d: DTYPES[d] for d in args.dtypes}, repeats=args.repeats,
        threads=args.threads, min_block_s=args.min_block_s,
        max_seconds=args.max_seconds, compiled=compiled[backend],
    )
    return harness.write_results(args, "layer_cost", settings, results)


OPTIONS = {
    "dims": ([384, 768, 1024], "Feature sizes d."),
    "dtypes": (list(DTYPES), "Compute dtypes.", tuple(DTYPES)),
    "methods": (list(METHODS), "Normalizations timed beside IsoBN's "
                "pieces.", METHODS),
    "batch_size": (32, "Rows of the input."),
    "repeats": (25, "Timed blocks per method (median taken)."),
    "min_block_s": (0.05, "Target seconds of one timed block."),
    "max_seconds": (20.0, "Time budget of one method at one size: slower "
                    "ones get fewer repeats, at least 3."),
    "torch_compile": (False, "Compile the PyTorch steps (default: eager)."),
}
QUICK = dict(dims=[8], repeats=2, min_block_s=0.001, threads=0)


def main(argv=None):
    """Runs the benchmark; returns the JSON paths written, one per backend."""
    parser = harness.command(__name__, OPTIONS, threads=1)
    return harness.run(__name__, argv, parser, measure, QUICK)


if __name__ == "__main__":
    main()
