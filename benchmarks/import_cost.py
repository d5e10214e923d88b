"""Time and peak memory of importing keras_isobn, beside Keras alone.

Per backend, fresh processes run each of `STATEMENTS` in alternation and
report its seconds, their peak memory (`VmHWM`) and the heavy modules then
loaded; a run's time is the whole process's. Goal: at most 1.2x Keras.
"""

import json
import subprocess
import sys

import numpy as np

from benchmarks import harness

STATEMENTS = {
    "keras": "import keras",
    "keras_isobn": "import keras_isobn; keras_isobn.IsoBatchNormalization()",
}
HEAVY_MODULES = ("tensorflow", "keras_hub", "matplotlib", "scipy", "sklearn")
# A fresh process's script (arguments: the statement, the module names); it
# imports nothing it does not need to report.
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
        env=harness.child_environment(backend, threads),
        cwd=harness.REPO_ROOT, capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"`{statement}` failed on the {backend} backend:\n{done.stderr}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_backend(backend, args):
    """Both statements on one backend, in alternation; their summaries."""
    functions = {
        name: lambda _, s=statement: run_statement(s, backend, args.threads)
        for name, statement in STATEMENTS.items()
    }
    timed = harness.alternate(functions, args.repeats, warmup=args.warmup)
    statements = {}
    for name, t in timed.items():
        reports = t["outputs"]
        seconds = [r["statement_s"] for r in reports]
        peaks = [r["peak_rss_bytes"] for r in reports]
        statements[name] = {
            "statement": STATEMENTS[name],
            "wall": harness.summarize(t["times"]),
            "statement_time": harness.summarize(seconds),
            "peak_rss_bytes": float(np.median(peaks)),
            "modules": sorted({m for r in reports for m in r["modules"]}),
        }
    keras, isobn = statements["keras"], statements["keras_isobn"]
    ratios = {"wall": isobn["wall"]["median_s"] / keras["wall"]["median_s"],
              "peak_rss": isobn["peak_rss_bytes"] / keras["peak_rss_bytes"]}
    return {"backend": backend, "statements": statements, "ratios": ratios}


TARGET = 1.2


def goals(payload, path=None):
    """The import's goal: at most `TARGET` times Keras's time and memory."""
    results = payload["results"]
    met = all(max(r["ratios"].values()) <= TARGET for r in results)
    measured = "; ".join(f"{r['backend']}: {r['ratios']['wall']:.2f}x time, "
                         f"{r['ratios']['peak_rss']:.2f}x memory"
                         for r in results)
    return [{"name": "`import keras_isobn` + a layer / `import keras`, time "
             "and peak memory", "target": f"<= {TARGET}x",
             "measured": measured, "status": harness.status(met)}]


def markdown(payload, path=None):
    """The goal and a row per backend: time, memory, modules added."""
    rows = []
    for r in payload["results"]:
        statements = r["statements"]
        cells = [f"{harness.us(s['wall']['median_s'])}, "
                 f"{s['peak_rss_bytes'] / 2**20:.0f} MiB"
                 for s in statements.values()]
        added = set(statements["keras_isobn"]["modules"])
        added -= set(statements["keras"]["modules"])
        rows.append([
            r["backend"], *cells, f"{r['ratios']['wall']:.2f}x",
            f"{r['ratios']['peak_rss']:.2f}x",
            ", ".join(f"`{m}`" for m in sorted(added)) or "none",
            harness.status(max(r["ratios"].values()) <= TARGET),
        ])
    header = ["backend", "`import keras`: time, peak memory",
              "`import keras_isobn` + a layer: time, peak memory",
              "time ratio", "memory ratio", "heavy modules it adds",
              f"<= {TARGET}x"]
    return "\n".join([
        "# Import cost", "",
        "Fresh processes, the two statements in alternation; medians of the "
        "whole process's time and of its peak resident memory (`VmHWM`).",
        "", harness.machine_line(payload["environment"]), "",
        harness.goals_table(goals(payload)), "",
        "## Backends", "", harness.table(header, rows),
    ]) + "\n"


def main(argv=None):
    """Runs the benchmark; returns the path of the JSON file."""
    parser = harness.command(__name__, {
        "repeats": (7, "Timed processes per statement and backend (median "
                    "taken)."),
        "warmup": (1, "Untimed processes per statement first."),
    })
    args = harness.parse(parser, argv, dict(repeats=1, warmup=0))
    results = []
    for backend in harness.selected_backends(args):
        result = measure_backend(backend, args)
        results.append(result)
        print(f"[import_cost] {backend}: keras_isobn / keras = "
              f"{result['ratios']['wall']:.2f}x time, "
              f"{result['ratios']['peak_rss']:.2f}x peak memory; heavy "
              f"modules {result['statements']['keras_isobn']['modules']}",
              file=sys.stderr, flush=True)
    settings = dict(backends=[r["backend"] for r in results],
                    repeats=args.repeats, warmup=args.warmup,
                    threads=args.threads, heavy_modules=HEAVY_MODULES)
    path = harness.write_results(args, "import_cost", settings, results,
                                 backend=False, markdown=markdown, goals=goals)
    print(path, flush=True)
    return path


if __name__ == "__main__":
    main()
