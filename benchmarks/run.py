"""Runs the benchmark suite and writes its Markdown summary.

In order: `layer_cost`, `stability`, `end_to_end` (each on every backend
of `--backend`, each backend in its own process), `import_cost` (fresh
processes per backend), `isotropy_minilm` (with `--glue-dir`), then
`report`, which writes the tables, `README.md` in the results folder,
from every JSON there. Each script runs alone too, with more options:
`python -m benchmarks.<script> --help`. The GPU check is separate:
`benchmarks/gpu_check.sh --help`.

Usage:

```
python -m benchmarks                                # the whole suite
python -m benchmarks --backend jax --skip end_to_end
python -m benchmarks --glue-dir /path/to/glue       # + real MiniLM vectors
python benchmarks/run.py --quick --output /tmp/b    # smoke run, tiny sizes
```
"""

import argparse
import os
import sys

if __package__ in (None, ""):  # `python benchmarks/run.py`
    sys.path.insert(
        0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )

from benchmarks import common  # noqa: E402
from benchmarks import end_to_end  # noqa: E402
from benchmarks import import_cost  # noqa: E402
from benchmarks import isotropy_minilm  # noqa: E402
from benchmarks import layer_cost  # noqa: E402
from benchmarks import report  # noqa: E402
from benchmarks import stability  # noqa: E402

STEPS = (
    "layer_cost", "stability", "end_to_end", "import_cost", "isotropy_minilm"
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__.split("\n\n")[0],
        epilog="Writes <script>_<backend>.json and README.md to --output.",
    )
    add = parser.add_argument
    add("--backend", action="append", choices=common.BACKENDS + ("all",),
        help="Keras backend; repeat for several. Defaults to all.")
    add("--output", default=common.RESULTS_DIR,
        help="Folder for the results. Defaults to %(default)s.")
    add("--quick", action="store_true",
        help="Tiny sizes: checks that the suite runs, in about a minute per "
        "backend.")
    add("--glue-dir",
        help="GLUE-format folder: adds real MiniLM [CLS] vectors to the "
        "stability benchmark and runs isotropy_minilm.")
    add("--skip", nargs="+", choices=STEPS, default=[],
        help="Benchmarks to leave out.")
    return parser.parse_args(argv)


def main(argv=None):
    """Runs the suite; returns the path of the Markdown summary."""
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    shared = ["--output", args.output]
    for backend in args.backend or ["all"]:
        shared += ["--backend", backend]
    if args.quick:
        shared.append("--quick")
    glue = ["--glue-dir", args.glue_dir] if args.glue_dir else []
    if "layer_cost" not in args.skip:
        layer_cost.main(shared)
    if "stability" not in args.skip:
        stability.main(shared + glue)
    if "end_to_end" not in args.skip:
        end_to_end.main(shared)
    if "import_cost" not in args.skip:
        import_cost.main(shared)
    if "isotropy_minilm" not in args.skip and args.glue_dir:
        isotropy = ["--data-dir", args.glue_dir, "--output-dir", args.output]
        if args.quick:  # Leaves the README picture alone.
            isotropy += ["--quick", "--image-dir", args.output]
        isotropy_minilm.main(isotropy)
    path = report.main(
        ["--results", args.output]
        + (["--include-quick"] if args.quick else [])
    )
    print(f"Summary: {path}", flush=True)
    return path


if __name__ == "__main__":
    main()
