"""Time and peak memory of importing keras_isobn, beside Keras alone.

For each backend, in one run, fresh Python processes run one of

- `keras`: `import keras`;
- `keras_isobn`: `import keras_isobn; keras_isobn.IsoBatchNormalization()`;

the two in alternation, `--repeats` of each after one untimed run of each
(which fills the file cache). Each process reports the seconds of its
statement, its peak resident memory (`VmHWM`: its own high-water mark;
its `ru_maxrss` would include its parent's, which Linux carries over
through `fork` and `exec`) and which heavy modules are then in
`sys.modules`. The time of a run is the whole process's, interpreter
start-up included, as measured by this process. The goal: keras_isobn at
most 1.2x Keras, in time and memory.

Usage:

```
python -m benchmarks.import_cost                        # every backend
python -m benchmarks.import_cost --backend jax --repeats 11
python -m benchmarks.import_cost --quick --output /tmp/b
```
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from benchmarks import common

STATEMENTS = {
    "keras": "import keras",
    "keras_isobn": "import keras_isobn; keras_isobn.IsoBatchNormalization()",
}
HEAVY_MODULES = ("tensorflow", "keras_hub", "matplotlib", "scipy", "sklearn")
# Run by each fresh process, with the statement and the module names as
# arguments. It imports nothing it does not need to report.
CHILD = """\
import json, resource, sys, time
start = time.perf_counter()
exec(sys.argv[1])
seconds = time.perf_counter() - start
try:
    with open("/proc/self/status") as status:
        lines = [line for line in status if line.startswith("VmHWM:")]
    peak = int(lines[0].split()[1]) * 1024
except (OSError, IndexError):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
modules = [name for name in sys.argv[2:] if name in sys.modules]
print(json.dumps({"statement_s": seconds, "peak_rss_bytes": peak,
                  "modules": modules}))
"""


def run_statement(statement, backend, threads=None):
    """Runs `statement` in a fresh process on `backend`; its report.

    Returns:
        Dict with `"statement_s"`, `"peak_rss_bytes"` and `"modules"`,
        the heavy modules loaded.
    """
    done = subprocess.run(
        [sys.executable, "-c", CHILD, statement, *HEAVY_MODULES],
        env=common.child_environment(backend, threads),
        cwd=common.REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"`{statement}` failed on the {backend} backend:\n{done.stderr}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_backend(backend, args):
    """Both statements on one backend, in alternation; their summaries."""
    timed = common.alternate(
        {
            name: lambda _, s=statement: run_statement(s, backend, args.threads)
            for name, statement in STATEMENTS.items()
        },
        args.repeats,
        warmup=args.warmup,
    )
    statements = {}
    for name, t in timed.items():
        reports = t["outputs"]
        statements[name] = {
            "statement": STATEMENTS[name],
            "wall": common.summarize(t["times"]),
            "statement_time": common.summarize(
                [r["statement_s"] for r in reports]
            ),
            "peak_rss_bytes": float(
                np.median([r["peak_rss_bytes"] for r in reports])
            ),
            "modules": sorted({m for r in reports for m in r["modules"]}),
        }
    keras, isobn = statements["keras"], statements["keras_isobn"]
    return {
        "backend": backend,
        "statements": statements,
        "ratios": {
            "wall": isobn["wall"]["median_s"] / keras["wall"]["median_s"],
            "peak_rss": isobn["peak_rss_bytes"] / keras["peak_rss_bytes"],
        },
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.import_cost",
        description=__doc__.split("\n\n")[0],
        epilog="Writes import_cost.json to --output.",
    )
    common.add_common_arguments(parser)
    parser.add_argument(
        "--repeats", type=int, default=7,
        help="Timed processes per statement and backend (median taken). "
        "Defaults to %(default)s.",
    )
    args = parser.parse_args(argv)
    args.warmup = 1
    if args.quick:
        args.repeats, args.warmup = 1, 0
    return args


def main(argv=None):
    """Runs the benchmark; returns the path of the JSON file."""
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    results = []
    for backend in common.selected_backends(args):
        result = measure_backend(backend, args)
        results.append(result)
        print(
            f"[import_cost] {backend}: keras_isobn / keras = "
            f"{result['ratios']['wall']:.2f}x time, "
            f"{result['ratios']['peak_rss']:.2f}x peak memory; heavy "
            f"modules {result['statements']['keras_isobn']['modules']}",
            file=sys.stderr,
            flush=True,
        )
    payload = {
        "benchmark": "import_cost",
        "environment": common.environment(backend=False),
        "settings": {
            "backends": [r["backend"] for r in results],
            "repeats": args.repeats,
            "warmup": args.warmup,
            "threads": args.threads,
            "heavy_modules": HEAVY_MODULES,
            "quick": args.quick,
        },
        "results": results,
    }
    name = f"import_cost{'_quick' if args.quick else ''}.json"
    path = common.write_json(os.path.join(args.output, name), payload)
    print(path, flush=True)
    return path


if __name__ == "__main__":
    main()
