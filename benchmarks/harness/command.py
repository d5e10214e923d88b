"""The command line of the benchmarks, and their backends' processes."""

import argparse
import os
import subprocess
import sys

from benchmarks.harness.results import REPO_ROOT
from benchmarks.harness.results import RESULTS_DIR

BACKENDS = ("tensorflow", "jax", "torch")


def command(module, options, backends=BACKENDS, threads=0, output=True,
            quick=True):
    """The argument parser of a benchmark: its options and the shared ones.

    Args:
        module: The benchmark's module name; its docstring's first
            paragraph describes the command.
        options: Dict of option name (`"batch_size"` for `--batch-size`)
            to `(default, help)` or `(default, help, choices)`: the type
            and arity follow the default (a list takes several values,
            `False` is a flag, `None` a string).
        backends: The backends `--backend` may name (`()`: no option).
        threads: Default of `--threads` (`None`: no such option).
        output: Whether to add `--output`.
        quick: Whether to add `--quick`.
    """
    doc = sys.modules[module].__doc__ or ""
    parser = argparse.ArgumentParser(prog=f"python -m {module_name(module)}",
                                     description=doc.split("\n\n")[0])
    add = parser.add_argument
    if backends:
        add("--backend", action="append", choices=tuple(backends) + ("all",),
            help="Keras backend; repeat for several. Defaults to all. Each "
            "one other than the loaded one runs in its own process.")
    if output:
        add("--output", default=RESULTS_DIR,
            help="Folder for the results. Defaults to %(default)s.")
    if threads is not None:
        add("--threads", type=int, default=threads,
            help="CPU threads of the numerical libraries (0: their default). "
            "Defaults to %(default)s.")
    if quick:
        add("--quick", action="store_true",
            help="Tiny sizes: checks that it runs, measures nothing to keep.")
    add_options(parser, options)
    return parser


def add_options(parser, options):
    """Adds `options` (see `command`) to an `argparse` parser."""
    for name, (default, text, *choices) in options.items():
        flag = "--" + name.replace("_", "-")
        if default is False:
            parser.add_argument(flag, action="store_true", help=text)
            continue
        kind = type((default or [""])[0] if isinstance(default, list)
                    else default)
        if text != argparse.SUPPRESS:
            text += " Defaults to %(default)s."
        parser.add_argument(
            flag, default=default, help=text,
            type=None if default is None else kind,
            nargs="+" if isinstance(default, list) else None,
            choices=choices[0] if choices else None,
        )


def run(module, argv, parser, measure, quick=None, backends=BACKENDS):
    """Parses `argv` and runs `measure(args)` on each selected backend.

    The loaded backend runs in this process (unless `--threads` asks for a
    cap this process was not started with); each other one in `python -m
    module ... --backend NAME`. `measure` returns the path of the JSON it
    wrote; `quick` holds the values `--quick` sets. Returns the paths.
    """
    import keras

    module = module_name(module)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(parser, argv, quick)
    capped = all(os.environ.get(k) == v
                 for k, v in thread_environment(args.threads).items())
    rest = [item for item, previous in zip(argv, [None, *argv])
            if item.split("=")[0] != "--backend" and previous != "--backend"]
    paths = []
    for backend in selected_backends(args, backends):
        if backend == keras.backend.backend() and capped:
            limit_threads(args.threads)
            path = measure(args)
            print(path, flush=True)
        else:
            stdout = run_module(module, rest + ["--backend", backend],
                                backend, args.threads)
            path = stdout.strip().splitlines()[-1]
        paths.append(path)
    return paths


def parse(parser, argv=None, quick=None):
    """`parser.parse_args(argv)`, with the values `quick` under `--quick`."""
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if getattr(args, "quick", False):
        vars(args).update(quick or {})
    return args


def module_name(module):
    """The importable name of `module` (`"__main__"` as run by `-m`)."""
    if module == "__main__":
        module = sys.modules["__main__"].__spec__.name
    return module.removesuffix(".__main__")


def selected_backends(args, backends=BACKENDS):
    """The backends named by `--backend`, in the order of `backends`."""
    names = args.backend or ["all"]
    return [name for name in backends if name in names or "all" in names]


def child_environment(backend, threads=None):
    """This environment with `KERAS_BACKEND`, a thread cap, quiet logs."""
    env = dict(os.environ, KERAS_BACKEND=backend)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.update(thread_environment(threads))
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO_ROOT] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    return env


def run_module(module, argv, backend, threads=None, env=None, timeout=None):
    """Runs `python -m module *argv` on `backend` (and `env`); its stdout.

    Raises:
        RuntimeError: if the process fails.
    """
    print(f"[{module}] {backend}: {' '.join(argv)}", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", module, *argv], stdout=subprocess.PIPE,
        env=dict(child_environment(backend, threads), **env or {}),
        text=True, timeout=timeout,
    )
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise RuntimeError(
            f"`{module}` failed on the {backend} backend (exit code "
            f"{done.returncode}); rerun `python -m {module} "
            f"{' '.join(argv)}` with KERAS_BACKEND={backend} to see why."
        )
    return done.stdout


def thread_environment(threads):
    """Environment variables capping every backend's threads (`0`: none)."""
    if not threads:
        return {}
    threads = str(int(threads))
    cap = ("--xla_cpu_multi_thread_eigen=false "
           f"intra_op_parallelism_threads={threads}")
    flags = os.environ.get("XLA_FLAGS", "").replace(cap, "").strip()
    return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
            "TF_NUM_INTRAOP_THREADS": threads, "TF_NUM_INTEROP_THREADS": "1",
            "XLA_FLAGS": f"{flags} {cap}".strip()}


def limit_threads(threads):
    """Caps the loaded backend's threads, as far as it still can be."""
    if not threads:
        return
    os.environ.update(thread_environment(threads))
    import keras

    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(int(threads))
    elif keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        try:  # Only before TensorFlow's first operation.
            tf.config.threading.set_intra_op_parallelism_threads(int(threads))
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:
            pass
