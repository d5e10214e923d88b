"""Cost of IsoBN beside BatchNormalization, whitening and its covariance.

Times one compiled layer on a `(batch, d)` input, in train mode (with the
input gradient of a scalar loss) and inference mode, for `METHODS`, and the
pieces of IsoBN's train step alone (`PIECES`, forward only: `covariance`
is the float32 `Y^T Y / n` IsoBN cannot avoid, `noop` a compiled call), in
alternation; each result is the median of `--repeats` blocks.
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
        count = ops.cast(ops.shape(x)[0], "float32")
        return ops.matmul(ops.transpose(y), y) / count


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
    x = np.random.default_rng(seed).normal(size=(batch_size, dim))
    x = x.astype(keras.DTypePolicy(policy).compute_dtype)
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


def time_interleaved(functions, repeats, min_block_s=0.02, warmup=2,
                     max_number=1000, max_seconds=None, min_repeats=3):
    """Median time per call of several fast functions, measured in turn.

    Each function is timed in blocks of `number` calls (so that a block
    lasts about `min_block_s`), `repeats` blocks each, alternating (see
    `harness.alternate`); with `max_seconds`, a slow function gets fewer
    blocks (at least `min_repeats`).

    Returns:
        Dict of name to `harness.summarize()` of its seconds per call, with
        `"number"` (calls per block) and `"compile_s"` (the first call).
    """
    once = harness.alternate({n: _repeat(f, 1) for n, f in functions.items()},
                             1, warmup)
    numbers, counts, blocks = {}, {}, {}
    for name, function in functions.items():
        seconds = max(once[name]["times"][0], 1e-7)
        numbers[name] = int(min(max_number, max(1, min_block_s // seconds)))
        counts[name] = repeats
        if max_seconds is not None:
            budget = max_seconds // (seconds * numbers[name])
            counts[name] = int(min(repeats, max(min_repeats, budget)))
        blocks[name] = _repeat(function, numbers[name])
    timed = harness.alternate(blocks, repeats, warmup=0, max_rounds=counts)
    result = {}
    for name in functions:
        per_call = np.divide(timed[name]["times"], numbers[name])
        result[name] = dict(harness.summarize(per_call), number=numbers[name],
                            compile_s=once[name]["compile_s"])
    return result


def _repeat(function, number):
    def run(_):
        for _ in range(number):
            function()

    return run


def measure(args):
    """Times every method at every size on the loaded backend."""
    backend = keras.backend.backend()
    jit = backend != "torch" or args.torch_compile
    results = []
    for dim in args.dims:
        for dtype in args.dtypes:
            load = os.getloadavg()[0]
            steps = steps_for(dim, dtype, args.batch_size, METHODS, jit)
            timings = time_interleaved(steps, args.repeats,
                                       min_block_s=args.min_block_s,
                                       max_seconds=args.max_seconds)
            results += [dict(t, dim=dim, dtype=dtype, mode=mode,
                             method=method, load_average_before=load)
                        for (mode, method), t in timings.items()]
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
    return harness.write_results(args, "layer_cost", settings, results,
                                 markdown=markdown, goals=goals)


NAMES = {"isobn": "IsoBN", "batchnorm": "BatchNormalization",
         "zca": "ZCA whitening (eigh)", "iternorm": "IterNorm (5 Newton its.)"}
PIECE_NAMES = {
    "noop": "empty step", "covariance": "covariance `Y^T Y / n`",
    "isobn_update": "statistics update",
    "isobn_forward": "forward in training mode", "isobn_scale": "scale",
}
LAYER_TARGET = 1.5


def index(payload):
    """`{(mode, method, dim, dtype): median seconds}` of a run."""
    return {(r["mode"], r["method"], r["dim"], r["dtype"]): r["median_s"]
            for r in payload["results"]}


def columns(payload):
    s = payload["settings"]
    return [(d, t) for d in s["dims"] for t in s["dtypes"]]


def breakdown(payload):
    """Per size and dtype: IsoBN's train time and its pieces."""
    times, rows = index(payload), []
    for dim, dtype in columns(payload):
        row = {method: times.get(("train", method, dim, dtype))
               for method in list(NAMES) + list(PIECE_NAMES)}
        isobn, cov, noop = row["isobn"], row["covariance"], row["noop"]
        if isobn is None or cov is None:
            continue
        net = None if noop is None else (isobn - noop) / max(cov - noop, 1e-9)
        row.update(dim=dim, dtype=dtype, ratio=isobn / cov, ratio_net=net,
                   zca_ratio=row["zca"] / isobn if row["zca"] else None)
        rows.append(row)
    return rows


def goals(payload, path=None):
    """The layer's goals: IsoBN over its covariance, ZCA over IsoBN."""
    rows = breakdown(payload)
    if not rows:
        return []
    ratios = [r["ratio"] for r in rows]
    worst = max(rows, key=lambda r: r["ratio"])
    measured = f"{min(ratios):.1f}-{max(ratios):.1f}x"
    layer = harness.status(worst["ratio"] <= LAYER_TARGET)
    if worst["ratio"] > LAYER_TARGET:
        layer += (f" (worst {worst['ratio']:.1f}x: d={worst['dim']}, "
                  f"{worst['dtype']}; see *Where IsoBN's train time goes* "
                  "and [ANALYSIS.md](ANALYSIS.md))")
    result = [{"name": "IsoBN layer, train mode / its covariance product "
               "alone", "target": f"<= {LAYER_TARGET}x",
               "measured": measured, "status": layer}]
    largest = max(r["dim"] for r in rows)
    zca = [r for r in rows if r["dim"] == largest and r["zca_ratio"]]
    if zca:
        result.append({
            "name": f"ZCA whitening / IsoBN, train mode, d={largest}",
            "target": ">= 10x",
            "measured": "; ".join(f"{r['dtype']}: {r['zca_ratio']:.0f}x"
                                  for r in zca),
            "status": harness.status(min(r["zca_ratio"] for r in zca) >= 10),
        })
    return result


def markdown(payload, path=None):
    """The goals, the time of each method and of IsoBN's pieces."""
    backend = payload["environment"]["backend"]
    times = index(payload)
    header = ["method"] + [f"d={d} {t}" for d, t in columns(payload)]
    out = [
        f"# Layer cost, {backend}", "",
        "One layer on a `(32, d)` input, compiled (XLA on JAX and "
        "TensorFlow; PyTorch eager), float32 under the `float32` policy "
        "and float16 under `mixed_float16`. The methods are timed in "
        "alternation, `repeats` blocks each, median per call, and in "
        "brackets the ratio to `keras.layers.BatchNormalization` on the "
        "same size and dtype.", "",
        harness.machine_line(payload["environment"]), "",
        harness.goals_table(goals(payload)),
    ]
    titles = {"train": "Train mode: forward in training mode (statistics "
              "update), plus the gradient of a scalar loss with respect to "
              "the input", "inference": "Inference mode: forward with the "
              "moving statistics"}
    for mode, title in titles.items():
        rows = []
        for method, name in NAMES.items():
            cells = []
            for dim, dtype in columns(payload):
                value = times.get((mode, method, dim, dtype))
                bn = times.get((mode, "batchnorm", dim, dtype))
                if value is None or method == "batchnorm" or not bn:
                    cells.append(harness.us(value))
                else:
                    cells.append(f"{harness.us(value)} ({value / bn:.1f}x)")
            if any(c != "-" for c in cells):
                rows.append([name, *cells])
        out += ["", f"## {title}", "", harness.table(header, rows)]
    rows = breakdown(payload)
    pieces = [p for p in PIECE_NAMES if any(r[p] is not None for r in rows)]
    table_rows = [
        [r["dim"], r["dtype"], *[harness.us(r[p]) for p in pieces],
         harness.us(r["isobn"]), f"{r['ratio']:.2f}",
         "-" if r["ratio_net"] is None else f"{r['ratio_net']:.2f}"]
        for r in rows
    ]
    out += [
        "", "## Where IsoBN's train time goes", "",
        "The pieces of IsoBN's train step timed alone, forward only.", "",
        harness.table(["d", "dtype", *[PIECE_NAMES[p] for p in pieces],
                       "IsoBN train", "IsoBN / covariance",
                       "same, net of the empty step"], table_rows),
    ]
    return "\n".join(out) + "\n"


OPTIONS = {
    "dims": ([384, 768, 1024], "Feature sizes d."),
    "dtypes": (list(DTYPES), "Compute dtypes.", tuple(DTYPES)),
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
