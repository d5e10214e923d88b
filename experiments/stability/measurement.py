"""How often each normalization returns NaN/Inf on ill-conditioned inputs.

Each trial trains a fresh layer for `--steps` compiled train steps, then
runs it in inference. It *fails* if a train step's outputs or input
gradient, the moving statistics or the inference outputs hold a NaN or
Inf, or if a step raises. Inputs (`--families`): `isotropic` (standard
normal, the control); `cls_like` (shaped like pre-trained [CLS] vectors:
stds log-uniform from 1e-33 to 1, non-zero means, three shared latent
factors); `minilm` (real pooled [CLS] vectors of MiniLM on SST-2, with
`--glue-dir`). Float16 runs under `"mixed_float16"` (stds under ~6e-8
become 0).

Usage: `python -m experiments.stability [--backend jax] [--glue-dir G]`;
writes `results/stability_<backend>.json` and `.md`.
"""

import os
import sys
import traceback

import keras
import numpy as np

from benchmarks import harness
from benchmarks.harness import DTYPES
from benchmarks.layer_cost import METHODS
from benchmarks.layer_cost import make_layer
from benchmarks.steps import LayerStep
from benchmarks.steps import all_finite

__all__ = ["FAMILIES", "cls_like", "main", "markdown", "measure"]

FAMILIES = ("isotropic", "cls_like", "minilm")
NAMES = {
    "isobn": "IsoBN",
    "batchnorm": "BatchNormalization",
    "zca": "ZCA whitening (eigh)",
    "iternorm": "IterNorm (5 Newton its.)",
}
STAGES = {
    "train_outputs": "out",
    "train_gradient": "grad",
    "statistics": "stats",
    "inference_outputs": "infer",
    "error": "error",
}
RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")


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
    backbone, preprocessor = harness.load_minilm(sequence_length)
    vectors = harness.embed(backbone, preprocessor, sentences[:rows],
                            batch_size)
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
        except Exception as e:  # A failure to count, not to stop at.
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
    settings = dict(
        dim=args.dim, batch_size=args.batch_size, steps=args.steps,
        trials=args.trials, dtypes={d: DTYPES[d] for d in args.dtypes},
        families=families, compiled="eager" if backend == "torch" else "jit",
    )
    return harness.write_results(
        args, "stability", settings, results, markdown=markdown
    )


def markdown(payload, path=None):
    """The table of a run: failed trials per method, inputs and dtype."""
    backend = payload["environment"]["backend"]
    columns, cells, errors = [], {}, []
    for r in payload["results"]:
        column = f"{r['family']} {r['dtype']}"
        if column not in columns:
            columns.append(column)
        stages = ", ".join(
            STAGES[k] for k, v in r["failures_by_stage"].items() if v
        )
        cells[r["method"], column] = f"{r['failed_trials']}/{r['trials']}" + (
            f" ({stages})" if stages else ""
        )
        if r["first_error"]:
            error = r["first_error"].splitlines()[-1][:120]
            errors.append(f"- {NAMES[r['method']]}, {column}: `{error}`")
    rows = [
        [NAMES[m]] + [cells.get((m, c), "-") for c in columns]
        for m in NAMES
        if any((m, c) in cells for c in columns)
    ]
    gradients = [
        f"{name} {max(r['max_abs_finite_gradient'] for r in runs):.3g}"
        for method, name in NAMES.items()
        if (runs := [r for r in payload["results"] if r["method"] == method])
    ]
    ranges = [
        f"{r['family']} {r['dtype']}: feature stds {r['input_min_std']:.1e} "
        f"to {r['input_max_std']:.1e}, up to "
        f"{r['input_zero_std_features']} of {r['dim']} exactly 0"
        for r in payload["results"]
        if r["method"] == "isobn"
    ]
    lines = [
        f"# Stability on the {backend} backend",
        "",
        harness.machine_line(payload["environment"]),
        "",
        "Failed trials / trials, and in brackets where the NaN/Inf appeared "
        "(out: train-step outputs, grad: input gradient, stats: moving "
        "statistics, infer: inference outputs, error: the step raised).",
        "",
        harness.table(["method"] + columns, rows),
        "",
        "Inputs: " + "; ".join(ranges) + ".",
        "",
        "Largest finite input gradient over all trials (loss `sum(y * v)`, "
        "`v` standard normal): " + ", ".join(gradients) + ".",
    ]
    if errors:
        lines += ["", "Errors raised:", ""] + errors
    return "\n".join(lines) + "\n"


OPTIONS = {
    "dim": (384, "Feature size d of the synthetic families (MiniLM's "
            "vectors have 384)."),
    "batch_size": (32, "Rows per batch."),
    "steps": (4, "Train steps per trial."),
    "trials": (10, "Trials (random draws) per method, family and dtype."),
    "dtypes": (list(DTYPES), "Compute dtypes.", tuple(DTYPES)),
    "methods": (list(METHODS), "Normalizations to test.", METHODS),
    "families": (list(FAMILIES), "Input families (`minilm` needs "
                 "--glue-dir).", FAMILIES),
    "glue_dir": (None, "GLUE folder with SST-2/train.tsv, for the `minilm` "
                 "family (left out without it)."),
}


def main(argv=None):
    """Runs the benchmark; returns the JSON paths written, one per backend."""
    parser = harness.command(__name__, OPTIONS)
    parser.set_defaults(output=RESULTS_DIR)
    quick = dict(dim=16, steps=2, trials=2)
    return harness.run(__name__, argv, parser, measure, quick)


if __name__ == "__main__":
    main()
