"""Fine-tunes a KerasHub text classifier on GLUE with IsoBN, as in the paper.

`python recipes/glue.py` trains a small built-in BERT offline on the GLUE
sample of `keras_isobn.glue` (SST-2, STS-B) with each `--norm`; `--preset`
and `--task` give the paper's setting. Each run writes `results.json`,
`epochs.csv`, `best.keras`, `dev_predictions.npz`, `logs/` and `backup/`
to `<output-dir>/<task>/<norm>/seed-<n>/`, each file with its checksum.
A killed run resumes exactly when the same command runs again; a damaged
file is set aside and made again, or the run stops with one line.
Guide: docs/guides/glue_recipe.md.

From Python, `main(argv)` runs a command line and returns the results of
its runs, e.g. `main(["--task", "rte", "--preset", "bert_base_en"])`.
"""

import argparse
import contextlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ logs.

import keras_isobn  # Before Keras: a quiet, quick start (`runtime`).
import keras
import numpy as np

from keras_isobn import distribution
from keras_isobn import glue
from keras_isobn import models
from keras_isobn.batching import SeededBatches
from keras_isobn.callbacks import EpochLogs
from keras_isobn.callbacks import ResumableEarlyStopping
from keras_isobn.callbacks import WholeSetMetrics
from keras_isobn.files import DamagedFileError
from keras_isobn.files import DiskFullError
from keras_isobn.files import exclusive
from keras_isobn.files import package_versions
from keras_isobn.glue import report
from keras_isobn.mixed_precision import dtype_policy_scope
from keras_isobn.optimizers import fine_tuning_adamw
from keras_isobn.run_directory import RunDirectory

NORMS = ("none", "batchnorm", "isobn", "isobn-unit")  # -unit: unit variance
EV_K = 3
TORCH_GPU_HINT = (
    "Note: Keras runs PyTorch eagerly; on a GPU use KERAS_BACKEND=jax "
    "(MiniLM trained 20x faster on an H200; docs/guides/gpu.md)."
)
SAMPLE_CAVEAT = (
    "[glue] The sample shows that the recipe runs, not whether IsoBN helps: "
    "its BERT is trained from scratch, not pretrained into the anisotropic "
    "[CLS] IsoBN is made for; see experiments/anisotropy_lab/."
)
# With --preset: the authors' train.py (INK-USC/IsoBN); else the sample's.
PAPER_DEFAULTS = dict(
    task=None, norm=["isobn"], max_sequence_length=256, batch_size=16,
    learning_rate=5e-5, epochs=10, seeds=[1, 2, 3, 4, 5],
)
# Not isobn-unit: the sample's untrained BERT pools outputs of std ~3e-4,
# which unit variance scales ~4,000 times; with the slowly moving statistics
# the first steps blow up (experiments/anisotropy_lab/: on a pretrained one).
SAMPLE_DEFAULTS = dict(
    task=["sst2", "stsb"], norm=["none", "batchnorm", "isobn"],
    max_sequence_length=40, batch_size=32, learning_rate=3e-3, epochs=4,
    seeds=[1],
)
PRESET_HELP = (
    "KerasHub preset of an ALBERT, BERT, DeBERTaV3, DistilBERT, FNet, "
    "RoBERTa, RoFormerV2 or XLM-RoBERTa: a name, a kaggle:// or hf:// "
    "handle, or a local directory (a KerasHub preset or a Hugging Face "
    "checkpoint). Default: the small built-in BERT."
)
POSITIVE = ("epochs", "batch_size", "max_sequence_length", "train_limit",
            "patience")
KINDS = ("none", "data_parallel", "multi_worker")
# What a finished run leaves; one damaged is made again by running again.
OUTPUTS = ("epochs.csv", "ev_before.json", "dev_predictions.npz", "best.keras")
DISTRIBUTION_HELP = (
    "data_parallel: split each batch across all accelerators (TensorFlow or "
    "JAX); multi_worker: across those of the processes of a cluster (JAX; "
    "the default when KERAS_DISTRIBUTION_* are set)."
)
HYPERPARAMETERS = (
    *("max_sequence_length", "batch_size", "learning_rate", "epochs"),
    *("warmup_ratio", "weight_decay", "adam_epsilon", "patience"),
    *("train_limit", "momentum", "epsilon", "beta", "bias_correction"),
    *("dropout", "mixed_precision", "jit_compile", "distribution"),
)


def parse_args(argv=None):
    """The command line; `None` defaults take the values of the mode."""
    parser = argparse.ArgumentParser(
        prog="python recipes/glue.py",
        description="Fine-tune a KerasHub text classifier on GLUE with or "
        "without BatchNormalization or IsoBN on the pooled output. Without "
        "--preset: a small built-in BERT on the GLUE-format sample shipped in "
        "keras_isobn (offline, minutes on a CPU; its scores say nothing about "
        "GLUE). [Defaults] are with --preset / without.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--task", nargs="+", help=f"{', '.join(glue.TASKS)}. [- / sst2 stsb]")
    add("--preset", help=PRESET_HELP)
    add("--data-dir", help="GLUE TSV folder (CoLA/, ...). [TFDS / sample]")
    add("--tfds-data-dir", help="TFDS data directory.")
    add(
        "--norm",
        nargs="+",
        choices=NORMS,
        help="One run each. [isobn / the 3 others]",
    )
    add("--momentum", type=float, default=0.05, help="New batch's weight.")
    add("--epsilon", type=float, default=1e-3, help="IsoBN's epsilon.")
    add("--beta", type=float, default=0.5, help="IsoBN's strength.")
    add(
        "--bias-correction",
        action="store_true",
        help="Of IsoBN's moving statistics (off in the paper).",
    )
    add("--dropout", type=float, default=0.1, help="Dropout before logits.")
    add("--max-sequence-length", type=int, help="[256 / 40]")
    add("--epochs", type=int, help="Training epochs. [10 / 4]")
    add("--batch-size", type=int, help="Global batch size. [16 / 32]")
    add("--learning-rate", type=float, help="Peak, AdamW. [5e-5 / 3e-3]")
    add(
        "--warmup-ratio",
        type=float,
        default=0.06,
        help="Share of the steps of linear warmup; then linear decay to 0.",
    )
    add(
        "--weight-decay",
        type=float,
        default=0.0,
        help="AdamW's (never on LayerNorm weights and biases).",
    )
    add("--adam-epsilon", type=float, default=1e-6, help="AdamW's epsilon.")
    add(
        "--patience",
        type=int,
        help="Stop after this many epochs without a "
        "better dev score. Default: never (the paper keeps the best epoch).",
    )
    add("--seeds", nargs="+", type=int, help="One run each. [1 2 3 4 5 / 1]")
    add(
        "--train-limit",
        type=int,
        help="Keep the first N training examples "
        "of a fixed shuffle (the same for every seed and norm).",
    )
    add("--output-dir", default="runs/glue", help="<task>/<norm>/seed-<n>/.")
    add(
        "--mixed-precision",
        nargs="?",
        const="float16",
        choices=("float16", "bfloat16"),
        help="Train in mixed_float16, or mixed_bfloat16 (CPUs with "
        "AVX512_BF16 or AMX); --no-mixed-precision: float32. Default: "
        "float16 when a GPU is visible, else float32.",
    )
    add("--no-mixed-precision", dest="mixed_precision", action="store_false")
    add(
        "--jit-compile",
        action=argparse.BooleanOptionalAction,
        help="XLA. Default: 'auto', off for the built-in BERT on "
        "TensorFlow (XLA compiles it for longer than it trains).",
    )
    add("--distribution", choices=KINDS, help=DISTRIBUTION_HELP)
    add(
        "--restart",
        action="store_true",
        help="Start afresh the runs not finished (e.g. whose saved states "
        "are all damaged); their folders are kept, renamed "
        "<seed-n>.restarted.",
    )
    add("--no-report", action="store_true", help="Write no report.")
    add("--verbose", type=int, default=2, help="Keras fit verbosity.")
    args = parser.parse_args(argv)
    for name, value in vars(args).items():  # 3.11 parses `--epochs=--` to [].
        if value == []:
            parser.error(f"--{name.replace('_', '-')} needs a value.")

    defaults = PAPER_DEFAULTS if args.preset else SAMPLE_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        args.task = [glue.get_task(name).name for name in args.task or ()]
    except ValueError as error:
        parser.error(str(error))
    if not args.task:
        parser.error(
            "--task is required with --preset, e.g. --task rte. "
            "Known tasks: " + ", ".join(glue.TASKS)
        )
    for name in POSITIVE:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1.")
    if not args.learning_rate > 0 or not 0 <= args.warmup_ratio < 1:
        parser.error("--learning-rate must be > 0, --warmup-ratio in [0, 1).")
    if args.data_dir is None and not args.preset:
        args.data_dir = glue.sample_data_dir()
    if args.jit_compile is None:  # XLA: not for the small BERT on TF.
        tiny_on_tf = not args.preset and keras.backend.backend() == "tensorflow"
        args.jit_compile = False if tiny_on_tf else "auto"
    args.seeds = list(dict.fromkeys(args.seeds))
    args.norm = list(dict.fromkeys(args.norm))
    return args


def prepare_devices(args):
    """Joins the cluster of `--distribution` and picks mixed precision.

    Before anything is computed: JAX joins a cluster, and picks its cache.
    """
    keras_isobn.runtime.reuse_freed_memory()  # Every step's tensors: reused.
    keras_isobn.runtime.cache_compilations()  # JAX: steps kept on disk.
    backend = keras.backend.backend()
    cluster = distribution.cluster_environment()
    if args.distribution is None:
        args.distribution = "multi_worker" if cluster else "none"
    if args.distribution != "none" and backend == "torch":
        raise distribution.unsupported_backend_error(
            f"--distribution {args.distribution}",
            "training is single-process on one device",
            "Use KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax.",
        )
    if args.distribution == "multi_worker":
        try:
            distribution.initialize_cluster(**cluster or {})
        except ValueError as error:
            raise ValueError(f"--distribution multi_worker: {error}") from None
    gpu = distribution.accelerator_visible()
    if args.mixed_precision is None:
        args.mixed_precision = "float16" if gpu else False
    if gpu and backend == "torch":
        print(TORCH_GPU_HINT, file=sys.stderr, flush=True)


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


def build_classifier(args, task, norm):
    """The classifier: from `--preset`, or the built-in small BERT."""
    head = {
        "normalization": {"none": None, "isobn-unit": "isobn"}.get(norm, norm),
        **{k: getattr(args, k) for k in ("momentum", "epsilon", "beta")},
        "bias_correction": args.bias_correction,
        "dropout": args.dropout,
    }
    if norm == "isobn-unit":
        head["output_variance"] = "unit"
    if args.preset:
        return models.text_classifier_from_preset(
            args.preset, task.num_classes, args.max_sequence_length, **head
        )
    return models.small_bert_text_classifier(
        glue.sample_vocabulary_path(),
        task.num_classes,
        args.max_sequence_length,
        **head,
    )


def dev_set_metrics(args, task, dev, inputs, model):
    """The metrics of each whole dev split, at every epoch end.

    `val_<metric>` (`val_mismatched_<metric>` for MNLI's second split) and,
    on the first split, EV_k around the layer before the logits (the
    normalization, or the dropout of a head without one). Batches are cut
    to their longest sentence, to a multiple of 8 positions; on JAX, which
    compiles a step per length, to at most 8 lengths.
    """
    batch_size = -(-32 // args.batch_size) * args.batch_size
    trim_padding = 8
    if keras.backend.backend() == "jax":
        trim_padding = max(8, -(-args.max_sequence_length // 8))
    return [
        WholeSetMetrics(
            x,
            split.labels,
            glue.metric_fn(task),
            batch_size,
            prefix="val_" if index == 0 else f"val_{split.split[11:]}_",
            trim_padding=trim_padding,
            ev_k=EV_K if index == 0 else None,
            ev_layer=model.normalization or model.output_dropout,
        )
        for index, (split, x) in enumerate(zip(dev, inputs))
    ]


class BestPredictions(keras.callbacks.Callback):
    """Keeps the dev predictions of the best epoch, not to predict again."""

    def __init__(self, checkpoint, dev_metrics):
        super().__init__()
        self.checkpoint = checkpoint
        self.dev_metrics = dev_metrics
        self.predictions = None

    def on_epoch_end(self, epoch, logs=None):  # After the checkpoint's.
        if self.checkpoint.best_epoch() == epoch:
            self.predictions = [m.predictions for m in self.dev_metrics]


def run(
    args, task, data, norm, seed, build_classifier=build_classifier, step=None
):
    """Trains one (task, norm, seed), or resumes it, and writes its results.

    In a cluster, every process runs it alike and the chief alone writes.

    Args:
        args: The command line, from `parse_args()` and `prepare_devices()`.
        task: The `glue.GlueTask`.
        data: The task's splits, from `load_data()`; the first run adds
            their token ids, `data["inputs"]`, for the next ones.
        norm: One of `NORMS`.
        seed: Integer, the seed of the weights, dropout and batch order.
        build_classifier: `build_classifier(args, task, norm)` returns the
            classifier. Defaults to the recipe's.
        step: Optional; `step(name)` returns a context manager entered
            around each step ("model", "tokenize", "compile", "restore",
            "fit", "evaluate", "save"), e.g. to time them.

    Returns:
        The results dict written to `results.json`.
    """
    step = step or (lambda name: contextlib.nullcontext())
    name = f"{task.name}/{norm}/seed-{seed}"
    run_dir = RunDirectory(
        os.path.join(args.output_dir, task.name, norm, f"seed-{seed}")
    )
    # A finished run is read back (its files checked: one damaged is set
    # aside, and the run is done again, deterministically, from scratch);
    # a run with a saved epoch resumes; one stopped in its first epoch
    # starts afresh, keeping nothing half-written.
    if (results := run_dir.load_json("results.json")) is not None:
        if not (damaged := run_dir.damaged(OUTPUTS)):
            print(f"[glue] {name}: done already; skipped.")
            return results
        print(f"[glue] {name}: {', '.join(damaged)} damaged: running again.")
    elif args.restart and (kept := run_dir.restart()):
        print(f"[glue] {name}: --restart: the old run is kept as {kept}.")
    start = time.time()
    checkpoint = run_dir.checkpoint(f"val_{task.primary_metric}")
    resuming = run_dir.start(checkpoint)
    keras.utils.set_random_seed(seed)
    kind = None if args.distribution == "none" else args.distribution
    policy = f"mixed_{args.mixed_precision}" if args.mixed_precision else None
    scope = distribution.data_parallel_scope(kind)
    with dtype_policy_scope(policy), scope as replicas:
        if args.batch_size % replicas:
            raise ValueError(f"--batch-size {args.batch_size} must be a "
                             f"multiple of the {replicas} replicas.")
        with step("model"):
            model = build_classifier(args, task, norm)
            if kind is not None:
                distribution.synchronize_statistics(model)

        # 1. Token ids, once per task (all splits in one traced pipeline).
        with step("tokenize"):
            if "inputs" not in data:
                splits = [data["train"], *data["dev"]]
                data["inputs"] = models.tokenize_splits(
                    model, [split.features for split in splits]
                )
        train_inputs, *dev_inputs = data["inputs"]
        preprocessor, model.preprocessor = model.preprocessor, None
        dev_metrics = dev_set_metrics(
            args, task, data["dev"], dev_inputs, model
        )

        # 2. The optimizer of BERT fine-tuning, and the last saved epoch.
        with step("compile"):
            steps = len(data["train"]) // args.batch_size * args.epochs
            optimizer = fine_tuning_adamw(
                args.learning_rate,
                total_steps=steps,
                epsilon=args.adam_epsilon,
                warmup_ratio=args.warmup_ratio,
                weight_decay=args.weight_decay,
            )
            model.compile(optimizer=optimizer, jit_compile=args.jit_compile)
        with step("restore"):
            # EV_k before fine-tuning: measured once, on the model as built
            # (again if its file is damaged), before any state is restored.
            if (ev_before := run_dir.load_json("ev_before.json")) is None:
                logs = dev_metrics[0].evaluate(model)  # In every process.
                ev_before = {k: v for k, v in logs.items() if k[:2] == "ev"}
                run_dir.save("ev_before.json", json.dumps(ev_before))
            done = checkpoint.restore(model)
        what = f"resuming after epoch {len(done)}" if resuming else "training"
        print(f"[glue] {name}: {what} in {run_dir.directory}", flush=True)

        # 3. Fit from there, saving each epoch.
        best = BestPredictions(checkpoint, dev_metrics)
        if not checkpoint.finished(args.epochs, args.patience):
            callbacks = [
                *dev_metrics,
                EpochLogs(),
                ResumableEarlyStopping(
                    checkpoint.epochs,
                    monitor=checkpoint.monitor,
                    mode="max",
                    patience=args.patience or args.epochs,
                ),
                checkpoint,
                best,
            ]
            if run_dir.write:  # The chief's TensorBoard logs.
                callbacks.append(
                    keras.callbacks.TensorBoard(
                        run_dir.path("logs"), write_graph=False
                    )
                )
            batches = SeededBatches(
                train_inputs,
                data["train"].labels,
                batch_size=args.batch_size,
                seed=seed,
                epochs=args.epochs,
                initial_epoch=checkpoint.initial_epoch,
                trim_padding=dev_metrics[0].trim_padding,
            )
            with step("fit"):
                model.fit(
                    batches.as_tf_dataset(),
                    epochs=args.epochs,
                    initial_epoch=checkpoint.initial_epoch,
                    steps_per_epoch=batches.steps_per_epoch,
                    shuffle=False,
                    callbacks=callbacks,
                    verbose=args.verbose,
                )

        # 4. The best epoch's model and dev predictions.
        checkpoint.restore_best(model)
        if best.predictions is None:  # That epoch ran before a resume.
            with step("evaluate"):
                for metrics in dev_metrics:
                    metrics.evaluate(model)
                best.predictions = [m.predictions for m in dev_metrics]
        with step("save"):
            model.preprocessor = preprocessor  # Ready for raw strings.
            run_dir.save("best.keras", model.save)
            splits = [split.split for split in data["dev"]]
            arrays = dict(zip(splits, best.predictions))
            run_dir.save("dev_predictions.npz", lambda p: np.savez(p, **arrays))

    # 5. The results of the best epoch (written by the chief).
    with step("save"):
        results = {
            **summary(args, task, data, norm, seed, checkpoint, ev_before),
            "replicas": replicas,
            "wall_time_s": time.time() - start,
            "resumed": resuming,
        }
        run_dir.save("results.json", json.dumps(results, indent=2))
        run_dir.finish()
    print_summary(name, results, run_dir)
    keras.backend.clear_session()
    return results


def summary(args, task, data, norm, seed, checkpoint, before):
    """The results of the best epoch, as `results.json` holds them."""
    epochs = checkpoint.epochs
    best = epochs[checkpoint.best_epoch()]
    return {
        "task": task.name,
        "group": task.group,
        "preset": args.preset or "builtin-tiny-bert",
        "norm": norm,
        "seed": seed,
        "data": args.data_dir or task.tfds_name,
        "train_examples": len(data["train"]),
        "dev_examples": {split.split: len(split) for split in data["dev"]},
        "hyperparameters": {k: getattr(args, k) for k in HYPERPARAMETERS},
        "processes": distribution.process_count(),
        "primary_metric": task.primary_metric,
        "best_epoch": int(best["epoch"]) + 1,
        "epochs_run": len(epochs),
        "dev_metrics": {
            k[len("val_") :]: v for k, v in best.items() if k.startswith("val_")
        },
        "ev": {
            "k": EV_K,
            **{
                when: {side: row[f"ev{EV_K}_{side}"] for side in ("in", "out")}
                for when, row in (("before", before), ("after", best))
            },
        },
        "epochs": epochs,
        "train_time_s": float(sum(row["epoch_time_s"] for row in epochs)),
        "versions": package_versions(),
    }


def print_summary(name, results, run_dir):
    scores = ", ".join(
        f"val_{k} {v:.4f}" for k, v in results["dev_metrics"].items()
    )
    ev = results["ev"]  # Entering ("in") and leaving the normalization.
    print(
        f"[glue] {name}: best epoch {results['best_epoch']}: {scores}; "
        f"EV_{EV_K} before -> after fine-tuning: pooled output "
        f"{ev['before']['in']:.3f} -> {ev['after']['in']:.3f}, normalized "
        f"{ev['before']['out']:.3f} -> {ev['after']['out']:.3f}. "
        f"Wrote {run_dir.path('results.json')}"
    )


def main(argv=None, *, build_classifier=build_classifier, step=None):
    """Runs every (task, norm, seed) of the command line, then the report.

    Args:
        argv: List of strings, the command line (`python recipes/glue.py
            --help`). Defaults to `sys.argv[1:]`.
        build_classifier: `build_classifier(args, task, norm)` returns the
            classifier of a run. Defaults to the recipe's.
        step: Optional; `step(name)` returns a context manager entered
            around each step: "data" (each task's), then those of `run()`.

    Returns:
        The results dicts (as in `results.json`), one per run, those of
        finished runs skipped included.
    """
    args = parse_args(argv)
    step = step or (lambda name: contextlib.nullcontext())
    all_results = []
    with contextlib.ExitStack() as stack:
        # Fail fast, before any training, with one message: no engine for
        # --distribution, another run on --output-dir (the chief holds the
        # lock for its cluster), an unreachable or unsupported preset,
        # missing data, TFDS offline.
        try:
            prepare_devices(args)
            # In a cluster, a process that dies stops the others (no hang).
            stack.enter_context(distribution.stop_cluster_on_error())
            if distribution.is_chief():
                stack.enter_context(exclusive(args.output_dir))
            if args.preset:  # Its config only: no weights downloaded.
                models.text_classifier_from_preset(args.preset, 2, None, False)
            tasks = [glue.get_task(name) for name in args.task]
            datasets = []
            for task in tasks:
                with step("data"):
                    datasets.append(load_data(task, args))
        except (OSError, RuntimeError, ValueError) as error:
            print(f"python recipes/glue.py: error: {error}", file=sys.stderr)
            sys.exit(1)
        try:
            for task, data in zip(tasks, datasets):
                for norm in args.norm:
                    for seed in args.seeds:
                        results = run(
                            args, task, data, norm, seed, build_classifier, step
                        )
                        all_results.append(results)
        except (DamagedFileError, DiskFullError) as error:  # Files it wrote.
            damaged = isinstance(error, DamagedFileError)
            hint = " Or run again with --restart." if damaged else ""
            message = f"python recipes/glue.py: error: {error}{hint}"
            print(message, file=sys.stderr)
            sys.exit(1)
    if distribution.is_chief() and not args.no_report:
        output = os.path.join(args.output_dir, "report")
        report.main([args.output_dir, "--output", output])
    sample = not args.preset and args.data_dir == glue.sample_data_dir()
    if distribution.is_chief() and sample:
        print(SAMPLE_CAVEAT, flush=True)
    return all_results


if __name__ == "__main__":
    main()
