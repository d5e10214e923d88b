"""`python -m benchmarks`: runs the benchmark suite.

`STEPS` in order, each on every backend of `--backend`, each writing its
JSON and, beside it, its Markdown tables and goals. Each script runs
alone too, with more options (`python -m benchmarks.<script> --help`), and
so does the GPU check (`benchmarks.gpu_check`).

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

STEPS = {"layer_cost": layer_cost, "end_to_end": end_to_end,
         "import_cost": import_cost}


def main(argv=None):
    """Runs the suite; returns the paths of the Markdown files written."""
    options = {"skip": ([], "Benchmarks to leave out.", tuple(STEPS))}
    args = harness.parse(harness.command(__name__, options), argv)
    shared = ["--output", args.output]
    for backend in args.backend or ["all"]:
        shared += ["--backend", backend]
    shared += ["--quick"] if args.quick else []
    shared += ["--threads", str(args.threads)] if args.threads else []
    written = []
    for name, module in STEPS.items():
        if name not in args.skip:
            paths = module.main(shared)
            for path in [paths] if isinstance(paths, str) else paths:
                written.append(path.replace(".json", ".md"))
    print("Results: " + ", ".join(written), flush=True)
    return written


if __name__ == "__main__":
    main()
