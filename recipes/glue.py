"""Fine-tunes a KerasHub text classifier on GLUE with IsoBN, as in the paper.

`python recipes/glue.py` trains a small built-in BERT offline on the GLUE
sample of `keras_isobn.glue` (SST-2, STS-B) with no normalization,
BatchNormalization and IsoBN; `--preset` and `--task` give the paper's
setting. Each run writes `results.json`, `epochs.csv`, `best.keras` (with
its preprocessor), `dev_predictions.npz`, `logs/` and, while it trains,
`backup/` to `<output-dir>/<task>/<norm>/seed-<n>/`. A killed run resumes
when the same command runs again, and ends as if never stopped.
"""

import argparse
import contextlib
import csv
import functools
import gc
import json
import os
import platform
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Run as a command, the recipe imports Keras, KerasHub and the backend with
# Python's cyclic garbage collector off, then freezes (`gc.freeze`) the
# millions of objects they made, which live to the end, and freezes all
# again before the interpreter exits: the collector would otherwise go over
# them again and again, and once more at exit (2-4 s of every job).
if __name__ == "__main__":
    gc.disable()

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_isobn  # noqa: E402
import report  # noqa: E402  (recipes/report.py, next to this file)
from keras_isobn import distribution  # noqa: E402
from keras_isobn import glue  # noqa: E402
from keras_isobn import models  # noqa: E402
from keras_isobn.callbacks import WholeSetMetrics  # noqa: E402
from keras_isobn.optimizers import fine_tuning_adamw  # noqa: E402
from keras_isobn.resume import ResumableEarlyStopping  # noqa: E402
from keras_isobn.resume import SeededBatches  # noqa: E402
from keras_isobn.resume import TrainingCheckpoint  # noqa: E402
from keras_isobn.resume import atomic_write  # noqa: E402
from keras_isobn.resume import exclusive  # noqa: E402

if __name__ == "__main__":
    gc.freeze()
    gc.enable()

NORMS = ("none", "batchnorm", "isobn", "isobn-unit")  # -unit: unit variance
EV_K = 3
TORCH_GPU_HINT = (
    "Note: Keras runs PyTorch eagerly; on a GPU use KERAS_BACKEND=jax "
    "(MiniLM trained 20x faster on an H200; README, \"On a GPU\")."
)
# With `--preset`: the authors' train.py (INK-USC/IsoBN). Without: the
# small built-in BERT (2 layers, 64 wide) on the shipped sample.
PAPER_DEFAULTS = {
    "task": None, "norm": ["isobn"], "max_sequence_length": 256,
    "batch_size": 16, "learning_rate": 5e-5, "epochs": 10,
    "seeds": [1, 2, 3, 4, 5],
}  # fmt: skip
SAMPLE_DEFAULTS = {
    "task": ["sst2", "stsb"], "norm": list(NORMS[:3]), "max_sequence_length": 40,
    "batch_size": 32, "learning_rate": 3e-3, "epochs": 4, "seeds": [1],
}  # fmt: skip
HYPERPARAMETERS = (
    "max_sequence_length", "batch_size", "learning_rate", "epochs",
    "warmup_ratio", "weight_decay", "adam_epsilon", "patience",
    "train_limit", "momentum", "epsilon", "beta", "bias_correction",
    "dropout", "mixed_precision", "jit_compile", "distribution",
)  # fmt: skip


def parse_args(argv=None):
    """Parses the command line; `None` defaults take the mode's values."""
    parser = argparse.ArgumentParser(
        prog="python recipes/glue.py",
        description="Fine-tune a KerasHub text classifier on GLUE with no "
        "normalization, BatchNormalization or IsoBN on the pooled output. "
        "Without --preset: a small built-in BERT on the GLUE-format sample "
        "shipped in keras_isobn (offline, minutes on a CPU; its scores say "
        "nothing about GLUE). [Defaults] are with --preset / without.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--task", nargs="+", help=f"{', '.join(glue.TASKS)}. [- / sst2 stsb]")
    add("--preset", help="KerasHub preset of an ALBERT, BERT, DeBERTaV3, "
        "DistilBERT, FNet, RoBERTa, RoFormerV2 or XLM-RoBERTa: a name, a "
        "kaggle:// or hf:// handle, or a local directory (a KerasHub preset "
        "or a Hugging Face checkpoint). Default: the small built-in BERT.")
    add("--data-dir", help="GLUE TSV folder (CoLA/, ...). [TFDS / sample]")
    add("--tfds-data-dir", help="TFDS data directory.")
    add("--norm", nargs="+", choices=NORMS, help="One run each. [isobn / all but isobn-unit]")
    add("--momentum", type=float, default=0.05, help="New batch's weight.")
    add("--epsilon", type=float, default=1e-3, help="IsoBN's epsilon.")
    add("--beta", type=float, default=0.5, help="IsoBN's strength.")
    add("--bias-correction", action="store_true",
        help="Bias-correct IsoBN's moving statistics (off in the paper).")
    add("--dropout", type=float, default=0.1, help="Dropout before logits.")
    add("--max-sequence-length", type=int, help="[256 / 40]")
    add("--epochs", type=int, help="Training epochs. [10 / 4]")
    add("--batch-size", type=int, help="Global batch size. [16 / 32]")
    add("--learning-rate", type=float, help="Peak, AdamW. [5e-5 / 3e-3]")
    add("--warmup-ratio", type=float, default=0.06, help="Share of the "
        "steps with a linear warmup; then linear decay to 0.")
    add("--weight-decay", type=float, default=0.0, help="AdamW weight decay "
        "(never on LayerNorm weights and biases).")
    add("--adam-epsilon", type=float, default=1e-6, help="AdamW's epsilon.")
    add("--patience", type=int, help="Stop after this many epochs without a "
        "better dev score. Default: never (the paper keeps the best epoch).")
    add("--seeds", nargs="+", type=int, help="One run each. [1 2 3 4 5 / 1]")
    add("--train-limit", type=int, help="Keep the first N training examples "
        "of a fixed shuffle (the same for every seed and norm).")
    add("--output-dir", default="runs/glue", help="<task>/<norm>/seed-<n>/.")
    add("--mixed-precision", action=argparse.BooleanOptionalAction,
        help="Train in mixed_float16. Default: on when a GPU is visible.")
    add("--jit-compile", action=argparse.BooleanOptionalAction, help="XLA. "
        "Default: Keras's 'auto', off for the built-in BERT on TensorFlow "
        "(XLA compiles it for longer than it trains).")
    add("--distribution", choices=("none", "data_parallel"), default="none",
        help="data_parallel: split each batch across all accelerators "
        "(TensorFlow or JAX).")
    add("--no-report", action="store_true", help="Write no report.")
    add("--verbose", type=int, default=2, help="Keras fit verbosity.")
    args = parser.parse_args(argv)

    defaults = PAPER_DEFAULTS if args.preset else SAMPLE_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        args.task = [glue.get_task(name).name for name in args.task or ()]
    except ValueError as error:
        parser.error(str(error))
    if not args.task:
        parser.error("--task is required with --preset, e.g. --task rte. "
                     "Known tasks: " + ", ".join(glue.TASKS))
    backend = keras.backend.backend()
    if args.jit_compile is None:
        tiny_on_tf = not args.preset and backend == "tensorflow"
        args.jit_compile = False if tiny_on_tf else "auto"
    if args.data_dir is None and not args.preset:
        args.data_dir = glue.sample_data_dir()
    for name in ("epochs", "batch_size", "max_sequence_length", "train_limit",
                 "patience"):  # fmt: skip
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1.")
    if not args.learning_rate > 0 or not 0 <= args.warmup_ratio < 1:
        parser.error("--learning-rate must be > 0, --warmup-ratio in [0, 1).")
    if args.distribution != "none" and backend == "torch":
        parser.error(f"--distribution {args.distribution} is not supported "
                     "on the torch backend (single-process training only): "
                     "use KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax.")
    gpu = _gpu_visible()
    if args.mixed_precision is None:
        args.mixed_precision = gpu
    if gpu and backend == "torch":
        print(TORCH_GPU_HINT, file=sys.stderr, flush=True)
    args.seeds = list(dict.fromkeys(args.seeds))
    args.norm = list(dict.fromkeys(args.norm))
    return args


def main(argv=None):
    """Runs every (task, norm, seed) of the command line, then the report.

    Returns:
        The results dicts (as in `results.json`), one per run, those of
        finished runs skipped included.
    """
    args = parse_args(argv)
    all_results = []
    with contextlib.ExitStack() as stack:
        # Fail fast, before any training, with one message: another run on
        # --output-dir, an unreachable or unsupported preset, missing or
        # malformed data, TFDS offline.
        try:
            stack.enter_context(exclusive(args.output_dir))
            if args.preset:
                models.text_classifier_from_preset(
                    args.preset, 2, load_weights=False
                )
            tasks = [glue.get_task(name) for name in args.task]
            datasets = [load_data(task, args) for task in tasks]
        except (OSError, RuntimeError, ValueError) as error:
            sys.exit(f"python recipes/glue.py: error: {error}")
        for task, data in zip(tasks, datasets):
            for norm in args.norm:
                for seed in args.seeds:
                    all_results.append(run(args, task, data, norm, seed))
    if not args.no_report:
        report_dir = os.path.join(args.output_dir, "report")
        report.main([args.output_dir, "--output", report_dir])
    return all_results


def load_data(task, args):
    """The training split (limited to `--train-limit`) and the dev splits."""
    print(f"[glue] Loading {task.name} from {args.data_dir or 'TFDS'}")
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


def run(args, task, data, norm, seed):
    """Trains one (task, norm, seed), or resumes it, and writes its results."""
    name = f"{task.name}/{norm}/seed-{seed}"
    seed_dir = os.path.join(args.output_dir, task.name, norm, f"seed-{seed}")
    path = functools.partial(os.path.join, seed_dir)
    if os.path.exists(path("results.json")):
        print(f"[glue] {name}: done already; skipped.")
        with open(path("results.json")) as file:
            return json.load(file)
    start = time.time()
    monitor, csv_path = f"val_{task.primary_metric}", path("epochs.csv")
    checkpoint = TrainingCheckpoint(path("backup"), monitor, csv_path=csv_path)
    resuming = os.path.exists(checkpoint.state_path)
    if not resuming and os.path.isdir(seed_dir):
        # No completed epoch: start afresh, keeping nothing half-written.
        print(f"[glue] {name}: removing {seed_dir}, stopped in epoch 1.")
        shutil.rmtree(seed_dir)
    os.makedirs(seed_dir, exist_ok=True)

    keras.utils.set_random_seed(seed)
    kind = None if args.distribution == "none" else args.distribution
    policy = "mixed_float16" if args.mixed_precision else None
    scope = distribution.data_parallel_scope(kind)
    with _dtype_policy(policy), scope as replicas:
        if args.batch_size % replicas:
            raise ValueError(f"--batch-size {args.batch_size} must be a "
                             f"multiple of the {replicas} replicas.")
        model = build_classifier(args, task, norm)
        if kind is not None:
            distribution.synchronize_statistics(model)
        steps = len(data["train"]) // args.batch_size * args.epochs
        model.compile(optimizer=fine_tuning_adamw(
            args.learning_rate, total_steps=steps, epsilon=args.adam_epsilon,
            warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
        ), jit_compile=args.jit_compile)  # fmt: skip
        # Token ids, once per task: all splits in one (traced) pipeline.
        if "inputs" not in data:
            splits = [data["train"], *data["dev"]]
            tokens = models.tokenize(model, keras.tree.map_structure(
                lambda *f: np.concatenate(f), *[s.features for s in splits]))
            ends = np.cumsum([len(s) for s in splits])[:-1]
            pieces = [dict(zip(tokens, arrays)) for arrays in
                      zip(*[np.split(a, ends) for a in tokens.values()])]
            data["inputs"] = {"train": pieces[0], "dev": pieces[1:]}
        inputs = data["inputs"]
        preprocessor, model.preprocessor = model.preprocessor, None
        metric_fn = functools.partial(glue.compute_metrics, task)
        # `val_<metric>`; `val_mismatched_<metric>` for MNLI's second split.
        # EV_k of the first dev split, before the logits, in the same pass.
        # No normalization: of the dropout's input (the pooled output).
        prefixes = ["val_"] + [f"val_{s.split[11:]}_" for s in data["dev"][1:]]
        # Batches cut to their longest sentence, to a multiple of 8 positions
        # (of 32 on JAX, which compiles a step per length).
        trim = 32 if keras.backend.backend() == "jax" else 8
        layer = model.normalization or model.output_dropout
        dev_metrics = [
            WholeSetMetrics(x, split.labels, metric_fn, -(-32 // args.batch_size)
                            * args.batch_size, prefix, trim, ev_layer=layer,
                            ev_k=EV_K if prefix == "val_" else None)
            for split, x, prefix in zip(data["dev"], inputs["dev"], prefixes)
        ]  # fmt: skip
        done = checkpoint.restore(model)
        what = f"resuming after epoch {len(done)}" if resuming else "training"
        print(f"[glue] {name}: {what} in {seed_dir}", flush=True)
        best = {}  # The dev predictions of the best epoch, if run here.
        if not checkpoint.finished(args.epochs, args.patience):
            fit(args, model, data, seed, checkpoint, dev_metrics, path, best)
        checkpoint.restore_best(model)
        if not best:  # Its epoch ran before a resume: predict again.
            best = {m.prefix: m.evaluate(model) and m.predictions
                    for m in dev_metrics}  # fmt: skip
        model.preprocessor = preprocessor  # Ready for raw strings.
        atomic_write(path("best.keras"), model.save)
        out = {s.split: best[m.prefix] for s, m in zip(data["dev"], dev_metrics)}
        atomic_write(path("dev_predictions.npz"), lambda p: np.savez(p, **out))

    epochs = checkpoint.epochs
    best_row = epochs[checkpoint.best_epoch()]
    final = {k: v for k, v in best_row.items() if k.startswith("val_")}
    with open(path("ev_before.json")) as file:
        before = json.load(file)
    results = {
        "task": task.name, "group": task.group,
        "preset": args.preset or "builtin-tiny-bert",
        "norm": norm, "seed": seed,
        "data": args.data_dir or task.tfds_name,
        "train_examples": len(data["train"]),
        "dev_examples": {split.split: len(split) for split in data["dev"]},
        "hyperparameters": {k: getattr(args, k) for k in HYPERPARAMETERS},
        "replicas": replicas,
        "primary_metric": task.primary_metric,
        "best_epoch": int(best_row["epoch"]) + 1,
        "epochs_run": len(epochs),
        "dev_metrics": {k[len("val_"):]: v for k, v in final.items()},
        "ev": {"k": EV_K, **{
            when: {side: row[f"ev{EV_K}_{side}"] for side in ("in", "out")}
            for when, row in (("before", before), ("after", best_row))
        }},  # fmt: skip
        "epochs": epochs,
        "train_time_s": float(sum(row["epoch_time_s"] for row in epochs)),
        "wall_time_s": time.time() - start,
        "resumed": resuming,
        "versions": package_versions(),
    }
    atomic_write(path("results.json"), json.dumps(results, indent=2))
    shutil.rmtree(path("backup"))
    scores = ", ".join(f"{k} {v:.4f}" for k, v in final.items())
    print(f"[glue] {name}: best epoch {results['best_epoch']}: {scores}; "
          f"EV_{EV_K} {results['ev']}. Wrote {path('results.json')}")
    keras.backend.clear_session()
    return results


def fit(args, model, data, seed, checkpoint, dev_metrics, path, best):
    """Fits from the checkpoint's epoch on, saving it at each epoch end."""
    inputs, epoch_start = data["inputs"], []
    callbacks = [
        *dev_metrics,
        keras.callbacks.LambdaCallback(
            # EV_k before fine-tuning, kept from the first attempt.
            on_train_begin=lambda logs: os.path.exists(path("ev_before.json"))
            or atomic_write(path("ev_before.json"), json.dumps(
                {k: v for k, v in dev_metrics[0].evaluate(model).items()
                 if k.startswith("ev")}
            )),
            on_epoch_begin=lambda epoch, logs: epoch_start.append(time.time()),
            on_epoch_end=lambda epoch, logs: logs.update(
                learning_rate=keras.ops.convert_to_numpy(
                    model.optimizer.learning_rate
                ),
                epoch_time_s=time.time() - epoch_start[-1],
            ),
        ),  # fmt: skip
        ResumableEarlyStopping(
            checkpoint.epochs, monitor=checkpoint.monitor, mode="max",
            patience=args.patience or args.epochs,
        ),  # fmt: skip
        checkpoint,
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: (
            checkpoint.best_epoch() == epoch and best.update(
                {m.prefix: m.predictions for m in dev_metrics}))),
        keras.callbacks.TensorBoard(path("logs"), write_graph=False),
    ]
    batches = SeededBatches(
        inputs["train"], data["train"].labels, batch_size=args.batch_size,
        seed=seed, epochs=args.epochs, initial_epoch=checkpoint.initial_epoch,
        trim_padding=dev_metrics[0].trim_padding,
    )  # fmt: skip
    model.fit(
        batches.as_tf_dataset(), epochs=args.epochs,
        initial_epoch=checkpoint.initial_epoch,
        steps_per_epoch=batches.steps_per_epoch, shuffle=False,
        callbacks=callbacks, verbose=args.verbose,
    )  # fmt: skip


def build_classifier(args, task, norm):
    """The classifier: from `--preset`, or the built-in small BERT."""
    head = {k: getattr(args, k) for k in ("momentum", "epsilon", "beta",
                                          "bias_correction", "dropout")}
    head["normalization"] = {"none": None, "isobn-unit": "isobn"}.get(norm, norm)
    if norm == "isobn-unit":
        head["output_variance"] = "unit"
    if args.preset:
        return models.text_classifier_from_preset(
            args.preset, task.num_classes, args.max_sequence_length, **head
        )
    return models.small_bert_text_classifier(
        glue.sample_vocabulary_path(), task.num_classes,
        args.max_sequence_length, **head,
    )  # fmt: skip


def package_versions():
    """The versions of the software a run used."""
    names = ("keras_isobn", "keras", "keras_hub", "tensorflow", "numpy")
    versions = {name: sys.modules[name].__version__ for name in names}
    backend = keras.backend.backend()
    return {"python": platform.python_version(), **versions, "backend": backend,
            "backend_version": sys.modules[backend].__version__}  # fmt: skip


def _gpu_visible():
    if keras.backend.backend() == "torch":  # No `list_devices` there.
        return sys.modules["torch"].cuda.is_available()
    devices = keras.distribution.list_devices()
    return any(not device.lower().startswith("cpu") for device in devices)


@contextlib.contextmanager
def _dtype_policy(name):
    """Sets Keras's global dtype policy (if `name`) for the context."""
    previous = keras.config.dtype_policy()
    if name:
        keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


if __name__ == "__main__":
    main()
    gc.freeze()
