"""Fine-tunes a KerasHub BERT or RoBERTa on GLUE with IsoBN, as in the paper.

Run with no arguments, it trains a small built-in BERT on the GLUE-format
sample shipped in `keras_isobn.glue` (SST-2 and STS-B formats; MRPC's is
there too: `--task sst2 mrpc stsb`), with no normalization,
BatchNormalization and IsoBN, offline on a CPU in under 3 minutes, then
writes the report of `recipes/report.py`:

```bash
python recipes/glue.py
```

The paper's setting, on a KerasHub preset (a name, a Kaggle or Hugging Face
handle, or a local directory) and the TFDS GLUE data (or `--data-dir` with
the original GLUE TSV files):

```bash
python recipes/glue.py --task rte --preset bert_base_en_uncased \
    --norm isobn --seeds 1 2 3 4 5
```

Each run (task, norm, seed) writes to `<output-dir>/<task>/<norm>/seed-<n>/`:
`results.json` (the summary), `epochs.csv` (one row per epoch: loss,
whole-dev-set metrics `val_*`, EV_k `ev3_in`/`ev3_out`, learning rate and
epoch time), `best.keras` (the model of the best dev epoch, with its
preprocessor: it predicts from raw strings),
`dev_predictions.npz` (its dev-set outputs, by split), `logs/`
(TensorBoard) and, while it trains, `backup/` (`BackupAndRestore`): run the
same command again after an interruption and it resumes at the interrupted
epoch; runs whose `results.json` exists are skipped.

Each task is tokenized once, with the preset's preprocessor, for all its
runs; the models train and predict on token ids.
"""

import argparse
import csv
import json
import math
import os
import platform
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_isobn  # noqa: E402
import report  # noqa: E402  (recipes/report.py, next to this file)
from keras_isobn import glue  # noqa: E402
from keras_isobn.callbacks import EVkCallback  # noqa: E402
from keras_isobn.distribution import data_parallel_scope  # noqa: E402
from keras_isobn.distribution import synchronize_statistics  # noqa: E402
from keras_isobn.models import IsoBNBertTextClassifier  # noqa: E402
from keras_isobn.models import IsoBNRobertaTextClassifier  # noqa: E402

NORMS = ("none", "batchnorm", "isobn")
CLASSIFIERS = (IsoBNBertTextClassifier, IsoBNRobertaTextClassifier)
EV_K = 3

# Defaults with a real `--preset`: those of the authors' train.py
# (INK-USC/IsoBN). Without `--preset`: the small built-in setting.
PAPER_DEFAULTS = {
    "task": None,
    "norm": ["isobn"],
    "max_sequence_length": 256,
    "batch_size": 16,
    "learning_rate": 5e-5,
    "epochs": 10,
    "seeds": [1, 2, 3, 4, 5],
}
SAMPLE_DEFAULTS = {
    "task": ["sst2", "stsb"],
    "norm": list(NORMS),
    "max_sequence_length": 40,
    "batch_size": 32,
    "learning_rate": 3e-3,
    "epochs": 4,
    "seeds": [1],
}
# The built-in BERT of the no-argument run.
TINY_BERT = {
    "num_layers": 2,
    "num_heads": 4,
    "hidden_dim": 64,
    "intermediate_dim": 128,
}


def parse_args(argv=None):
    """Parses the command line, filling the defaults of the chosen mode.

    Args:
        argv: List of strings, the arguments without the program name.
            Defaults to `sys.argv[1:]`.

    Returns:
        An `argparse.Namespace` whose `None` defaults are resolved: the
        paper's values with `--preset`, the small built-in setting without.
    """
    parser = argparse.ArgumentParser(
        prog="python recipes/glue.py",
        description=(
            "Fine-tune a KerasHub BERT/RoBERTa on GLUE with no normalization, "
            "BatchNormalization or IsoBN on the pooled output (Zhou, Lin & "
            "Ren, AAAI 2021). Without --preset: a small built-in BERT on the "
            "GLUE-format sample shipped in keras_isobn (offline, a few "
            "minutes on a CPU; its scores say nothing about GLUE). Defaults "
            "in [brackets] are with --preset / without it; with --preset "
            "they are those of the authors' train.py."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--task",
        nargs="+",
        default=None,
        help=(
            "GLUE task(s): " + ", ".join(glue.TASKS) + " (MNLI is scored on "
            "its matched and mismatched dev sets). [required / sst2 stsb]"
        ),
    )
    parser.add_argument(
        "--preset",
        default=None,
        help=(
            "KerasHub BERT or RoBERTa preset: a name (bert_base_en_uncased, "
            "roberta_base_en, ...), a kaggle:// or hf:// handle, or a local "
            "directory (a KerasHub preset or a Hugging Face checkpoint). "
            "Default: the small built-in BERT."
        ),
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help=(
            "Folder with the original GLUE TSV layout (CoLA/, SST-2/, ...). "
            "Default: TFDS glue/<task> with --preset (downloads when online), "
            "the shipped sample without."
        ),
    )
    parser.add_argument(
        "--tfds-data-dir",
        default=None,
        help="TFDS data directory (TFDS's default if unset).",
    )
    parser.add_argument(
        "--norm",
        nargs="+",
        choices=NORMS,
        default=None,
        help=(
            "Normalization(s) of the pooled output before the classifier, "
            "each run in turn. [isobn / none batchnorm isobn]"
        ),
    )
    parser.add_argument(
        "--momentum",
        type=float,
        default=0.05,
        help="Weight of each new batch in the moving statistics.",
    )
    parser.add_argument(
        "--epsilon", type=float, default=1e-3, help="IsoBN's epsilon."
    )
    parser.add_argument(
        "--beta", type=float, default=0.5, help="IsoBN's strength beta."
    )
    parser.add_argument(
        "--bias-correction",
        action="store_true",
        help="Bias-correct IsoBN's moving statistics (off in the paper).",
    )
    parser.add_argument(
        "--dropout",
        type=float,
        default=0.1,
        help="Dropout before the classifier.",
    )
    parser.add_argument(
        "--max-sequence-length",
        type=int,
        default=None,
        help="Tokens per example (pairs included). [256 / 40]",
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="Training epochs. [10 / 4]"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=(
            "Global training batch size; the last incomplete batch of each "
            "epoch is dropped. [16 / 32]"
        ),
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="Peak learning rate of AdamW. [5e-5 / 3e-3]",
    )
    parser.add_argument(
        "--warmup-ratio",
        type=float,
        default=0.06,
        help=(
            "Share of the training steps with a linear warmup; then linear "
            "decay to 0."
        ),
    )
    parser.add_argument(
        "--weight-decay",
        type=float,
        default=0.0,
        help="AdamW weight decay (never on LayerNorm weights and biases).",
    )
    parser.add_argument(
        "--adam-epsilon", type=float, default=1e-6, help="AdamW's epsilon."
    )
    parser.add_argument(
        "--patience",
        type=int,
        default=None,
        help=(
            "Stop after this many epochs without a better dev score. Default: "
            "never stop early (the paper keeps the best of all epochs). The "
            "best epoch's weights are restored and saved either way."
        ),
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=None,
        help="Random seeds, one run each. [1 2 3 4 5 / 1]",
    )
    parser.add_argument(
        "--train-limit",
        type=int,
        default=None,
        help=(
            "Keep the first N training examples of a fixed shuffle (the same "
            "for every seed and norm). Default: all."
        ),
    )
    parser.add_argument(
        "--ev-examples",
        type=int,
        default=1000,
        help="Dev examples the EV_k probe runs on at each epoch end.",
    )
    parser.add_argument(
        "--output-dir",
        default="runs/glue",
        help="Results land in <output-dir>/<task>/<norm>/seed-<n>/.",
    )
    parser.add_argument(
        "--mixed-precision",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Train in mixed_float16. Default: on when a GPU is visible.",
    )
    parser.add_argument(
        "--jit-compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=(
            "Compile the steps with XLA. Default: Keras's 'auto', but off "
            "for the small built-in BERT on TensorFlow, whose compilation "
            "would take longer than its training."
        ),
    )
    parser.add_argument(
        "--distribution",
        choices=("none", "data_parallel"),
        default="none",
        help=(
            "data_parallel: replicate the model on all accelerators and "
            "split each batch across them (TensorFlow or JAX)."
        ),
    )
    parser.add_argument(
        "--no-report",
        action="store_true",
        help="Do not write the report of all runs in <output-dir>/report/.",
    )
    parser.add_argument(
        "--verbose", type=int, default=2, help="Keras fit verbosity (0-2)."
    )
    args = parser.parse_args(argv)

    defaults = PAPER_DEFAULTS if args.preset else SAMPLE_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.task is None:
        parser.error(
            "--task is required with --preset, e.g. --task rte. Known tasks: "
            + ", ".join(glue.TASKS)
        )
    try:
        args.task = [glue.get_task(name).name for name in args.task]
    except ValueError as error:
        parser.error(str(error))
    if args.jit_compile is None:
        # XLA on TensorFlow compiles longer than the built-in BERT trains;
        # on JAX, steps without `jax.jit` run op by op, far slower.
        tiny_on_tf = not args.preset and keras.backend.backend() == "tensorflow"
        args.jit_compile = False if tiny_on_tf else "auto"
    if args.data_dir is None and not args.preset:
        args.data_dir = glue.sample_data_dir()
    for name in ("epochs", "batch_size", "max_sequence_length", "ev_examples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1.")
    if args.train_limit is not None and args.train_limit < 1:
        parser.error("--train-limit must be >= 1.")
    if args.patience is not None and args.patience < 1:
        parser.error("--patience must be >= 1.")
    if not args.learning_rate > 0:
        parser.error("--learning-rate must be > 0.")
    if not 0 <= args.warmup_ratio < 1:
        parser.error("--warmup-ratio must be in [0, 1).")
    if args.distribution != "none" and keras.backend.backend() == "torch":
        parser.error(
            f"--distribution {args.distribution} is not supported on the "
            "torch backend (single-process training only): use "
            "KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax."
        )
    args.seeds = list(dict.fromkeys(args.seeds))
    args.norm = list(dict.fromkeys(args.norm))
    return args


def main(argv=None):
    """Runs every (task, norm, seed) of the command line, then the report.

    Args:
        argv: List of strings, the arguments without the program name.
            Defaults to `sys.argv[1:]`.

    Returns:
        The list of the results dicts (as in `results.json`), one per run,
        those of skipped finished runs included.
    """
    args = parse_args(argv)
    if args.mixed_precision is None:
        args.mixed_precision = _gpu_visible()
    all_results = []
    for task_name in args.task:
        task = glue.get_task(task_name)
        data = load_data(task, args)
        for norm in args.norm:
            for seed in args.seeds:
                seed_dir = os.path.join(
                    args.output_dir, task.name, norm, f"seed-{seed}"
                )
                all_results.append(
                    run(args, task, data, norm, seed, seed_dir)
                )
    if not args.no_report:
        report_dir = os.path.join(args.output_dir, "report")
        report.main([args.output_dir, "--output", report_dir])
    return all_results


def load_data(task, args):
    """Loads the training split and the dev split(s) of a task.

    Returns:
        A dict with `"train"` (a `GlueSplit`, limited to `--train-limit`
        examples) and `"dev"` (a list of `GlueSplit`, one per dev split).
    """
    where = args.data_dir or f"TFDS {task.tfds_name}"
    print(f"[glue] Loading {task.name} from {where}", flush=True)
    load = dict(data_dir=args.data_dir, tfds_data_dir=args.tfds_data_dir)
    train = glue.load_split(task, "train", **load)
    if args.train_limit is not None:
        train = train.limit(args.train_limit, seed=0)
    if len(train) < args.batch_size:
        raise ValueError(
            f"{task.name} has {len(train)} training examples, fewer than one "
            f"batch (--batch-size {args.batch_size}): lower --batch-size or "
            "raise --train-limit."
        )
    dev = [glue.load_split(task, split, **load) for split in task.dev_splits]
    return {"train": train, "dev": dev}


def tokenize(model, splits):
    """Preprocesses the features of `splits` in one `tf.data` pass.

    Args:
        model: The classifier, with its preprocessor.
        splits: List of `GlueSplit`.

    Returns:
        A list with, for each split, its model inputs: a dict of NumPy
        arrays (`"token_ids"`, `"segment_ids"` and `"padding_mask"`, int32
        as the classifier's `preprocess_samples` gives it, which
        `tf.distribute` can split across replicas).
    """
    sizes = [len(split) for split in splits]
    features = keras.tree.map_structure(
        lambda *arrays: np.concatenate(arrays),
        *[split.features for split in splits],
    )
    # A 1-tuple: `(x,)`, so that a pair `(first, second)` is one `x` and not
    # `(x, y)`.
    batches = (
        tf.data.Dataset.from_tensor_slices((features,))
        .batch(1024)
        .map(model.preprocess_samples, num_parallel_calls=tf.data.AUTOTUNE)
    )
    inputs = keras.tree.map_structure(
        lambda *arrays: np.concatenate(arrays), *batches.as_numpy_iterator()
    )
    starts = np.cumsum([0] + sizes)
    return [
        keras.tree.map_structure(lambda a: a[start:start + size], inputs)
        for start, size in zip(starts, sizes)
    ]


def run(args, task, data, norm, seed, seed_dir):
    """Trains one (task, norm, seed), resuming it if it was interrupted.

    Returns:
        The results dict written to `<seed_dir>/results.json`.
    """
    results_path = os.path.join(seed_dir, "results.json")
    name = f"{task.name}/{norm}/seed-{seed}"
    if os.path.exists(results_path):
        print(f"[glue] {name}: done already ({results_path}); skipped.")
        with open(results_path) as file:
            return json.load(file)
    start = time.time()
    os.makedirs(seed_dir, exist_ok=True)
    csv_path = os.path.join(seed_dir, "epochs.csv")
    backup_dir = os.path.join(seed_dir, "backup")
    best_path = os.path.join(seed_dir, "best.keras")
    ev_before_path = os.path.join(seed_dir, "ev_before.json")
    resuming = os.path.isdir(backup_dir)
    if resuming:
        done = read_epochs(csv_path)
        print(
            f"[glue] {name}: resuming after epoch {len(done)} "
            f"(backup in {backup_dir}).",
            flush=True,
        )
    else:
        # No completed epoch: start afresh, keeping nothing half-written.
        done = []
        stale_paths = (
            csv_path, best_path, ev_before_path, os.path.join(seed_dir, "logs")
        )
        for stale in stale_paths:
            if os.path.exists(stale):
                print(f"[glue] {name}: removing {stale} of a run "
                      "interrupted before its first epoch ended.")
                if os.path.isdir(stale):
                    shutil.rmtree(stale)
                else:
                    os.remove(stale)
        print(f"[glue] {name}: training in {seed_dir}", flush=True)

    keras.utils.set_random_seed(seed)
    previous_policy = keras.config.dtype_policy()
    if args.mixed_precision:
        keras.config.set_dtype_policy("mixed_float16")
    try:
        kind = None if args.distribution == "none" else args.distribution
        with data_parallel_scope(kind) as replicas:
            if args.batch_size % replicas:
                raise ValueError(
                    f"--batch-size {args.batch_size} must be a multiple of "
                    f"the {replicas} replicas of --distribution "
                    f"{args.distribution}."
                )
            model = build_classifier(args, task, norm)
            if kind is not None:
                synchronize_statistics(model)
            steps = len(data["train"]) // args.batch_size
            model.compile(
                optimizer=make_optimizer(args, steps * args.epochs),
                jit_compile=args.jit_compile,
            )
            # The model trains and predicts on token ids, tokenized once for
            # all the runs of the task (not at every epoch and evaluation).
            preprocessor = model.preprocessor
            if "inputs" not in data:
                ev_split = data["dev"][0].limit(args.ev_examples, seed=0)
                train, ev, *dev = tokenize(
                    model, [data["train"], ev_split, *data["dev"]]
                )
                data["inputs"] = {"train": train, "ev": ev, "dev": dev}
            inputs = data["inputs"]
            model.preprocessor = None
            dev_metrics = DevMetrics(
                task, data["dev"], inputs["dev"], args.batch_size
            )
            monitor = f"val_{task.primary_metric}"
            best_so_far = _best(done, monitor)
            if _finished(done, monitor, args):
                print(f"[glue] {name}: all epochs done before the "
                      "interruption.")
            else:
                ev_k = EVkCallback(
                    inputs["ev"],
                    k=EV_K,
                    layer=_probed_layer(model),
                    batch_size=args.batch_size * -(-32 // args.batch_size),
                )
                callbacks = [
                    dev_metrics,
                    ev_k,
                    # EV_k of the model before fine-tuning, measured by ev_k
                    # when training begins; kept from the first attempt.
                    keras.callbacks.LambdaCallback(
                        on_train_begin=lambda logs: _save_json(
                            ev_before_path,
                            {key: ev_k.history[key][0] for key in ev_k.keys},
                            overwrite=False,
                        )
                    ),
                    ResumableEarlyStopping(
                        done,
                        monitor=monitor,
                        mode="max",
                        patience=args.patience or args.epochs,
                    ),
                    keras.callbacks.ModelCheckpoint(
                        best_path,
                        monitor=monitor,
                        mode="max",
                        save_best_only=True,
                        initial_value_threshold=best_so_far,
                    ),
                    keras.callbacks.CSVLogger(csv_path, append=resuming),
                    *_tensorboard(os.path.join(seed_dir, "logs")),
                    # Last: it restores the weights after EVkCallback has
                    # measured the pre-trained model, and backs up an epoch
                    # only once its row is in epochs.csv.
                    keras.callbacks.BackupAndRestore(
                        backup_dir, double_checkpoint=True,
                        delete_checkpoint=False,
                    ),
                ]
                train_ds = (
                    tf.data.Dataset.from_tensor_slices(
                        (inputs["train"], data["train"].labels)
                    )
                    .shuffle(len(data["train"]), seed=seed)
                    .batch(args.batch_size, drop_remainder=True)
                    .prefetch(tf.data.AUTOTUNE)
                )
                model.fit(
                    train_ds,
                    epochs=args.epochs,
                    shuffle=False,  # `train_ds` is reshuffled each epoch.
                    callbacks=callbacks,
                    verbose=args.verbose,
                )
            model.load_weights(best_path)
            final = dev_metrics.evaluate(model)
            # The best model, ready for raw strings.
            model.preprocessor = preprocessor
            model.save(best_path)
            np.savez(
                os.path.join(seed_dir, "dev_predictions.npz"),
                **dev_metrics.predictions,
            )
    finally:
        keras.config.set_dtype_policy(previous_policy)

    epochs = read_epochs(csv_path)
    best_row = max(epochs, key=lambda row: row[monitor])
    with open(ev_before_path) as file:
        before = json.load(file)
    results = {
        "task": task.name,
        "group": task.group,
        "preset": args.preset or "builtin-tiny-bert",
        "norm": norm,
        "seed": seed,
        "data": args.data_dir or task.tfds_name,
        "train_examples": len(data["train"]),
        "dev_examples": {split.split: len(split) for split in data["dev"]},
        "hyperparameters": _hyperparameters(args),
        "replicas": replicas,
        "primary_metric": task.primary_metric,
        "best_epoch": int(best_row["epoch"]) + 1,
        "epochs_run": len(epochs),
        "dev_metrics": {
            key[len("val_"):]: value for key, value in final.items()
        },
        "ev": {
            "k": EV_K,
            "before": {"in": before[f"ev{EV_K}_in"],
                       "out": before[f"ev{EV_K}_out"]},
            "after": {"in": best_row[f"ev{EV_K}_in"],
                      "out": best_row[f"ev{EV_K}_out"]},
        },
        "epochs": epochs,
        "train_time_s": float(sum(row["epoch_time_s"] for row in epochs)),
        "wall_time_s": time.time() - start,
        "resumed": resuming,
        "versions": package_versions(),
    }
    _save_json(results_path, results, overwrite=False)
    shutil.rmtree(backup_dir, ignore_errors=True)
    summary = ", ".join(f"{k} {v:.4f}" for k, v in results["dev_metrics"].items())
    print(
        f"[glue] {name}: best epoch {results['best_epoch']}: {summary}; "
        f"EV_{EV_K} pooled {before[f'ev{EV_K}_in']:.3f} -> "
        f"{best_row[f'ev{EV_K}_in']:.3f}, after the normalization "
        f"{best_row[f'ev{EV_K}_out']:.3f}. Wrote {results_path}",
        flush=True,
    )
    keras.backend.clear_session()
    return results


def build_classifier(args, task, norm):
    """Builds the classifier: from `--preset`, or the built-in tiny BERT."""
    head = dict(
        num_classes=task.num_classes,
        normalization=None if norm == "none" else norm,
        momentum=args.momentum,
        epsilon=args.epsilon,
        beta=args.beta,
        bias_correction=args.bias_correction,
        dropout=args.dropout,
    )
    if not args.preset:
        tokenizer = keras_hub.models.BertTokenizer(
            vocabulary=glue.sample_vocabulary_path(), lowercase=True
        )
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=tokenizer.vocabulary_size(),
            max_sequence_length=args.max_sequence_length,
            **TINY_BERT,
        )
        preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
            tokenizer, sequence_length=args.max_sequence_length
        )
        return IsoBNBertTextClassifier(backbone, preprocessor=preprocessor, **head)
    classifier_cls = _classifier_class(args.preset)
    # The classifier first: its `from_preset` explains an unreachable preset.
    classifier = classifier_cls.from_preset(
        args.preset, preprocessor=None, **head
    )
    classifier.preprocessor = classifier_cls.preprocessor_cls.from_preset(
        args.preset, sequence_length=args.max_sequence_length
    )
    return classifier


def _classifier_class(preset):
    """The IsoBN classifier class of a preset's backbone (BERT if unknown)."""
    from keras_hub.src.utils.preset_utils import get_preset_loader

    try:
        backbone_cls = get_preset_loader(preset).check_backbone_class()
    except Exception:
        # Unreachable or not a preset: let `from_preset` raise its error.
        return IsoBNBertTextClassifier
    for classifier_cls in CLASSIFIERS:
        if issubclass(backbone_cls, classifier_cls.backbone_cls):
            return classifier_cls
    raise ValueError(
        f"The preset {preset!r} holds a {backbone_cls.__name__}; "
        "recipes/glue.py fine-tunes BERT and RoBERTa presets "
        "(BertBackbone, RobertaBackbone)."
    )


def _probed_layer(model):
    """The layer whose inputs and outputs EV_k is measured on."""
    if model.normalization is not None:
        return model.normalization
    return model.output_dropout  # Identity at inference: in == out.


@keras.saving.register_keras_serializable(package="keras_isobn_recipes")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """A linear warmup to a peak learning rate, then linear decay to 0.

    The schedule of BERT fine-tuning (`get_linear_schedule_with_warmup` of
    Hugging Face Transformers, used by the IsoBN authors).

    Args:
        peak_learning_rate: Float, the learning rate at the end of warmup.
        total_steps: Integer `>= 1`, the training steps; the rate is 0 from
            there on.
        warmup_steps: Integer `>= 0`, the steps of the linear warmup from 0.

    Example:

    >>> schedule = WarmupLinearDecay(1e-3, total_steps=100, warmup_steps=10)
    >>> [round(float(schedule(step)), 6) for step in (0, 5, 10, 55, 100)]
    [0.0, 0.0005, 0.001, 0.0005, 0.0]
    """

    def __init__(self, peak_learning_rate, total_steps, warmup_steps):
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                "Need total_steps >= 1 and 0 <= warmup_steps <= total_steps. "
                f"Received: total_steps={total_steps}, "
                f"warmup_steps={warmup_steps}"
            )
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        warmup = step / max(self.warmup_steps, 1)
        decay = (self.total_steps - step) / max(
            self.total_steps - self.warmup_steps, 1
        )
        factor = keras.ops.where(step < self.warmup_steps, warmup, decay)
        return self.peak_learning_rate * keras.ops.clip(factor, 0.0, 1.0)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
        }


def make_optimizer(args, total_steps):
    """AdamW as in BERT fine-tuning: no weight decay on LayerNorm and biases."""
    optimizer = keras.optimizers.AdamW(
        learning_rate=WarmupLinearDecay(
            args.learning_rate,
            total_steps=total_steps,
            warmup_steps=int(args.warmup_ratio * total_steps),
        ),
        weight_decay=args.weight_decay,
        epsilon=args.adam_epsilon,
    )
    # By variable name: biases, and LayerNorm's scale and offset.
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


class DevMetrics(keras.callbacks.Callback):
    """Puts the whole-dev-set GLUE metrics in `logs` at each epoch end.

    The dev set is predicted in full and scored by
    `keras_isobn.glue.compute_metrics` (not averaged over batches). The keys
    are `val_<metric>` for the first dev split (`val_mcc`, `val_pearson`,
    ...) and `val_mismatched_<metric>` for MNLI's mismatched one. It also
    logs `learning_rate` (the optimizer's, at the epoch end) and
    `epoch_time_s` (the seconds of the epoch with its evaluation).
    Place it first in `callbacks` so that the others see its keys.

    Every batch is full: the inputs are padded to a multiple of
    `batch_size` by repeating their first examples, whose predictions are
    dropped. So one compiled step serves every batch, and the batches split
    evenly across data-parallel replicas.

    Args:
        task: The `GlueTask`.
        dev_splits: List of `GlueSplit`, the dev sets (their labels).
        inputs: List of the model inputs of each dev set (dicts of NumPy
            arrays of token ids, see `tokenize`), in the same order.
        batch_size: Integer, the prediction batch size.
    """

    def __init__(self, task, dev_splits, inputs, batch_size):
        super().__init__()
        self.task = task
        self.dev_splits = dev_splits
        self.batch_size = batch_size
        self.inputs = [
            keras.tree.map_structure(
                lambda array, n=len(split): np.resize(
                    array, (n + (-n) % batch_size,) + array.shape[1:]
                ),
                split_inputs,
            )
            for split, split_inputs in zip(dev_splits, inputs)
        ]
        self._epoch_start = None
        self.predictions = {}

    def evaluate(self, model=None):
        """Predicts the dev sets and returns their metrics, by log key.

        The predictions are kept in `self.predictions`, by split name.
        """
        model = self.model if model is None else model
        logs = {}
        for index, (split, inputs) in enumerate(
            zip(self.dev_splits, self.inputs)
        ):
            prefix = "val_" if index == 0 else (
                "val_" + split.split.replace("validation_", "") + "_"
            )
            predictions = model.predict(
                inputs, batch_size=self.batch_size, verbose=0
            )
            predictions = np.asarray(predictions, "float32")[: len(split)]
            self.predictions[split.split] = predictions
            scores = glue.compute_metrics(self.task, split.labels, predictions)
            logs.update({prefix + key: value for key, value in scores.items()})
        return logs

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        logs.update(self.evaluate())
        learning_rate = self.model.optimizer.learning_rate
        logs["learning_rate"] = float(keras.ops.convert_to_numpy(learning_rate))
        logs["epoch_time_s"] = time.time() - self._epoch_start


class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """`EarlyStopping` that continues counting from the epochs already run.

    Args:
        epochs_done: List of dicts, the logs of the epochs run before an
            interruption (the rows of `epochs.csv`, with an `"epoch"` key).
        **kwargs: `keras.callbacks.EarlyStopping` arguments.
    """

    def __init__(self, epochs_done, **kwargs):
        super().__init__(**kwargs)
        self.epochs_done = epochs_done

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        for row in self.epochs_done:
            self.on_epoch_end(int(row["epoch"]), dict(row))


def _finished(epochs, monitor, args):
    """Whether the logged epochs end the training (all run, or no patience)."""
    if len(epochs) >= args.epochs:
        return True
    if args.patience is None or not epochs:
        return False
    best = max(range(len(epochs)), key=lambda i: epochs[i][monitor])
    return len(epochs) - 1 - best >= args.patience


def _best(epochs, monitor):
    values = [row[monitor] for row in epochs if math.isfinite(row[monitor])]
    return max(values) if values else None


def read_epochs(csv_path):
    """The rows of an `epochs.csv`, as dicts of floats, one per epoch.

    A row logged twice (an epoch rerun after an interruption between its
    log and its backup) is kept once, the last time.
    """
    if not os.path.exists(csv_path):
        return []
    rows = {}
    with open(csv_path, newline="") as file:
        for row in csv.DictReader(file):
            values = {key: float(value) for key, value in row.items() if value}
            rows[int(values["epoch"])] = values
    return [rows[epoch] for epoch in sorted(rows)]


def package_versions():
    """The versions of the software a run used."""
    versions = {
        "python": platform.python_version(),
        "keras_isobn": keras_isobn.__version__,
        "keras": keras.__version__,
        "keras_hub": keras_hub.__version__,
        "tensorflow": tf.__version__,
        "numpy": np.__version__,
        "backend": keras.backend.backend(),
    }
    backend = sys.modules.get(keras.backend.backend())
    versions["backend_version"] = getattr(backend, "__version__", None)
    return versions


def _hyperparameters(args):
    names = (
        "max_sequence_length", "batch_size", "learning_rate", "epochs",
        "warmup_ratio", "weight_decay", "adam_epsilon", "patience",
        "train_limit", "momentum", "epsilon", "beta", "bias_correction",
        "dropout", "mixed_precision", "jit_compile", "distribution",
    )  # fmt: skip
    return {name: getattr(args, name) for name in names}


def _tensorboard(log_dir):
    """`[TensorBoard(log_dir)]`, or `[]` if TensorBoard is not installed."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        print("[glue] TensorBoard is not installed: no TensorBoard logs "
              "(`pip install tensorboard`).")
        return []
    return [keras.callbacks.TensorBoard(log_dir, write_graph=False)]


def _gpu_visible():
    if keras.backend.backend() == "torch":  # No `list_devices` there.
        import torch

        return torch.cuda.is_available()
    return any(
        not device.lower().startswith("cpu")
        for device in keras.distribution.list_devices()
    )


def _save_json(path, content, overwrite):
    if os.path.exists(path) and not overwrite:
        return
    temporary = path + ".tmp"
    with open(temporary, "w") as file:
        json.dump(content, file, indent=2)
    os.replace(temporary, path)


if __name__ == "__main__":
    main()
