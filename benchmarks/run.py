"""Runs the benchmark suite and writes its Markdown summary.

In order: `layer_cost`, `end_to_end` (each on every backend of
`--backend`, each backend in its own process), `import_cost` (fresh
processes per backend), then `report`, which writes the tables,
`README.md` in the results folder, from every JSON there. Each script
runs alone too, with more options: `python -m benchmarks.<script>
--help`. The GPU check is separate: `benchmarks/gpu_check.sh --help`.

Usage:

```
python -m benchmarks                                # the whole suite
python -m benchmarks --backend jax --skip end_to_end
python -m benchmarks --quick --output /tmp/b        # smoke run, tiny sizes
```
"""

from benchmarks import end_to_end
from benchmarks import harness
from benchmarks import import_cost
from benchmarks import layer_cost
from benchmarks import report

STEPS = {"layer_cost": layer_cost, "end_to_end": end_to_end,
         "import_cost": import_cost}


def main(argv=None):
    """Runs the suite; returns the path of the Markdown summary."""
    parser = harness.command(__name__, {
        "skip": ([], "Benchmarks to leave out.", tuple(STEPS)),
    })
    args = harness.parse(parser, argv)
    shared = ["--output", args.output]
    for backend in args.backend or ["all"]:
        shared += ["--backend", backend]
    shared += ["--quick"] if args.quick else []
    shared += ["--threads", str(args.threads)] if args.threads else []
    for name, module in STEPS.items():
        if name not in args.skip:
            module.main(shared)
    path = report.main(["--results", args.output]
                       + (["--include-quick"] if args.quick else []))
    print(f"Summary: {path}", flush=True)
    return path


if __name__ == "__main__":
    main()
