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
- `isobn_update`: IsoBN's statistics update (covariance, std, finiteness
  check, moving averages);
- `isobn_scale`: the scale computed from the moving statistics;
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
PIECES = ("noop", "gram", "covariance", "isobn_update", "isobn_scale")
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


class IsoBNStatisticsUpdate(keras_isobn.IsoBatchNormalization):
    """IsoBN's statistics update alone (returns its inputs)."""

    def call(self, inputs, training=None):
        self._update_moving_statistics(inputs, None)
        return inputs


class IsoBNScale(keras_isobn.IsoBatchNormalization):
    """IsoBN's scale from the moving statistics alone."""

    def call(self, inputs, training=None):
        return self.scale()


def make_layer(method, policy):
    """The layer timed as `method` under the dtype policy `policy`."""
    if method == "isobn":
        return keras_isobn.IsoBatchNormalization(dtype=policy)
    if method == "batchnorm":
        return keras.layers.BatchNormalization(dtype=policy)
    if method == "zca":
        return ZCAWhitening(dtype=policy)
    if method == "iternorm":
        return IterNormWhitening(iterations=5, dtype=policy)
    if method == "noop":
        return Noop(dtype=policy)
    if method == "gram":
        return CovarianceProduct(centred=False, dtype=policy)
    if method == "covariance":
        return CovarianceProduct(centred=True, dtype=policy)
    if method == "isobn_update":
        return IsoBNStatisticsUpdate(dtype=policy)
    if method == "isobn_scale":
        return IsoBNScale(dtype=policy)
    raise ValueError(
        f"Unknown method {method!r}; choose from "
        f"{METHODS + PIECES}."
    )


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
                {key: step for key, step in steps.items()},
                repeats=args.repeats,
                min_block_s=args.min_block_s,
                max_seconds=args.max_seconds,
            )
            for (mode, method), timing in timings.items():
                results.append(
                    dict(
                        timing,
                        dim=dim,
                        dtype=dtype,
                        mode=mode,
                        method=method,
                        load_average_before=load,
                    )
                )
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
    payload = {
        "benchmark": "layer_cost",
        "environment": common.environment(),
        "settings": {
            "batch_size": args.batch_size,
            "dims": args.dims,
            "dtypes": {d: DTYPES[d] for d in args.dtypes},
            "repeats": args.repeats,
            "threads": args.threads,
            "min_block_s": args.min_block_s,
            "max_seconds": args.max_seconds,
            "compiled": {
                "jax": "jax.jit of stateless_call",
                "tensorflow": "tf.function(jit_compile=True)",
                "torch": "torch.compile" if args.torch_compile else "eager",
            }[backend],
            "quick": args.quick,
        },
        "results": results,
    }
    name = f"layer_cost_{backend}{'_quick' if args.quick else ''}.json"
    return common.write_json(os.path.join(args.output, name), payload)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.layer_cost",
        description=__doc__.split("\n\n")[0],
        epilog="Writes layer_cost_<backend>.json to --output.",
    )
    common.add_common_arguments(parser, default_threads=1)
    parser.add_argument(
        "--dims", type=int, nargs="+", default=[384, 768, 1024],
        help="Feature sizes d. Defaults to %(default)s.",
    )
    parser.add_argument(
        "--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES),
        help="Compute dtypes. Defaults to %(default)s.",
    )
    parser.add_argument(
        "--methods", nargs="+", choices=METHODS,
        default=list(METHODS),
        help="Normalizations to time beside the pieces of IsoBN. Defaults "
        "to %(default)s.",
    )
    parser.add_argument(
        "--batch-size", type=int, default=32,
        help="Rows of the input. Defaults to %(default)s.",
    )
    parser.add_argument(
        "--repeats", type=int, default=25,
        help="Timed blocks per method (median taken). Defaults to "
        "%(default)s.",
    )
    parser.add_argument(
        "--min-block-s", type=float, default=0.05,
        help="Target seconds of one timed block. Defaults to %(default)s.",
    )
    parser.add_argument(
        "--max-seconds", type=float, default=20.0,
        help="Time budget of one method at one size: slower methods (e.g. "
        "whitening by TensorFlow's XLA eigensolver) get fewer repeats, at "
        "least 3. Defaults to %(default)s.",
    )
    parser.add_argument(
        "--torch-compile", action="store_true",
        help="Compile the PyTorch steps with torch.compile (default: eager).",
    )
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
