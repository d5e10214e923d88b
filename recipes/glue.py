"""Fine-tunes a KerasHub text classifier on GLUE with IsoBN, as in the paper.

`python recipes/glue.py` trains a small built-in BERT offline on the GLUE
sample of `keras_isobn.glue` (SST-2, STS-B) with each `--norm`; `--preset`
and `--task` give the paper's setting. Each run writes `results.json`,
`epochs.csv`, `best.keras` (with its preprocessor), `dev_predictions.npz`,
`logs/` and, while it trains, `backup/` to `<output-dir>/<task>/<norm>/
seed-<n>/`. A killed run resumes when the same command runs again, and ends
as if never stopped. Several processes (JAX) run the same command under a
cluster manager or `python -m keras_isobn.launch`; process 0 alone writes.
"""

import argparse
import contextlib
import gc
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# As a command: import with the cyclic garbage collector off, then freeze
# (`gc.freeze`) the millions of long-lived objects made, and again before
# exit; the collector would go over them again and again (2-4 s per job).
if __name__ == "__main__":
    gc.disable()

import keras  # noqa: E402
import numpy as np  # noqa: E402

import report  # noqa: E402  (recipes/report.py, next to this file)
from keras_isobn import distribution  # noqa: E402
from keras_isobn import glue  # noqa: E402
from keras_isobn import models  # noqa: E402
from keras_isobn.optimizers import fine_tuning_adamw  # noqa: E402
from keras_isobn.resume import ResumableEarlyStopping  # noqa: E402
from keras_isobn.resume import RunDirectory  # noqa: E402
from keras_isobn.resume import SeededBatches  # noqa: E402
from keras_isobn.resume import exclusive  # noqa: E402
from keras_isobn.resume import package_versions  # noqa: E402

if __name__ == "__main__":
    gc.freeze()
    gc.enable()

NORMS = ("none", "batchnorm", "isobn", "isobn-unit")  # -unit: unit variance
EV_K = 3
TORCH_GPU_HINT = (
    "Note: Keras runs PyTorch eagerly; on a GPU use KERAS_BACKEND=jax "
    "(MiniLM trained 20x faster on an H200; README, \"On a GPU\")."
)
SAMPLE_CAVEAT = "[glue] The sample shows that the recipe runs, not whether \
IsoBN helps: its BERT is trained from scratch, not pretrained into the \
anisotropic [CLS] IsoBN is made for; see benchmarks/results/anisotropy_lab/."
# --preset: the authors' train.py (INK-USC/IsoBN); else the built-in BERT.
PAPER_DEFAULTS = {
    "task": None, "norm": ["isobn"], "max_sequence_length": 256,
    "batch_size": 16, "learning_rate": 5e-5, "epochs": 10,
    "seeds": [1, 2, 3, 4, 5],
}  # fmt: skip
SAMPLE_DEFAULTS = {
    "task": ["sst2", "stsb"], "norm": list(NORMS), "max_sequence_length": 40,
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
        description="Fine-tune a KerasHub text classifier on GLUE with or "
        "without BatchNormalization or IsoBN on the pooled output. Without "
        "--preset: a small built-in BERT on the GLUE-format sample shipped in "
        "keras_isobn (offline, minutes on a CPU; its scores say nothing about "
        "GLUE). [Defaults] are with --preset / without.",
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
    add("--norm", nargs="+", choices=NORMS, help="One run each. [isobn / all]")
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
    add("--distribution", choices=("none", "data_parallel", "multi_worker"),
        help="data_parallel: split each batch across all accelerators "
        "(TensorFlow or JAX); multi_worker: across those of the processes "
        "of a cluster (JAX; the default when KERAS_DISTRIBUTION_* are set).")
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
    try:  # Before JAX computes anything: join the cluster of the variables.
        cluster = distribution.cluster_environment()
        if args.distribution is None:
            args.distribution = "multi_worker" if cluster else "none"
        if args.distribution == "multi_worker" and backend != "torch":
            distribution.initialize_cluster(**cluster or {})
    except ValueError as error:
        parser.error(f"--distribution multi_worker: {error}")
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
    gpu = distribution.accelerator_visible()
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
    all_results, chief = [], distribution.is_chief()
    with contextlib.ExitStack() as stack:
        # In a cluster, a process that dies stops the others (no hang).
        stack.enter_context(distribution.stop_cluster_on_error())
        # Fail fast, before any training, with one message: another run on
        # --output-dir (the chief holds the lock for its cluster), an
        # unreachable or unsupported preset, missing data, TFDS offline.
        try:
            if chief:
                stack.enter_context(exclusive(args.output_dir))
            if args.preset:  # Its config only: no weights downloaded.
                models.text_classifier_from_preset(args.preset, 2, None, False)
            tasks = [glue.get_task(name) for name in args.task]
            datasets = [load_data(task, args) for task in tasks]
        except (OSError, RuntimeError, ValueError) as error:
            sys.exit(f"python recipes/glue.py: error: {error}")
        for task, data in zip(tasks, datasets):
            for norm in args.norm:
                for seed in args.seeds:
                    all_results.append(run(args, task, data, norm, seed))
    if chief and not args.no_report:
        report.main([args.output_dir, "--output",
                     os.path.join(args.output_dir, "report")])
    if chief and not args.preset and args.data_dir == glue.sample_data_dir():
        print(SAMPLE_CAVEAT, flush=True)
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
    """Trains one (task, norm, seed), or resumes it, and writes its results.

    In a cluster, every process runs it alike and the chief alone writes.
    """
    name = f"{task.name}/{norm}/seed-{seed}"
    run_dir = RunDirectory(
        os.path.join(args.output_dir, task.name, norm, f"seed-{seed}"))
    # 1. A finished run is read back; a run with a saved epoch resumes; one
    # stopped in its first epoch starts afresh, keeping nothing half-written.
    if (results := run_dir.load_json("results.json")) is not None:
        print(f"[glue] {name}: done already; skipped.")
        return results
    start = time.time()
    checkpoint = run_dir.checkpoint(f"val_{task.primary_metric}")
    resuming = run_dir.start(checkpoint)

    # 2. The classifier and its optimizer, on the devices of --distribution.
    keras.utils.set_random_seed(seed)
    kind = None if args.distribution == "none" else args.distribution
    policy = "mixed_float16" if args.mixed_precision else None
    scope = distribution.data_parallel_scope(kind)
    with models.dtype_policy_scope(policy), scope as replicas:
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
        # 3. Token ids, once per task (all splits in one traced pipeline),
        # and the whole-dev-set metrics: `val_<metric>` (`val_mismatched_`
        # for MNLI's second split) and, on the first split, EV_k before the
        # logits (of the pooled output without normalization), batches cut
        # to their longest sentence (to a multiple of 32 positions on JAX,
        # which compiles a step per length, else of 8).
        if "inputs" not in data:
            data["inputs"] = models.tokenize_splits(
                model, [s.features for s in [data["train"], *data["dev"]]])
        preprocessor, model.preprocessor = model.preprocessor, None
        dev_metrics = glue.dev_set_metrics(
            task, data["dev"], data["inputs"][1:],
            -(-32 // args.batch_size) * args.batch_size,
            trim_padding=32 if keras.backend.backend() == "jax" else 8,
            ev_layer=model.normalization or model.output_dropout, ev_k=EV_K,
        )  # fmt: skip
        # 4. Training from the last saved epoch, then the best epoch's model
        # and dev predictions (predicted again if it ran before a resume).
        done = checkpoint.restore(model)
        what = f"resuming after epoch {len(done)}" if resuming else "training"
        print(f"[glue] {name}: {what} in {run_dir.directory}", flush=True)
        best = {}
        if not checkpoint.finished(args.epochs, args.patience):
            fit(args, model, data, seed, run_dir, checkpoint, dev_metrics, best)
        checkpoint.restore_best(model)
        if not best:
            best = {m.prefix: m.evaluate(model) and m.predictions
                    for m in dev_metrics}  # fmt: skip
        model.preprocessor = preprocessor  # Ready for raw strings.
        run_dir.save("best.keras", model.save)
        out = {s.split: best[m.prefix] for s, m in zip(data["dev"], dev_metrics)}
        run_dir.save("dev_predictions.npz", lambda p: np.savez(p, **out))

    # 5. The results of the best epoch (written by the chief).
    epochs = checkpoint.epochs
    best_row = epochs[checkpoint.best_epoch()]
    final = {k: v for k, v in best_row.items() if k.startswith("val_")}
    before = run_dir.load_json("ev_before.json")
    results = {
        "task": task.name, "group": task.group,
        "preset": args.preset or "builtin-tiny-bert",
        "norm": norm, "seed": seed,
        "data": args.data_dir or task.tfds_name,
        "train_examples": len(data["train"]),
        "dev_examples": {split.split: len(split) for split in data["dev"]},
        "hyperparameters": {k: getattr(args, k) for k in HYPERPARAMETERS},
        "replicas": replicas, "processes": distribution.process_count(),
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
    run_dir.save("results.json", json.dumps(results, indent=2))
    run_dir.finish()
    scores = ", ".join(f"{k} {v:.4f}" for k, v in final.items())
    ev = results["ev"]  # Entering ("in") and leaving the normalization.
    print(f"[glue] {name}: best epoch {results['best_epoch']}: {scores}; "
          f"EV_{EV_K} before -> after fine-tuning: pooled output "
          f"{ev['before']['in']:.3f} -> {ev['after']['in']:.3f}, normalized "
          f"{ev['before']['out']:.3f} -> {ev['after']['out']:.3f}. "
          f"Wrote {run_dir.path('results.json')}")
    keras.backend.clear_session()
    return results


def fit(args, model, data, seed, run_dir, checkpoint, dev_metrics, best):
    """Fits from the checkpoint's epoch on, saving it at each epoch end."""
    epoch_start = []

    def ev_before(logs):  # EV_k before fine-tuning, from the first attempt.
        if run_dir.load_json("ev_before.json") is None:
            logs = dev_metrics[0].evaluate(model)  # In every process.
            run_dir.save("ev_before.json", json.dumps(
                {k: v for k, v in logs.items() if k.startswith("ev")}))

    callbacks = [
        *dev_metrics,
        keras.callbacks.LambdaCallback(
            on_train_begin=ev_before,
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
    ]
    if run_dir.write:  # The chief's TensorBoard logs.
        logs = run_dir.path("logs")
        callbacks.append(keras.callbacks.TensorBoard(logs, write_graph=False))
    batches = SeededBatches(
        data["inputs"][0], data["train"].labels, batch_size=args.batch_size,
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


if __name__ == "__main__":
    main()
    gc.freeze()
