"""How long deleting a `tf.data` iterator takes, autotuned or not.

The main job's 20-40 s stalls inside `fit` (`results/ANALYSIS.md#main-job`)
were the deletion of the training set's iterator as `fit` ended, waiting in
`RootDataset::Iterator::~Iterator` for the autotuning thread that
`tf.data.AUTOTUNE` starts. This script shows it without Keras: a pipeline
like `SeededBatches.as_tf_dataset()` (index batches, a gather, a cut) is
read for `--seconds` while the main thread computes (as a training step
does), then the iterator is deleted and the deletion timed. Each trial runs
in its own process, autotuned (`prefetch(AUTOTUNE)`, the default options)
and not (`prefetch(2)`, `options.autotune.enabled = False`, as
`SeededBatches` and `keras_isobn.models.tokenize` now build theirs).

Usage:

```
python -m benchmarks.iterator_deletion --trials 4 --seconds 90
```

Writes `iterator_deletion.json` (deletion seconds per trial) to `--output`.
"""

import argparse
import json
import os
import subprocess
import sys
import time

if __package__ in (None, ""):  # `python benchmarks/iterator_deletion.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402


def trial(autotune, seconds):
    """Reads the pipeline for `seconds`, then times the iterator's deletion."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    tokens = tf.constant(rng.integers(0, 100, (1024, 64)), tf.int32)
    rows = np.concatenate([rng.permutation(1024) for _ in range(2)])

    def gather(indices):
        batch = tf.gather(tokens, indices)
        used = tf.reduce_sum(tf.cast(tf.reduce_any(batch > 0, 0), tf.int32))
        return batch[:, :used]

    dataset = tf.data.Dataset.from_tensor_slices(rows).batch(32).map(gather)
    if autotune:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    else:
        options = tf.data.Options()
        options.autotune.enabled = False
        dataset = dataset.prefetch(2).with_options(options)
    iterator, batches = iter(dataset), len(rows) // 32
    work = rng.random((600, 600), dtype=np.float32)
    start = time.time()
    for index, _ in enumerate(iterator):
        while time.time() < start + seconds * (index + 1) / batches:
            work = work @ work / 600.0  # The "training step".
    begin = time.perf_counter()
    del iterator
    return time.perf_counter() - begin


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4,
                        help="Trials of each kind, all run at once.")
    parser.add_argument("--seconds", type=float, default=90.0,
                        help="How long each iterator is read before deletion.")
    parser.add_argument("--output", default=common.RESULTS_DIR)
    parser.add_argument("--child", choices=("autotuned", "not-autotuned"))
    args = parser.parse_args(argv)
    if args.child:
        print(trial(args.child == "autotuned", args.seconds), flush=True)
        return
    kinds = ["autotuned", "not-autotuned"] * args.trials
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=common.REPO_ROOT)
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.iterator_deletion", "--child",
             kind, "--seconds", str(args.seconds)],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        for kind in kinds
    ]
    results = {"autotuned": [], "not-autotuned": []}
    for kind, child in zip(kinds, children):
        out, _ = child.communicate()
        if child.returncode:
            sys.exit(f"A {kind} trial failed (exit code {child.returncode}).")
        results[kind].append(float(out.strip().splitlines()[-1]))
    payload = {
        "benchmark": "iterator_deletion",
        "command": "python -m benchmarks.iterator_deletion "
        f"--trials {args.trials} --seconds {args.seconds:g}",
        "environment": common.environment(backend=False),
        "settings": {"trials": args.trials, "seconds": args.seconds},
        "deletion_s": results,
    }
    os.makedirs(args.output, exist_ok=True)
    path = os.path.join(args.output, "iterator_deletion.json")
    with open(path, "w") as file:
        json.dump(payload, file, indent=2)
    env = payload["environment"]
    lines = [
        "# Deleting a tf.data iterator, autotuned or not", "",
        f"`{payload['command']}`: {args.trials} trials of each kind at "
        f"once, each iterator read for {args.seconds:g} s while the main "
        "thread computes, then deleted. See `benchmarks/iterator_deletion.py`"
        " and `ANALYSIS.md#main-job`.", "",
        "| pipeline | deletion, each trial (s) |", "|---|---|",
    ]  # fmt: skip
    for kind, seconds in results.items():
        lines.append(f"| {kind} | " + ", ".join(f"{s:.2f}" for s in seconds)
                     + " |")
    lines += ["", f"Machine: {env['cpu_model']}, {env['cpu_count_usable']} "
              f"usable CPUs, {env['date']}; tensorflow "
              f"{env['versions'].get('tensorflow')}."]
    with open(os.path.join(args.output, "iterator_deletion.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[6:]))
    print(path)


if __name__ == "__main__":
    main()
