"""The GPU check of keras-isobn, for a GPU host without TensorFlow.

A rented GPU box has JAX and/or PyTorch but no TensorFlow, Keras,
KerasHub or network: `bundle` writes all the check needs on a CPU
machine with this package, `run` runs it on the GPU host from this
repository (exit code 0 when all checks pass). `--small` shrinks it to
run on a CPU in a minute (with a tiny bundle).
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

from benchmarks import gpu_bundle
from benchmarks import gpu_sections
from benchmarks import harness
from benchmarks.gpu_bundle import Bundle

SECTIONS = ("finetune", "throughput", "numerics", "bfloat16")
# Sizes of the check, at full size and with --small.
FULL = dict(batch_size=32, learning_rate=5e-5, fit_block_steps=100,
            fit_rounds=5, timing_steps=40, bfloat16_steps=100,
            layer_batch=4096, layer_dim=1024, min_accuracy=0.7)
# PyTorch's steps are many times slower (eager): fewer keep it in minutes.
FULL_TORCH = dict(fit_block_steps=40, fit_rounds=3, timing_steps=30)
SMALL = dict(batch_size=8, learning_rate=5e-5, fit_block_steps=2,
             fit_rounds=1, timing_steps=3, bfloat16_steps=3,
             layer_batch=64, layer_dim=32, min_accuracy=0.0)
# The options of `run`.
RUN_OPTIONS = {
    "output": ("gpu_check_results", "Folder for the results."),
    "backends": (["jax", "torch"], "Backends checked (those installed)."),
    "small": (False, "Small timings, for a CPU."),
    "no_hf": (False, "Leave out the Hugging Face Trainer."),
    "timeout": (1200.0, "Seconds each process may run."),
}
# Goals of issue 27 on the fit-block ratios, reported beside the checks
# (timings, not checks): `<ratio>_<part>`, IsoBN's on JAX alone.
GOALS = {"isobn_over_none": 1.03, "fine_tuning_adamw_over_keras_adamw": 1.05}


def new_part(name, args, backend=True, **extra):
    """The payload of a part, with its settings and no sections yet."""
    settings = {k: v for k, v in vars(args).items() if k != "command"}
    return dict(part=name, environment=harness.environment(backend=backend),
                **extra, settings=settings, sections={})


def run(args):
    """Runs the sections on the loaded backend; returns the part's path."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        raise SystemExit(
            "The GPU check runs on JAX or PyTorch (a bare GPU host has no "
            "TensorFlow): set KERAS_BACKEND=jax or KERAS_BACKEND=torch.")
    bundle = Bundle(args.bundle)
    path = os.path.join(args.output, f"part_{backend}.json")
    manifest = {k: v for k, v in bundle.manifest.items() if k != "files"}
    payload = new_part(backend, args, bundle=manifest)
    for section in args.sections:
        start = time.perf_counter()
        print(f"gpu_check: {backend} {section} ...", file=sys.stderr,
              flush=True)
        # What a process killed at its time limit leaves behind.
        payload["sections"][section] = {"unfinished": True}
        harness.write_json(path, payload)
        measure = getattr(gpu_sections, f"section_{section}")
        try:
            result = measure(bundle, args)
        except Exception as e:  # One broken section must not hide others.
            traceback.print_exc()
            frames = traceback.extract_tb(e.__traceback__)[-8:]
            result = {"error": {
                "type": type(e).__name__,
                "message": str(e)[:2000],
                "frames": [f"{f.filename}:{f.lineno} {f.name}" for f in frames],
            }}
        result["seconds"] = time.perf_counter() - start
        payload["sections"][section] = result
        harness.write_json(path, payload)
        print(f"gpu_check: {backend} {section} done in "
              f"{result['seconds']:.1f} s", file=sys.stderr, flush=True)
    return path


def run_hf(args):
    """Hugging Face Trainer on the same token ids; returns the part's path."""
    import torch
    import transformers

    bundle = Bundle(args.bundle)
    batch = args.batch_size
    steps = len(bundle.labels("train")) // batch
    gpu = torch.cuda.is_available()

    def rows(split):
        x = bundle.inputs(split)
        columns = {k: x[v].astype("int64")
                   for k, v in harness.HF_INPUTS.items()}
        columns["labels"] = bundle.labels(split).astype("int64")
        return [{k: v[i] for k, v in columns.items()}
                for i in range(len(columns["labels"]))]

    torch.manual_seed(args.seed)
    model = transformers.BertForSequenceClassification.from_pretrained(
        bundle.checkpoint, num_labels=bundle.manifest["num_classes"],
        torch_dtype=torch.float32)
    with tempfile.TemporaryDirectory() as folder:
        trainer = harness.hf_trainer(model, rows("train"), batch,
                                     args.learning_rate, folder, args.seed,
                                     steps=steps)
        start = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - start
        logits = trainer.predict(rows("dev")).predictions
    payload = new_part("hf", args, backend=False)
    payload["sections"]["hf_trainer"] = {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "fp16": gpu, "steps": steps, "batch_size": batch,
        "train_s_with_start": train_s,
        "train_examples_per_s": harness.steady_rate(trainer.step_ends, batch),
        "dev_accuracy": float(np.mean(
            np.argmax(logits, axis=-1) == bundle.labels("dev"))),
    }
    return harness.write_json(os.path.join(args.output, "part_hf.json"),
                              payload)


def summary_rows(parts):
    """Lines of the summary: the issue's table, per backend."""
    rows = []
    for part, payload in sorted(parts.items()):
        sections = payload["sections"]
        fine = sections.get("finetune", {})
        if "dev_accuracy" in fine:
            rows.append(
                f"{part}: fine-tune {fine['steps']} steps: dev accuracy "
                f"{fine['dev_accuracy']:.3f} ({fine['fit_s_with_compile']:.1f}"
                f" s incl. compile, {fine['train_examples_per_s'] or 0:.0f} "
                "examples/s)")
        throughput = sections.get("throughput", {})
        if "fit" in throughput:
            ratios = throughput["ratios"]
            r = {k: v["fit_blocks"] for k, v in ratios.items()}
            names = ("isobn", "none", "batchnorm", "none_keras_adamw")
            rates = [throughput["fit"][n]["examples_per_s"] for n in names]
            rows.append(
                f"{part}: train examples/s IsoBN / none / BN / none+keras "
                "AdamW: " + " / ".join(f"{x:.0f}" for x in rates)
                + f"; IsoBN/none {r['isobn_over_none']:.3f} (steps "
                f"{ratios['isobn_over_none']['train_on_batch']['median']:.3f}"
                f"), BN/none {r['batchnorm_over_none']:.3f}, "
                "fine_tuning_adamw/AdamW "
                f"{r['fine_tuning_adamw_over_keras_adamw']:.3f}")
            rows.append(f"{part}: IsoBN with frozen statistics / none: "
                        f"{r['isobn_frozen_over_none']:.3f} in fit blocks")
            if "compiled_step_blocks" in throughput:
                compiled = [ratios[k]["compiled_step_blocks"] for k in (
                    "isobn_over_none", "isobn_frozen_over_none",
                    "batchnorm_over_none")]
                rows.append(
                    f"{part}: compiled train steps alone (no fit loop): "
                    "IsoBN / frozen IsoBN / BN over none "
                    + " / ".join(f"{x:.3f}" for x in compiled))
        bf16 = sections.get("bfloat16", {})
        if "checks" in bf16:
            rows.append(
                f"{part}: mixed_bfloat16: checks "
                f"{'pass' if all(bf16['checks'].values()) else 'FAIL'}, "
                f"{bf16['train_examples_per_s'] or 0:.0f} examples/s")
        hf = sections.get("hf_trainer", {})
        if hf:
            rows.append(
                f"hf: Trainer ({hf['device']}, fp16={hf['fp16']}): "
                f"{hf['train_examples_per_s'] or 0:.0f} examples/s, dev "
                f"accuracy {hf['dev_accuracy']:.3f}")
    return rows


def goals(parts):
    """The issue's speed goals, from the throughput sections."""
    measured = {}
    for part, payload in parts.items():
        ratios = payload["sections"].get("throughput", {}).get("ratios")
        if not ratios:
            continue
        for name, limit in GOALS.items():
            if part == "jax" or name != "isobn_over_none":
                ratio = ratios[name]["fit_blocks"]
                measured[f"{name}_{part}"] = harness.goal(ratio, limit)
    return measured


def markdown(payload, path=None):
    """The checks, the goals and the summary of a merged run's payload."""
    failed = [k for k, v in payload["checks"].items() if not v]
    env = payload["environment"]
    goals = [{"name": name, "target": goal["goal"],
              "measured": f"{goal['measured']:.3f}",
              "status": harness.status(goal["met"])}
             for name, goal in payload["goals"].items()]
    return "\n".join([
        "# GPU check", "",
        "`python -m benchmarks.gpu_check run BUNDLE` on a GPU host (a run "
        "with `--small` is a smoke test: accuracy not checked).", "",
        f"Devices: {', '.join(env.get('devices', []))}. "
        + (harness.machine_line(env) if "versions" in env else ""), "",
        "Checks: " + ("PASS" if payload["passed"]
                      else "FAIL: " + ", ".join(failed)), "",
        harness.goals_table(goals), "", "## Summary", "",
        *[f"- {row}" for row in payload["summary"]],
    ]) + "\n"


def merge(folder):
    """Merges the parts of `folder` into `gpu_check.json` and `.md`.

    Returns `(path, passed)`: the JSON's path, whether every check passed.
    """
    parts = {}
    for path in sorted(glob.glob(os.path.join(folder, "part_*.json"))):
        name = os.path.basename(path)[len("part_"):-len(".json")]
        with open(path) as f:
            parts[name] = json.load(f)
    if not parts:
        raise SystemExit(f"gpu_check: no part_*.json in {folder!r}.")
    # `<part>/<section>/<check>`; a section that failed or did not end fails.
    checks = {}
    for part, part_payload in parts.items():
        for section, result in part_payload["sections"].items():
            key = f"{part}/{section}"
            if "error" in result or result.get("unfinished"):
                checks[f"{key}/ran"] = False
            for check, passed in result.get("checks", {}).items():
                checks[f"{key}/{check}"] = bool(passed)
    keras_parts = [p for n, p in sorted(parts.items()) if n != "hf"]
    small = any(p["settings"].get("small") for p in parts.values())
    payload = {
        "benchmark": "gpu_check",
        # The machine and versions (each part holds its own too).
        "environment": (keras_parts or list(parts.values()))[0]["environment"],
        "settings": {"small": small},
        "passed": bool(checks) and all(checks.values()),
        "checks": checks,
        "goals": goals(parts),
        "summary": summary_rows(parts),
        "parts": parts,
    }
    path = harness.write_json(os.path.join(folder, "gpu_check.json"), payload)
    with open(os.path.join(folder, "gpu_check.md"), "w") as f:
        f.write(markdown(payload))
    for check, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {check}")
    for name, goal in payload["goals"].items():
        print(f"goal {name}: {goal['measured']:.3f} (<= {goal['goal']}) "
              f"{'met' if goal['met'] else 'MISSED'}")
    print("\n".join(payload["summary"]))
    return path, payload["passed"]


def check(args, parser):
    """Runs every part in its own process, then merges; returns the code."""
    bundle = os.path.abspath(args.bundle)
    if not os.path.isfile(os.path.join(bundle, "manifest.json")):
        parser.error(f"{args.bundle!r} is not a bundle (no manifest.json); "
                     "build one with `python -m benchmarks.gpu_check bundle "
                     "GLUE_DIR OUT`.")
    output = os.path.abspath(args.output)
    os.makedirs(output, exist_ok=True)
    for pattern in ("part_*.json", "gpu_check.*"):
        for path in glob.glob(os.path.join(output, pattern)):
            os.remove(path)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # JAX must not take the whole GPU memory up front.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    paths = [harness.REPO_ROOT, env.get("PYTHONPATH")]
    wheels = glob.glob(os.path.join(bundle, "wheels", "*.whl"))
    if wheels:
        # The bundle's versions, in a folder of their own, before the host's.
        site = os.path.join(bundle, "site")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index",
             "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
             "--target", site, *wheels], check=True)
        paths.insert(0, site)
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if shutil.which("nvidia-smi"):
        subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,"
                        "driver_version", "--format=csv,noheader"],
                       check=False)
    start, failed = time.perf_counter(), False
    small = ["--small"] if args.small else []

    def step(name, modules, command, **extra):
        found = subprocess.run([sys.executable, "-c", f"import {modules}"],
                               env=env, capture_output=True)
        if found.returncode:
            print(f"gpu_check: {modules} is not installed; {name} skipped.")
            return False
        print(f"gpu_check: {name} ({time.perf_counter() - start:.0f} s)",
              flush=True)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.gpu_check", command,
                 bundle, "--output", output, *small],
                env=dict(env, **extra), timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"gpu_check: FAIL {name} ran past {args.timeout:g} s.")
            return True
        return done.returncode != 0

    for backend in args.backends:
        failed |= step(backend, backend, "part", KERAS_BACKEND=backend)
    if not args.no_hf:
        failed |= step("HF Trainer", "torch, transformers", "hf")
    failed |= not merge(output)[1]
    seconds = time.perf_counter() - start
    if failed:
        print(f"gpu_check: FAIL ({seconds:.0f} s; see the FAIL lines above; "
              f"JSON in {output})", file=sys.stderr)
        return 1
    print(f"gpu_check: PASS ({seconds:.0f} s, "
          f"{os.path.join(output, 'gpu_check.json')})")
    return 0


def parser_of():
    """The command line's parser, one sub-command a command."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=__doc__.split("\n\n")[0],
        epilog="Usage: `bundle GLUE_DIR OUT` here, then `run OUT` on the "
        "GPU host.")
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("bundle", help="Write a bundle (CPU machine).")
    sub.add_argument("glue_dir", help="GLUE folder (with SST-2/).")
    sub.add_argument("bundle", help="New folder for the bundle.")
    sub.add_argument("options", nargs=argparse.REMAINDER,
                     help="Options of `python -m benchmarks.gpu_bundle`.")
    sub = commands.add_parser("run", help="Run the whole check (GPU host).")
    sub.add_argument("bundle", help="Bundle folder.")
    harness.add_options(sub, RUN_OPTIONS)
    for command in ("part", "hf"):
        sub = commands.add_parser(command)
        sub.add_argument("bundle", help="Bundle folder (gpu_bundle.py).")
        sub.add_argument("--output", required=True,
                         help="Folder for part_<backend>.json.")
        sub.add_argument("--small", action="store_true",
                         help="Small timings, for a CPU.")
        sub.add_argument("--seed", type=int, default=0)
        for key, value in FULL.items():
            torch = f", {FULL_TORCH[key]} on torch" if key in FULL_TORCH else ""
            sub.add_argument("--" + key.replace("_", "-"), type=type(value),
                             help=f"Defaults to {value}{torch} "
                             f"({SMALL[key]} with --small).")
        if command == "part":
            sub.add_argument("--sections", nargs="+", choices=SECTIONS,
                             default=list(SECTIONS), help="Sections to run.")
    sub = commands.add_parser("merge")
    sub.add_argument("output", help="Folder holding the part_*.json.")
    return parser


def main(argv=None):
    """Runs a command; returns the exit code."""
    parser = parser_of()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.command == "bundle":
        gpu_bundle.main([args.bundle, "--glue-dir", args.glue_dir,
                         *args.options])
        return 0
    if args.command == "run":
        return check(args, parser)
    if args.command == "merge":
        return 0 if merge(args.output)[1] else 1
    sizes = SMALL if args.small else FULL
    if not args.small and os.environ.get("KERAS_BACKEND") == "torch":
        sizes = dict(sizes, **FULL_TORCH)
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    os.makedirs(args.output, exist_ok=True)
    path = run(args) if args.command == "part" else run_hf(args)
    print(path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
