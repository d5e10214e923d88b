"""Train-step throughput of 2 processes against 1, the global batch fixed.

The small built-in BERT classifier with IsoBN (`keras_isobn.models.
small_bert_text_classifier`, the recipe's model without `--preset`) is
trained with `fit` on JAX on random token ids, global batch 32:

- `1 process x 32`: one process, one CPU device;
- `2 processes x 16`: a cluster of two processes on 127.0.0.1 (started as
  `python -m keras_isobn.launch` does), one CPU device each, under
  `data_parallel_scope("multi_worker")`: each process computes its 16 rows,
  then gloo all-reduces the gradients and IsoBN's batch sums across them;
- `1 process x 16`: one process alone on half the batch, the compute of
  one share without any collective.

The step time is the median interval between the ends of consecutive
steps (each waited for), after `--warmup` steps. The time in collectives
is estimated two ways: (a) the 2-process step minus the 1-process step on
16 rows (an upper bound: it also holds the two processes' competition for
the same cores), and (b) measured directly, as the median time of an
all-reduce, across the two processes, of as many float32 values as the
model has trainable weights plus IsoBN's statistics (a jitted sum over a
global array sharded across the two processes), which is what each step
all-reduces.

Usage:

```
python -m benchmarks.multi_process --output benchmarks/results
python -m benchmarks.multi_process --quick --output /tmp/b
```
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # `python benchmarks/multi_process.py`
    sys.path.insert(
        0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )

GLOBAL_BATCH = 32
SEQUENCE = 64
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(args):
    """One process of a configuration; the chief writes `args.worker`."""
    import keras
    import numpy as np

    from keras_isobn import distribution
    from keras_isobn import glue
    from keras_isobn import models

    clustered = distribution.join_cluster()
    kind = "multi_worker" if clustered else None
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    steps = args.warmup + args.steps
    rng = np.random.default_rng(0)
    rows = args.batch * steps
    x = {
        "token_ids": rng.integers(5, 1000, (rows, SEQUENCE)).astype("int32"),
        "segment_ids": np.zeros((rows, SEQUENCE), "int32"),
        "padding_mask": np.ones((rows, SEQUENCE), "int32"),
    }
    y = rng.integers(0, 2, rows).astype("int32")
    ends = []
    with distribution.stop_cluster_on_error():
        with distribution.data_parallel_scope(kind):
            model = models.small_bert_text_classifier(
                glue.sample_vocabulary_path(), 2, SEQUENCE,
                normalization="isobn",
            )  # fmt: skip
            model.preprocessor = None
            model.compile(
                optimizer=keras.optimizers.AdamW(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True
                ),
            )  # fmt: skip

            def on_batch_end(batch, logs):
                float(logs["loss"])  # Waits for the step.
                ends.append(time.perf_counter())

            dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
                args.batch, drop_remainder=True
            )
            model.fit(
                dataset, epochs=1, steps_per_epoch=steps, verbose=0,
                callbacks=[keras.callbacks.LambdaCallback(
                    on_train_batch_end=on_batch_end)],
            )  # fmt: skip
            weights = sum(
                int(np.prod(v.shape)) for v in model.trainable_variables
            )
            statistics = sum(
                int(np.prod(v.shape))
                for v in model.normalization.non_trainable_variables
            )
            allreduce = latency = None
            if clustered:
                allreduce = _time_allreduce(weights + statistics, args.steps)
                latency = _time_allreduce(1, args.steps)
    intervals = np.diff(ends[args.warmup - 1 :])
    if distribution.is_chief():
        with open(args.worker, "w") as file:
            json.dump(
                {
                    "processes": distribution.process_count(),
                    "process_batch": args.batch,
                    "step_ms": 1e3 * float(np.median(intervals)),
                    "step_quartiles_ms": [
                        1e3 * float(q)
                        for q in np.percentile(intervals, [25, 75])
                    ],
                    "steps_timed": len(intervals),
                    "trainable_weights": weights,
                    "isobn_statistics": statistics,
                    "allreduce_ms": allreduce,
                    "allreduce_one_float_ms": latency,
                },
                file,
            )


def _time_allreduce(size, repeats):
    """Median time (ms) of an all-reduce of `size` float32 across processes.

    A global array of one row of `size` values per device, sharded over
    all devices (of every process), summed over the rows: its result, on
    every device, is what an all-reduce of the gradients gives.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("batch",))
    sharding = NamedSharding(mesh, PartitionSpec("batch"))
    local = np.ones((jax.local_device_count(), size), "float32")
    array = jax.make_array_from_process_local_data(sharding, local)
    reduce = jax.jit(
        lambda a: a.sum(axis=0),
        out_shardings=NamedSharding(mesh, PartitionSpec()),
    )
    reduce(array).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        reduce(array).block_until_ready()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def run(processes, batch, args):
    """Runs one configuration; returns the chief's measurements."""
    from keras_isobn import launch

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "result.json")
        command = [
            sys.executable, "-m", "benchmarks.multi_process",
            "--worker", path, "--batch", str(batch),
            "--warmup", str(args.warmup), "--steps", str(args.steps),
        ]  # fmt: skip
        base = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
        if processes == 1:
            done = subprocess.run(
                command, env=base, cwd=REPOSITORY, capture_output=True,
                text=True,
            )  # fmt: skip
            status = done.returncode
            if status:
                print(done.stderr[-3000:], file=sys.stderr)
        else:
            os.environ.update(KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
            previous = os.getcwd()
            os.chdir(REPOSITORY)
            try:
                status = launch.launch(command, processes, devices=1)
            finally:
                os.chdir(previous)
        if status:
            raise RuntimeError(f"{processes} x {batch}: exit status {status}")
        with open(path) as file:
            return json.load(file)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="benchmarks/results")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.quick:
        args.warmup, args.steps = 2, 5
    uptime_before = _uptime()
    results = {
        "1 process x 32": run(1, GLOBAL_BATCH, args),
        "2 processes x 16": run(2, GLOBAL_BATCH // 2, args),
        "1 process x 16": run(1, GLOBAL_BATCH // 2, args),
    }
    uptime_after = _uptime()
    os.environ["KERAS_BACKEND"] = "jax"
    from benchmarks import common

    single = results["1 process x 32"]["step_ms"]
    double = results["2 processes x 16"]["step_ms"]
    half = results["1 process x 16"]["step_ms"]
    payload = {
        "benchmark": "multi_process",
        "environment": dict(
            common.environment(backend=False),
            uptime_before=uptime_before, uptime_after=uptime_after,
        ),  # fmt: skip
        "settings": {
            "global_batch": GLOBAL_BATCH, "sequence_length": SEQUENCE,
            "warmup_steps": args.warmup, "timed_steps": args.steps,
            "model": "small_bert_text_classifier, IsoBN", "backend": "jax",
            "quick": args.quick,
        },  # fmt: skip
        "results": results,
        "summary": {
            "throughput_1x32_examples_per_s": 1e3 * GLOBAL_BATCH / single,
            "throughput_2x16_examples_per_s": 1e3 * GLOBAL_BATCH / double,
            "speed_ratio_2x16_over_1x32": single / double,
            "collectives_upper_bound_ms": double - half,
            "allreduce_measured_ms": results["2 processes x 16"][
                "allreduce_ms"
            ],
            "allreduce_one_float_ms": results["2 processes x 16"][
                "allreduce_one_float_ms"
            ],
        },
    }
    name = "multi_process" + ("_quick" if args.quick else "")
    common.write_json(os.path.join(args.output, name + ".json"), payload)
    with open(os.path.join(args.output, name + ".md"), "w") as file:
        file.write(_markdown(payload))
    print(_markdown(payload))


def _uptime():
    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return None


def _markdown(payload):
    results, summary = payload["results"], payload["summary"]
    env = payload["environment"]
    versions = ", ".join(
        f"{name} {version}" for name, version in env["versions"].items()
        if version
    )  # fmt: skip
    lines = [
        "# Two processes against one, the global batch fixed (JAX, CPU)",
        "",
        "Small built-in BERT classifier with IsoBN, global batch "
        f"{GLOBAL_BATCH}, sequence {SEQUENCE}; median of "
        f"{payload['settings']['timed_steps']} step intervals after "
        f"{payload['settings']['warmup_steps']} warm-up steps. Command: "
        "`python -m benchmarks.multi_process --output benchmarks/results`.",
        "",
        f"Machine: {env['cpu_model']}, {env['cpu_count_usable']} usable "
        f"cores (load before: "
        f"`{env['uptime_before']}`; after: `{env['uptime_after']}`). "
        f"{versions}.",
        "",
        "| configuration | processes | rows per process | step (ms) | "
        "quartiles (ms) | examples/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        low, high = row["step_quartiles_ms"]
        rate = 1e3 * row["process_batch"] * row["processes"] / row["step_ms"]
        lines.append(
            f"| {name} | {row['processes']} | {row['process_batch']} | "
            f"{row['step_ms']:.1f} | {low:.0f}-{high:.0f} | {rate:.0f} |"
        )
    two = results["2 processes x 16"]
    lines += [
        "",
        f"- 2 processes x 16 run at {summary['speed_ratio_2x16_over_1x32']:.2f}"
        " times the speed of 1 process x 32 on the same global batches.",
        "- Time in collectives per step, estimated: at most "
        f"{summary['collectives_upper_bound_ms']:.1f} ms (2-process step "
        "minus the 1-process step on 16 rows; this also counts the two "
        "processes competing for the same cores); measured directly, one "
        f"all-reduce of the {two['trainable_weights']} trainable weights' "
        f"gradients and {two['isobn_statistics']} IsoBN statistics across "
        f"the 2 processes (gloo, loopback) takes "
        f"{summary['allreduce_measured_ms']:.1f} ms (median), and one of "
        f"a single float {summary['allreduce_one_float_ms']:.2f} ms: a "
        "collective costs its latency (waiting for the other process), "
        "not its volume. The step's gap to the 1-process step is thus "
        "mostly waiting: each of the step's collectives (the gradients', "
        "IsoBN's and the metrics' sums) waits until both processes reach "
        "it, and two processes on two cores are descheduled in turn by "
        "everything else the machine runs.",
        "- On 2 shared cores the 2 processes cannot be faster than one: "
        "each computes half the batch but they share the cores, and gloo "
        "adds the all-reduces. The point of the mode is correctness (the "
        "same batches, weights and IsoBN statistics as one process, "
        "`tests/recipes/test_multi_worker.py`) and the cost of the "
        "synchronization, not speed on one machine.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
