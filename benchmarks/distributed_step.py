"""Train-step time of a small IsoBN classifier on 1, 2 and 4 devices.

A small randomly initialised `IsoBNBertTextClassifier` is trained with
`fit` under `keras_isobn.distribution.data_parallel_scope()` on 1, 2 and 4
devices (virtual CPU devices unless the machine has accelerators), the
global batch fixed, for each head:

- `isobn_sync`: IsoBN whose statistics are the global batch's (TensorFlow:
  `synchronized=True`, two all-reduces per step; JAX: always the case);
- `isobn`: IsoBN with each replica's own statistics (TensorFlow only);
- `batchnorm`: `keras.layers.BatchNormalization`, unsynchronized on
  TensorFlow (on JAX its statistics are global too);
- `batchnorm_sync`: BatchNormalization with `synchronized=True`
  (TensorFlow only);
- `none`: no normalization.

The step time is the median interval between the ends of consecutive
steps (each step waited for), over `--rounds` epochs per head run in
alternation; the first epoch of each head (compilation) is not timed.
PyTorch has no data-parallel engine in keras-isobn and is not measured.

Virtual CPU devices share the machine's cores: their step times show the
cost of replication and all-reduces, not a speed-up.

Usage:

```
python -m benchmarks.distributed_step                    # TF and JAX
python -m benchmarks.distributed_step --backend jax --devices 1 4
python -m benchmarks.distributed_step --quick --output /tmp/b
```
"""

import argparse
import json
import os
import sys
import time

if __package__ in (None, ""):  # `python benchmarks/distributed_step.py`
    sys.path.insert(
        0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402

BACKENDS = ("tensorflow", "jax")
HEADS = {
    "tensorflow": (
        "none", "batchnorm", "batchnorm_sync", "isobn", "isobn_sync"
    ),
    "jax": ("none", "batchnorm", "isobn_sync"),
}
NAMES = {
    "none": "no normalization",
    "batchnorm": "BatchNormalization (unsynchronized on TF)",
    "batchnorm_sync": "BatchNormalization, synchronized",
    "isobn": "IsoBN, each replica's own statistics",
    "isobn_sync": "IsoBN, global-batch statistics",
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.distributed_step",
        description=__doc__.split("\n\n")[0],
        epilog="Writes distributed_step.json and .md to --output.",
    )
    common.add_common_arguments(parser, backends=BACKENDS)
    add = parser.add_argument
    add("--devices", type=int, nargs="+", default=[1, 2, 4],
        help="Numbers of devices (replicas). Defaults to %(default)s.")
    add("--batch-size", type=int, default=32,
        help="Global batch. Defaults to %(default)s.")
    add("--hidden-dim", type=int, default=128,
        help="Hidden size of the classifier (the normalized features). "
        "Defaults to %(default)s.")
    add("--sequence-length", type=int, default=64,
        help="Tokens per example. Defaults to %(default)s.")
    add("--steps", type=int, default=12,
        help="Steps per timed epoch. Defaults to %(default)s.")
    add("--rounds", type=int, default=3,
        help="Timed epochs per head. Defaults to %(default)s.")
    add("--markdown", metavar="JSON",
        help="Only rewrite the Markdown table of an existing JSON file.")
    add("--child-output", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden_dim, args.sequence_length = 16, 8
        args.steps, args.rounds, args.devices = 3, 1, [1, 2]
    bad = [n for n in args.devices if args.batch_size % n]
    if bad:
        parser.error(
            f"--batch-size {args.batch_size} must be a multiple of every "
            f"number of devices; it is not of {bad}."
        )
    return args


class StepEnds(keras.callbacks.Callback):
    """Records when each train step ends, after reading its loss.

    Reading the loss waits for the step, so with JAX's asynchronous
    dispatch the interval between two ends is one whole step. The first
    step of a `fit` call, which includes `fit`'s own setup, ends the first
    interval and starts none.
    """

    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])
        self.times.append(time.perf_counter())


def build(head, args):
    """The classifier with `head` (built and compiled in the scope)."""
    import keras_hub

    from keras_isobn import distribution
    from keras_isobn.models import IsoBNBertTextClassifier

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=1000,
        num_layers=2,
        num_heads=4,
        hidden_dim=args.hidden_dim,
        intermediate_dim=2 * args.hidden_dim,
        max_sequence_length=args.sequence_length,
    )
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
    n = args.batch_size * args.steps
    length = args.sequence_length
    # int32 padding mask: Keras cannot fit bool inputs under a
    # multi-replica tf.distribute strategy.
    padding_mask = (
        np.arange(length)[None] < rng.integers(4, length + 1, size=(n, 1))
    ).astype("int32")
    x = {
        "token_ids": rng.integers(1, 1000, size=(n, length)) * padding_mask,
        "segment_ids": np.zeros((n, length), "int32"),
        "padding_mask": padding_mask,
    }
    return x, rng.integers(0, 2, size=n)


def measure(args):
    """One backend, one number of devices: every head, in alternation.

    Each head fits one untimed epoch first (compilation), then
    `args.rounds` epochs, the heads in turn.
    """
    from keras_isobn import distribution

    # Splits the CPU (harmless where accelerators are used instead).
    distribution.virtual_cpu_devices(args.devices[0])
    devices = keras.distribution.list_devices()[: args.devices[0]]
    backend = keras.backend.backend()
    x, y = data(args)

    def epoch(model):
        def run(_):
            ends = StepEnds()
            model.fit(
                x,
                y,
                batch_size=args.batch_size,
                shuffle=False,
                verbose=0,
                callbacks=[ends],
            )
            return np.diff(ends.times)

        return run

    with distribution.data_parallel_scope(devices=devices) as replicas:
        models = {head: build(head, args) for head in HEADS[backend]}
        timed = common.alternate(
            {head: epoch(model) for head, model in models.items()},
            args.rounds,
        )
    results = [
        dict(
            common.summarize(np.concatenate(t["outputs"])),
            backend=backend,
            devices=replicas,
            head=head,
            first_epoch_s=t["compile_s"],
        )
        for head, t in timed.items()
    ]
    return {"environment": common.environment(), "results": results}


def allreduce_floats(head, backend, replicas, hidden_dim):
    """Floats all-reduced per step for the statistics (not gradients).

    Only TensorFlow's synchronized heads all-reduce statistics themselves,
    each through `keras.ops.moments(..., synchronized=True)`, which
    all-reduces the sums, the squared sums and the counts of what it is
    given: IsoBN gives it `[count, sums]`, `[count, sums of squares]` and
    `[count, sums of outer products]`. On JAX the compiler inserts what
    the global batch needs.
    """
    d = hidden_dim
    if backend != "tensorflow" or replicas == 1 or head[-5:] != "_sync":
        return 0
    if head == "isobn_sync":
        return 3 * (1 + d) + 3 * (1 + d) + 3 * (1 + d * d)
    return 3 * d


def run_child(backend, devices, args):
    """Runs `measure` in a subprocess with its own devices; its dict."""
    path = os.path.join(
        args.output, f".distributed_step_{backend}_{devices}.json"
    )
    argv = [
        "--child-output", path, "--backend", backend, "--devices", str(devices),
        "--batch-size", str(args.batch_size),
        "--hidden-dim", str(args.hidden_dim),
        "--sequence-length", str(args.sequence_length),
        "--steps", str(args.steps), "--rounds", str(args.rounds),
        "--threads", str(args.threads),
    ]
    module = "benchmarks.distributed_step"
    common.run_module(module, argv, backend, args.threads)
    with open(path) as f:
        result = json.load(f)
    os.remove(path)
    return result


def markdown(payload):
    """The results as a Markdown table, with the overheads."""
    s = payload["settings"]
    lines = [
        "# Train step of a small IsoBN classifier on 1, 2 and 4 devices",
        "",
        f"BERT classifier, 2 layers, hidden {s['hidden_dim']}, sequence "
        f"{s['sequence_length']}, global batch {s['batch_size']}; "
        f"median of {s['rounds']} x {s['steps'] - 1} step intervals per "
        "head. Command: `" + payload["command"] + "`.",
        "",
        "Devices are virtual CPU devices sharing the machine's cores "
        "unless GPUs are listed: the times show the cost of replication "
        "and all-reduces, not a speed-up.",
        "",
        "| backend | devices | head | step (ms) | quartiles (ms) "
        "| vs. BatchNormalization | vs. none "
        "| statistics all-reduced (floats/step) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in payload["runs"]:
        by_head = {r["head"]: r for r in run["results"]}
        for r in run["results"]:
            step = r["median_s"]
            floats = allreduce_floats(
                r["head"], r["backend"], r["devices"], s["hidden_dim"]
            )
            lines.append(
                f"| {r['backend']} | {r['devices']} | {NAMES[r['head']]} "
                f"| {step * 1e3:.1f} "
                f"| {r['q1_s'] * 1e3:.0f}-{r['q3_s'] * 1e3:.0f} "
                f"| {step / by_head['batchnorm']['median_s']:.2f} "
                f"| {step / by_head['none']['median_s']:.2f} "
                f"| {floats} |"
            )
    lines += [
        "",
        "Machines: "
        + "; ".join(
            f"{run['environment']['backend']}: "
            f"{run['environment']['cpu_model']}, "
            f"{run['environment']['cpu_count_usable']} usable CPUs, "
            f"load {run['environment']['load_average'][0]:.1f}, "
            f"{len(run['environment']['devices'])} devices "
            f"({run['environment']['devices'][0]})"
            for run in payload["runs"]
            if run["results"][0]["devices"] == max(s["devices"])
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.child_output:
        common.limit_threads(args.threads)
        return common.write_json(args.child_output, measure(args))
    if args.markdown:
        with open(args.markdown) as f:
            return write_markdown(json.load(f), args.markdown)
    runs = [
        run_child(backend, devices, args)
        for backend in common.selected_backends(args, BACKENDS)
        for devices in args.devices
    ]
    command = ["python -m benchmarks.distributed_step"]
    command += sys.argv[1:] if argv is None else argv
    payload = {
        "benchmark": "distributed_step",
        "command": " ".join(command),
        "settings": {
            "batch_size": args.batch_size,
            "hidden_dim": args.hidden_dim,
            "sequence_length": args.sequence_length,
            "steps": args.steps,
            "rounds": args.rounds,
            "devices": args.devices,
            "threads": args.threads,
            "quick": args.quick,
        },
        "runs": runs,
    }
    name = f"distributed_step{'_quick' if args.quick else ''}.json"
    path = common.write_json(os.path.join(args.output, name), payload)
    write_markdown(payload, path)
    print(path)
    return path


def write_markdown(payload, json_path):
    """Writes `markdown(payload)` beside the JSON file, as `.md`."""
    path = os.path.splitext(json_path)[0] + ".md"
    with open(path, "w") as f:
        f.write(markdown(payload))
    return path


if __name__ == "__main__":
    main()
