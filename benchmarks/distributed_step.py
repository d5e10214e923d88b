"""Data-parallel train steps of a small IsoBN classifier.

Devices (the default): a small random `IsoBNBertTextClassifier` trained
with `fit` under `data_parallel_scope()` on 1, 2 and 4 (virtual CPU)
devices in one process, the global batch fixed, per head of `HEADS`
(`_sync`: global-batch statistics); the median interval between step ends
over `--rounds` epochs per head, in alternation, after a compiling epoch.
Virtual devices share the cores: the times show the cost of replication
and all-reduces, not a speed-up. PyTorch has no data-parallel engine here.

Processes (`--processes`, JAX): the small built-in BERT classifier with
IsoBN, global batch 32, as 1 process x 32 rows, 2 processes x 16 (a
cluster on 127.0.0.1, as `keras_isobn.launch` starts it) and 1 process x
16 (one share's compute, no collective). The collectives take at most the
2-process step less the 1 x 16 one; measured, one all-reduce of as many
floats as the gradients and IsoBN's statistics. Writes `multi_process.*`.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import keras
import numpy as np

from benchmarks import harness

BACKENDS = ("tensorflow", "jax")
HEADS = {"tensorflow": ("none", "batchnorm", "batchnorm_sync", "isobn",
                        "isobn_sync"),
         "jax": ("none", "batchnorm", "isobn_sync")}
NAMES = {
    "none": "no normalization",
    "batchnorm": "BatchNormalization (unsynchronized on TF)",
    "batchnorm_sync": "BatchNormalization, synchronized",
    "isobn": "IsoBN, each replica's own statistics",
    "isobn_sync": "IsoBN, global-batch statistics",
}
OPTIONS = {
    "devices": ([1, 2, 4], "Numbers of devices (replicas)."),
    "batch_size": (32, "Global batch."),
    "hidden_dim": (128, "Hidden size (the normalized features)."),
    "sequence_length": (64, "Tokens per example."),
    "steps": (12, "Steps per timed epoch (with --processes: timed steps, "
              "30 if not given)."),
    "rounds": (3, "Timed epochs per head."),
    "warmup": (5, "Untimed steps first (--processes)."),
    "processes": (False, "Compare 2 processes with 1 instead (JAX)."),
    "child_output": (None, argparse.SUPPRESS),
    "worker": (None, argparse.SUPPRESS),
}
QUICK = dict(hidden_dim=16, sequence_length=8, steps=3, rounds=1,
             devices=[1, 2], warmup=2)
GLOBAL_BATCH, SEQUENCE = 32, 64  # Of --processes.


def build(head, args):
    """The classifier with `head` (built and compiled in the scope)."""
    from keras_isobn import distribution
    from keras_isobn.models import IsoBNBertTextClassifier

    backbone = harness.bert_backbone(dict(
        harness.SHAPES["small"], hidden_dim=args.hidden_dim,
        intermediate_dim=2 * args.hidden_dim,
        max_sequence_length=args.sequence_length,
    ))
    normalization = {"none": None}.get(head, head.replace("_sync", ""))
    classifier = IsoBNBertTextClassifier(
        backbone=backbone, num_classes=2, normalization=normalization
    )
    if head.endswith("_sync"):
        distribution.synchronize_statistics(classifier)
    classifier.compile(
        keras.optimizers.Adam(1e-4),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return classifier


def data(args):
    """Random token ids and labels for `args.steps` global batches."""
    rng = np.random.default_rng(0)
    n, length = args.batch_size * args.steps, args.sequence_length
    # int32: Keras cannot fit bool inputs under a multi-replica strategy.
    lengths = rng.integers(4, length + 1, size=(n, 1))
    padding_mask = (np.arange(length)[None] < lengths).astype("int32")
    x = {"token_ids": rng.integers(1, 1000, size=(n, length)) * padding_mask,
         "segment_ids": np.zeros((n, length), "int32"),
         "padding_mask": padding_mask}
    return x, rng.integers(0, 2, size=n)


def measure(args):
    """One backend and number of devices: every head's epochs, in turn."""
    from keras_isobn import distribution

    # Splits the CPU (harmless where accelerators are used instead).
    distribution.virtual_cpu_devices(args.devices[0])
    devices = keras.distribution.list_devices()[: args.devices[0]]
    backend = keras.backend.backend()
    x, y = data(args)

    def epoch(model):
        def run(_):
            clock = harness.step_clock()
            model.fit(x, y, batch_size=args.batch_size, shuffle=False,
                      verbose=0, callbacks=[clock])
            return np.diff(clock.times)

        return run

    with distribution.data_parallel_scope(devices=devices) as replicas:
        models = {head: build(head, args) for head in HEADS[backend]}
        timed = harness.alternate({h: epoch(m) for h, m in models.items()},
                                  args.rounds)
    results = [dict(harness.summarize(np.concatenate(t["outputs"])),
                    backend=backend, devices=replicas, head=head,
                    first_epoch_s=t["compile_s"])
               for head, t in timed.items()]
    return {"environment": harness.environment(), "results": results}


def allreduce_floats(head, backend, replicas, d):
    """Floats all-reduced per step for the statistics (not gradients).

    TensorFlow's synchronized heads all-reduce through `keras.ops.moments(
    ..., synchronized=True)` (sums, squared sums and counts): IsoBN gives
    it `[count, sums]`, `[count, sums of squares]` and `[count, outer
    products]`. On JAX the compiler inserts what the global batch needs.
    """
    if backend != "tensorflow" or replicas == 1 or head[-5:] != "_sync":
        return 0
    if head == "isobn_sync":
        return 3 * (1 + d) + 3 * (1 + d) + 3 * (1 + d * d)
    return 3 * d


def run_child(backend, devices, args):
    """Runs `measure` in a subprocess with its own devices; its dict."""
    path = os.path.join(args.output,
                        f".distributed_step_{backend}_{devices}.json")
    argv = ["--child-output", path, "--backend", backend,
            "--devices", str(devices), "--batch-size", str(args.batch_size),
            "--hidden-dim", str(args.hidden_dim),
            "--sequence-length", str(args.sequence_length),
            "--steps", str(args.steps), "--rounds", str(args.rounds),
            "--threads", str(args.threads)]
    harness.run_module(__name__, argv, backend, args.threads)
    with open(path) as f:
        result = json.load(f)
    os.remove(path)
    return result


def markdown(payload, path=None):
    """The results as a Markdown table, with the overheads."""
    s = payload["settings"]
    rows = []
    for run in payload["runs"]:
        by_head = {r["head"]: r for r in run["results"]}
        for r in run["results"]:
            step = r["median_s"]
            rows.append([
                r["backend"], r["devices"], NAMES[r["head"]],
                f"{step * 1e3:.1f}",
                f"{r['q1_s'] * 1e3:.0f}-{r['q3_s'] * 1e3:.0f}",
                f"{step / by_head['batchnorm']['median_s']:.2f}",
                f"{step / by_head['none']['median_s']:.2f}",
                allreduce_floats(r["head"], r["backend"], r["devices"],
                                 s["hidden_dim"]),
            ])
    command = payload.get("command") or payload["environment"]["command"]
    largest = [run["environment"] for run in payload["runs"]
               if run["results"][0]["devices"] == max(s["devices"])]
    return "\n".join([
        "# Train step of a small IsoBN classifier on 1, 2 and 4 devices", "",
        f"BERT classifier, 2 layers, hidden {s['hidden_dim']}, sequence "
        f"{s['sequence_length']}, global batch {s['batch_size']}; median of "
        f"{s['rounds']} x {s['steps'] - 1} step intervals per head. Command: "
        f"`{command}`.", "",
        "Devices are virtual CPU devices sharing the machine's cores unless "
        "GPUs are listed: the times show the cost of replication and "
        "all-reduces, not a speed-up.", "",
        harness.table(["backend", "devices", "head", "step (ms)",
                       "quartiles (ms)", "vs. BatchNormalization", "vs. none",
                       "statistics all-reduced (floats/step)"], rows), "",
        " ".join(f"{env['backend']}: {len(env['devices'])} devices "
                 f"({env['devices'][0]}). {harness.machine_line(env)}"
                 for env in largest), "",
    ])


def main(argv=None):
    """Runs the benchmark; returns the path of the JSON file."""
    parser = harness.command(__name__, OPTIONS, backends=BACKENDS)
    args = harness.parse(parser, argv, QUICK)
    bad = [n for n in args.devices if args.batch_size % n]
    if bad:
        parser.error(f"--batch-size {args.batch_size} must be a multiple of "
                     f"every number of devices; it is not of {bad}.")
    if args.child_output:
        harness.limit_threads(args.threads)
        return harness.write_json(args.child_output, measure(args))
    if args.worker:
        return worker(args)
    if args.processes:
        given = sys.argv[1:] if argv is None else argv
        if "--steps" not in given and not args.quick:
            args.steps = 30
        return compare_processes(args)
    runs = [run_child(backend, devices, args)
            for backend in harness.selected_backends(args, BACKENDS)
            for devices in args.devices]
    settings = {k: getattr(args, k) for k in (
        "batch_size", "hidden_dim", "sequence_length", "steps", "rounds",
        "devices", "threads")}
    path = harness.write_results(args, "distributed_step", settings,
                                 backend=False, markdown=markdown, runs=runs)
    print(path)
    return path


def worker(args):
    """One process of a `--processes` run; the chief writes `--worker`."""
    import tensorflow as tf

    from keras_isobn import distribution
    from keras_isobn import glue
    from keras_isobn import models

    clustered = distribution.join_cluster()
    keras.utils.set_random_seed(0)
    steps = args.warmup + args.steps
    rng = np.random.default_rng(0)
    rows = args.batch_size * steps
    x = {"token_ids": rng.integers(5, 1000, (rows, SEQUENCE)).astype("int32"),
         "segment_ids": np.zeros((rows, SEQUENCE), "int32"),
         "padding_mask": np.ones((rows, SEQUENCE), "int32")}
    y = rng.integers(0, 2, rows).astype("int32")
    clock = harness.step_clock()
    scope = distribution.data_parallel_scope(
        "multi_worker" if clustered else None
    )
    with distribution.stop_cluster_on_error(), scope:
        model = models.small_bert_text_classifier(
            glue.sample_vocabulary_path(), 2, SEQUENCE, normalization="isobn"
        )
        model.preprocessor = None
        model.compile(
            optimizer=keras.optimizers.AdamW(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        dataset = dataset.batch(args.batch_size, drop_remainder=True)
        model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0,
                  callbacks=[clock])
        weights = sum(int(np.prod(v.shape))
                      for v in model.trainable_variables)
        statistics = sum(int(np.prod(v.shape))
                         for v in model.normalization.non_trainable_variables)
        allreduce = latency = None
        if clustered:
            allreduce = time_allreduce(weights + statistics, args.steps)
            latency = time_allreduce(1, args.steps)
    intervals = harness.summarize(np.diff(clock.times[args.warmup - 1:]))
    if distribution.is_chief():
        harness.write_json(args.worker, {
            "processes": distribution.process_count(),
            "process_batch": args.batch_size,
            "step_ms": 1e3 * intervals["median_s"],
            "step_quartiles_ms": [1e3 * intervals["q1_s"],
                                  1e3 * intervals["q3_s"]],
            "steps_timed": intervals["count"],
            "trainable_weights": weights,
            "isobn_statistics": statistics,
            "allreduce_ms": allreduce,
            "allreduce_one_float_ms": latency,
        })


def time_allreduce(size, repeats):
    """Median ms of an all-reduce of `size` float32 across processes.

    A global array of one row of `size` values per device, sharded over
    every process's devices, summed over the rows.
    """
    import jax
    from jax.sharding import Mesh
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("batch",))
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    local = np.ones((jax.local_device_count(), size), "float32")
    array = jax.make_array_from_process_local_data(sharding, local)
    reduce = jax.jit(lambda a: a.sum(axis=0),
                     out_shardings=NamedSharding(mesh, PartitionSpec()))
    timed = harness.alternate(
        {"allreduce": lambda _: reduce(array).block_until_ready()}, repeats
    )
    return 1e3 * float(np.median(timed["allreduce"]["times"]))


def run_processes(processes, batch, args):
    """Runs one `--processes` configuration; the chief's measurements."""
    from keras_isobn import launch

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "result.json")
        command = [sys.executable, "-m", "benchmarks.distributed_step",
                   "--worker", path, "--batch-size", str(batch),
                   "--warmup", str(args.warmup), "--steps", str(args.steps)]
        env = harness.child_environment("jax")
        if processes == 1:
            done = subprocess.run(command, env=env, cwd=harness.REPO_ROOT,
                                  capture_output=True, text=True)
            status = done.returncode
            if status:
                print(done.stderr[-3000:], file=sys.stderr)
        else:
            os.environ.update(env)
            previous = os.getcwd()
            os.chdir(harness.REPO_ROOT)
            try:
                status = launch.launch(command, processes, devices=1)
            finally:
                os.chdir(previous)
        if status:
            raise RuntimeError(f"{processes} x {batch}: exit status {status}")
        with open(path) as f:
            return json.load(f)


def compare_processes(args):
    """2 processes against 1; returns the path of the JSON file."""
    results = {
        "1 process x 32": run_processes(1, GLOBAL_BATCH, args),
        "2 processes x 16": run_processes(2, GLOBAL_BATCH // 2, args),
        "1 process x 16": run_processes(1, GLOBAL_BATCH // 2, args),
    }
    single, double, half = (results[k]["step_ms"] for k in results)
    two = results["2 processes x 16"]
    settings = {
        "global_batch": GLOBAL_BATCH, "sequence_length": SEQUENCE,
        "warmup_steps": args.warmup, "timed_steps": args.steps,
        "model": "small_bert_text_classifier, IsoBN", "backend": "jax",
    }
    summary = {
        "throughput_1x32_examples_per_s": 1e3 * GLOBAL_BATCH / single,
        "throughput_2x16_examples_per_s": 1e3 * GLOBAL_BATCH / double,
        "speed_ratio_2x16_over_1x32": single / double,
        "collectives_upper_bound_ms": double - half,
        "allreduce_measured_ms": two["allreduce_ms"],
        "allreduce_one_float_ms": two["allreduce_one_float_ms"],
    }
    path = harness.write_results(
        args, "multi_process", settings, results, backend=False,
        markdown=processes_markdown, summary=summary,
    )
    print(path)
    return path


def processes_markdown(payload, path=None):
    results, summary = payload["results"], payload["summary"]
    rows = []
    for name, row in results.items():
        rate = 1e3 * row["process_batch"] * row["processes"] / row["step_ms"]
        rows.append([name, row["processes"], row["process_batch"],
                     f"{row['step_ms']:.1f}",
                     "{:.0f}-{:.0f}".format(*row["step_quartiles_ms"]),
                     f"{rate:.0f}"])
    two, s = results["2 processes x 16"], payload["settings"]
    return "\n".join([
        "# Two processes against one, the global batch fixed (JAX, CPU)", "",
        f"Small built-in BERT classifier with IsoBN, global batch "
        f"{GLOBAL_BATCH}, sequence {SEQUENCE}; median of {s['timed_steps']} "
        f"step intervals after {s['warmup_steps']} warm-up steps. Command: "
        f"`{payload['environment']['command']}`.", "",
        harness.machine_line(payload["environment"]), "",
        harness.table(["configuration", "processes", "rows per process",
                       "step (ms)", "quartiles (ms)", "examples/s"], rows),
        "",
        f"- 2 processes x 16 run at "
        f"{summary['speed_ratio_2x16_over_1x32']:.2f} times the speed of 1 "
        "process x 32 on the same global batches.",
        "- Time in collectives per step: at most "
        f"{summary['collectives_upper_bound_ms']:.1f} ms (the 2-process step "
        "less the 1-process step on 16 rows, the two processes' competition "
        "for the cores included); measured, one all-reduce of the "
        f"{two['trainable_weights']} gradients and {two['isobn_statistics']}"
        f" IsoBN statistics (gloo, loopback) takes "
        f"{summary['allreduce_measured_ms']:.1f} ms, one of a single float "
        f"{summary['allreduce_one_float_ms']:.2f} ms.", "",
    ])


if __name__ == "__main__":
    main()
