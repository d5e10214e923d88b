"""What every benchmark shares: machine info, JSON, backends, timing."""

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

BACKENDS = ("tensorflow", "jax", "torch")
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGES = (
    "keras",
    "keras-hub",
    "keras-isobn",
    "tensorflow",
    "jax",
    "jaxlib",
    "torch",
    "numpy",
)


def add_common_arguments(parser, default_threads=0):
    """Adds `--backend`, `--output`, `--threads` and `--quick` to a parser."""
    parser.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS + ("all",),
        help="Keras backend to measure; repeat for several, `all` for "
        "the three. Each backend other than the one already loaded runs "
        "in its own subprocess. Defaults to all.",
    )
    parser.add_argument(
        "--output",
        default=RESULTS_DIR,
        help="Folder for the JSON results. Defaults to %(default)s.",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=default_threads,
        help="CPU threads of the numerical libraries (0: their default). "
        "Defaults to %(default)s.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="Tiny sizes and few repeats: checks that the script runs, "
        "measures nothing worth keeping.",
    )


def selected_backends(args):
    """The backends named by `--backend`, in a fixed order."""
    names = args.backend or ["all"]
    if "all" in names:
        return list(BACKENDS)
    return [name for name in BACKENDS if name in names]


def run_on_backends(module, argv, args, run):
    """Runs `run(args)` once per selected backend and returns the results.

    The backend Keras already loaded runs in this process (unless
    `args.threads` asks for a thread cap this process was not started
    with); every other one in a subprocess `python -m module ...
    --backend NAME` with `KERAS_BACKEND` and the thread cap set before
    Keras is imported, whose JSON file is then read back.

    Args:
        module: Module name of the calling script, e.g.
            `"benchmarks.layer_cost"`.
        argv: The script's own argument list.
        args: Its parsed arguments (for `--backend` and `--output`).
        run: Function of `args` that measures on the loaded backend and
            returns the path of the JSON file it wrote (printed last on
            stdout, where the parent process reads it).

    Returns:
        The list of JSON file paths, one per backend.
    """
    import keras

    loaded = keras.backend.backend()
    threads = thread_environment(getattr(args, "threads", None))
    # A thread cap only holds if set before the backend started.
    capped = all(os.environ.get(k) == v for k, v in threads.items())
    rest = _without_backend_arguments(list(argv or []))
    paths = []
    for backend in selected_backends(args):
        if backend == loaded and capped:
            path = run(args)
            print(path, flush=True)
            paths.append(path)
            continue
        env = dict(os.environ, KERAS_BACKEND=backend)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        env.update(thread_environment(getattr(args, "threads", None)))
        env["PYTHONPATH"] = os.pathsep.join(
            [REPO_ROOT] + [p for p in [env.get("PYTHONPATH")] if p]
        )
        command = [sys.executable, "-m", module, *rest, "--backend", backend]
        print(f"[{module}] {backend}: {' '.join(command[1:])}", flush=True)
        done = subprocess.run(
            command, env=env, stdout=subprocess.PIPE, text=True
        )
        sys.stdout.write(done.stdout)
        if done.returncode != 0:
            raise RuntimeError(
                f"`{module}` failed on the {backend} backend (exit code "
                f"{done.returncode}); run it alone with `--backend "
                f"{backend}` to see why."
            )
        paths.append(done.stdout.strip().splitlines()[-1])
    return paths


def thread_environment(threads):
    """Environment variables that cap the threads of every backend.

    Args:
        threads: Number of CPU threads for the numerical libraries, or
            `None`/`0` to leave their defaults.

    Returns:
        A dict of environment variables, to set before the backend starts.
    """
    if not threads:
        return {}
    threads = str(int(threads))
    flags = os.environ.get("XLA_FLAGS", "")
    cap = (
        f"--xla_cpu_multi_thread_eigen=false "
        f"intra_op_parallelism_threads={threads}"
    )
    if cap in flags:
        flags = flags.replace(cap, "")
    return {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TF_NUM_INTRAOP_THREADS": threads,
        "TF_NUM_INTEROP_THREADS": "1",
        "XLA_FLAGS": f"{flags.strip()} {cap}".strip(),
    }


def limit_threads(threads):
    """Caps the threads of the loaded backend, as far as it still can be.

    PyTorch and JAX (before its first computation) always can; TensorFlow
    only before its first operation, which a subprocess started by
    `run_on_backends` arranges through `thread_environment`.
    """
    if not threads:
        return
    os.environ.update(thread_environment(threads))
    import keras

    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        torch.set_num_threads(int(threads))
    elif backend == "tensorflow":
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(int(threads))
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:
            pass


def _without_backend_arguments(argv):
    kept = []
    skip = False
    for item in argv:
        if skip:
            skip = False
        elif item == "--backend":
            skip = True
        elif not item.startswith("--backend="):
            kept.append(item)
    return kept


def environment():
    """Machine, versions, backend and date of a run, for its JSON."""
    import keras

    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "backend": keras.backend.backend(),
        "devices": _devices(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_count_usable": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "python": platform.python_version(),
        "versions": versions,
        "git_commit": _git_commit(),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git_commit():
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


def _devices():
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return [f"{d.platform}:{d.device_kind}" for d in jax.devices()]
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return [
                f"cuda:{torch.cuda.get_device_name(i)}"
                for i in range(torch.cuda.device_count())
            ]
        return ["cpu"]
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices()]


def accelerator():
    """`"gpu"` if the loaded backend computes on a GPU, else `"cpu"`."""
    devices = " ".join(_devices()).lower()
    return "gpu" if ("gpu" in devices or "cuda" in devices) else "cpu"


def write_json(path, payload):
    """Writes `payload` as indented JSON (NaN written as null) and
    returns `path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(_plain(payload), f, indent=1, allow_nan=False)
        f.write("\n")
    return path


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def summarize(times):
    """Median, quartiles and count of a list of seconds."""
    times = np.asarray(times, dtype="float64")
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return {
        "median_s": median,
        "q1_s": q1,
        "q3_s": q3,
        "min_s": times.min(),
        "count": int(times.size),
    }


def time_interleaved(
    functions,
    repeats,
    min_block_s=0.02,
    warmup=2,
    max_number=1000,
    max_seconds=None,
    min_repeats=3,
):
    """Median time per call of several functions, measured in turn.

    Each function is called `warmup` times (compilation), then timed in
    blocks of `number` calls (chosen so a block lasts about
    `min_block_s`), `repeats` blocks each. The blocks of the different
    functions alternate, in a rotating order, so that a change of load
    on a shared machine hits all of them alike.

    Args:
        functions: Dict of name to a function of no argument that runs
            one call and waits for its result.
        repeats: Number of timed blocks per function.
        min_block_s: Target duration of one block, in seconds.
        warmup: Untimed calls before timing.
        max_number: Most calls in one block.
        max_seconds: Optional time budget per function: a function whose
            `repeats` blocks would take longer gets fewer (at least
            `min_repeats`), timed in the first rounds.
        min_repeats: Fewest blocks per function under `max_seconds`.

    Returns:
        Dict of name to `summarize()` of its seconds per call, plus
        `"number"`, the calls per block, and `"compile_s"`, the time of
        the first call.
    """
    numbers = {}
    counts = {}
    compile_s = {}
    for name, function in functions.items():
        start = time.perf_counter()
        function()
        compile_s[name] = time.perf_counter() - start
        for _ in range(max(warmup - 1, 0)):
            function()
        start = time.perf_counter()
        function()
        once = max(time.perf_counter() - start, 1e-7)
        numbers[name] = int(min(max_number, max(1, min_block_s // once)))
        counts[name] = repeats
        if max_seconds is not None:
            block = once * numbers[name]
            counts[name] = int(
                min(repeats, max(min_repeats, max_seconds // block))
            )
    names = list(functions)
    times = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            if len(times[name]) >= counts[name]:
                continue
            function, number = functions[name], numbers[name]
            start = time.perf_counter()
            for _ in range(number):
                function()
            times[name].append((time.perf_counter() - start) / number)
    return {
        name: dict(
            summarize(times[name]),
            number=numbers[name],
            compile_s=compile_s[name],
        )
        for name in names
    }
