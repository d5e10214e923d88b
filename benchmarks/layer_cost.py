"""Cost of IsoBN beside BatchNormalization, whitening and its covariance.

Times one layer on a `(batch, d)` input, compiled, in train mode
(forward in training mode with the statistics update, plus the gradient
of a scalar loss with respect to the input) and in inference mode, for:

- `isobn`: `keras_isobn.IsoBatchNormalization`;
- `batchnorm`: `keras.layers.BatchNormalization`;
- `zca`: ZCA whitening by eigendecomposition (`benchmarks.whitening`);
- `iternorm`: whitening by 5 Newton's iterations (`benchmarks.whitening`);

and, to say where IsoBN's time goes, the pieces of its train step alone
(forward only, as they have no gradient):

- `covariance`: the centred float32 covariance `Y^T Y / n`, the one
  product IsoBN cannot avoid; `gram`: the plain product `x^T x`;
- `isobn_forward`: IsoBN's forward in training mode: the statistics
  update (covariance, std, finiteness check, moving averages), the scale
  and `x * scale` (earlier results hold `isobn_update` instead, the
  statistics update alone, timed through a private method);
- `isobn_scale`: the scale computed from the moving statistics
  (`IsoBatchNormalization.scale()`);
- `noop`: an identity layer, the cost of calling a compiled step at all.

Float32 runs under the `"float32"` policy, float16 under
`"mixed_float16"` (float16 inputs and outputs; every method keeps its
statistics in float32). The methods are timed in alternation; each
result is the median of `--repeats` blocks.

Usage:

```
python -m benchmarks.layer_cost                 # all backends, full sizes
python -m benchmarks.layer_cost --backend jax --dims 768 --repeats 30
```
"""

import argparse
import functools
import os
import sys

import keras
import numpy as np
from keras import ops

import keras_isobn
from benchmarks import common
from benchmarks.steps import LayerStep
from benchmarks.whitening import IterNormWhitening
from benchmarks.whitening import ZCAWhitening

METHODS = ("isobn", "batchnorm", "zca", "iternorm")
PIECES = ("noop", "gram", "covariance", "isobn_forward", "isobn_scale")
DTYPES = {"float32": "float32", "float16": "mixed_float16"}


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
            _fit_statistics(layer, x)
            steps["inference", method] = LayerStep(layer, x, "inference", jit)
        elif method == "isobn_scale":
            _fit_statistics(layer, x)
            steps["train", method] = LayerStep(layer, x, "inference", jit)
        else:
            steps["train", method] = LayerStep(layer, x, "forward_train", jit)
    return steps


def _fit_statistics(layer, x):
    """A few eager training calls, so inference sees fitted statistics."""
    if layer.non_trainable_variables:
        for _ in range(3):
            layer(x, training=True)


def measure(args):
    """Times every method at every size on the loaded backend."""
    common.limit_threads(args.threads)
    backend = keras.backend.backend()
    jit = backend != "torch" or args.torch_compile
    results = []
    for dim in args.dims:
        for dtype in args.dtypes:
            load = os.getloadavg()[0]
            steps = steps_for(dim, dtype, args.batch_size, args.methods, jit)
            timings = common.time_interleaved(
                steps, args.repeats, min_block_s=args.min_block_s,
                max_seconds=args.max_seconds,
            )
            results += [
                dict(t, dim=dim, dtype=dtype, mode=mode, method=method,
                     load_average_before=load)
                for (mode, method), t in timings.items()
            ]
            isobn = timings.get(("train", "isobn"), {}).get("median_s")
            cov = timings[("train", "covariance")]["median_s"]
            print(
                f"[layer_cost] {backend} d={dim} {dtype}: "
                + ", ".join(
                    f"{mode[:5]}/{method}={t['median_s'] * 1e6:.0f}us"
                    for (mode, method), t in timings.items()
                )
                + (f"; isobn/cov={isobn / cov:.2f}" if isobn else ""),
                file=sys.stderr,
                flush=True,
            )
    compiled = {
        "jax": "jax.jit of stateless_call",
        "tensorflow": "tf.function(jit_compile=True)",
        "torch": "torch.compile" if args.torch_compile else "eager",
    }
    settings = {
        "batch_size": args.batch_size,
        "dims": args.dims,
        "dtypes": {d: DTYPES[d] for d in args.dtypes},
        "repeats": args.repeats,
        "threads": args.threads,
        "min_block_s": args.min_block_s,
        "max_seconds": args.max_seconds,
        "compiled": compiled[backend],
    }
    return common.write_results(args, "layer_cost", settings, results)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.layer_cost",
        description=__doc__.split("\n\n")[0],
        epilog="Writes layer_cost_<backend>.json to --output.",
    )
    common.add_common_arguments(parser, default_threads=1)
    add = parser.add_argument
    add("--dims", type=int, nargs="+", default=[384, 768, 1024],
        help="Feature sizes d. Defaults to %(default)s.")
    add("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES),
        help="Compute dtypes. Defaults to %(default)s.")
    add("--methods", nargs="+", choices=METHODS, default=list(METHODS),
        help="Normalizations to time beside the pieces of IsoBN. Defaults "
        "to %(default)s.")
    add("--batch-size", type=int, default=32,
        help="Rows of the input. Defaults to %(default)s.")
    add("--repeats", type=int, default=25,
        help="Timed blocks per method (median taken). Defaults to "
        "%(default)s.")
    add("--min-block-s", type=float, default=0.05,
        help="Target seconds of one timed block. Defaults to %(default)s.")
    add("--max-seconds", type=float, default=20.0,
        help="Time budget of one method at one size: slower methods (e.g. "
        "whitening by TensorFlow's XLA eigensolver) get fewer repeats, at "
        "least 3. Defaults to %(default)s.")
    add("--torch-compile", action="store_true",
        help="Compile the PyTorch steps with torch.compile (default: eager).")
    args = parser.parse_args(argv)
    if args.quick:
        args.dims, args.repeats, args.min_block_s = [8], 2, 0.001
        args.threads = 0
    return args


def main(argv=None):
    """Runs the benchmark; returns the JSON paths written, one per backend."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return common.run_on_backends("benchmarks.layer_cost", argv, args, measure)


if __name__ == "__main__":
    main()
