"""A quiet and quick start for the commands of `keras_isobn`.

`import keras_isobn` calls `quiet_startup()` before it imports Keras, so
`python -m keras_isobn`, `python recipes/glue.py` and any script that
imports `keras_isobn` first start without TensorFlow's start-up lines and
import Keras, KerasHub and the backends without the garbage collector
going over what they make again and again. Two settings the recipe makes
before training: `reuse_freed_memory()` keeps the memory each step frees
for the next step (glibc), and `cache_compilations()` keeps JAX's compiled
steps on disk for the runs that follow.
"""

import contextlib
import ctypes
import gc
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

__all__ = [
    "STARTUP_LINES",
    "cache_compilations",
    "quiet_startup",
    "reuse_freed_memory",
]

# TensorFlow's lines at import and device discovery on a CPU machine. Its
# shared libraries log them before `absl::InitializeLog()`, so
# TF_CPP_MIN_LOG_LEVEL does not silence them, and two libraries (the core
# and the profiler plugin) each print their own copy.
STARTUP_LINES = re.compile(
    "|".join(
        (
            r"All log messages before absl::InitializeLog\(\) is called",
            r"oneDNN custom operations are on",
            r"Could not find cuda drivers on your machine",
            r"This TensorFlow binary is optimized to use available CPU",
            r"rebuild TensorFlow with the appropriate compiler flags",
            r"failed call to cuInit",
            r"Unable to register cu(DNN|FFT|BLAS) factory",
            r"computation placer already registered",
            r"TF-TRT Warning: Could not find TensorRT",
        )
    )
)
# Imported with the collector paused, then frozen (`gc.freeze`): their
# millions of long-lived objects are never traversed again, at exit
# included. Measured on 2 CPU cores, PyTorch backend, `python -c "import
# keras, keras_hub"`: about 10 s with the collector on, 6 s paused and
# frozen (3 runs each).
_HEAVY_PACKAGES = ("jax", "keras", "keras_hub", "tensorflow", "torch")


def quiet_startup():
    """Silences TensorFlow's start-up lines and speeds up heavy imports.

    Call it before Keras, KerasHub or a backend is imported (`import
    keras_isobn` does); it acts on the packages not imported yet, once.

    - While TensorFlow imports and lists its devices, the lines matching
      `STARTUP_LINES` (oneDNN, CUDA stub, CPU features, `cuInit` failure,
      printed twice) are dropped from standard error; every other line is
      kept, in order. TensorFlow's log level is left as it is.
    - While Keras, KerasHub, TensorFlow, JAX or PyTorch import, the
      garbage collector is paused; what they made is then frozen.

    Example:

    ```python
    import keras_isobn  # Calls `quiet_startup()`, before importing Keras.
    import keras  # On TensorFlow: no oneDNN, CUDA stub or cuInit line.
    ```
    """
    if not any(isinstance(f, _StartupFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StartupFinder())


# glibc's `mallopt` parameters, and the largest mmap threshold it accepts
# on 64-bit systems (`DEFAULT_MMAP_THRESHOLD_MAX`).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 * 2**20


def reuse_freed_memory():
    """Keeps the memory a training step frees for the next one (glibc).

    By default glibc's `malloc` maps each block over a threshold on its own
    (128 KiB at first, raised as such blocks are freed) and gives freed
    memory at the top of the heap back to the system, so a step that makes
    and frees the same megabyte-sized tensors as the last can fault in
    fresh zeroed pages for them, every step. This sets glibc's mmap
    threshold to its maximum (32 MiB) and its trim threshold to 1 GiB, as
    the environment variables `MALLOC_MMAP_THRESHOLD_` and
    `MALLOC_TRIM_THRESHOLD_` together would: blocks under 32 MiB come from
    the heap, and freed memory stays in the process for reuse (its resident
    size stays near its peak). The recipe calls it; it acts on the whole
    process, so the library does not call it on import: call it in your
    own training script for the same effect. Measured on 2 CPU cores:
    IsoBN's eager PyTorch train step, in a script of its own, 2.8x faster;
    the GLUE recipe's JAX job about 5% faster, its TensorFlow and PyTorch
    jobs within noise (`benchmarks/results/ANALYSIS.md`).

    Returns:
        Whether both settings were applied: `False` where the C library is
        not glibc (macOS, musl) or refused them.

    Example:

    ```python
    from keras_isobn import runtime
    runtime.reuse_freed_memory()  # Before training, once per process.
    ```
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # Not glibc.
        return False
    mmap = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    return bool(mmap and mallopt(_M_TRIM_THRESHOLD, 2**30))


def cache_compilations(directory=None):
    """Keeps JAX's compiled functions on disk for the runs that follow.

    On the JAX backend each model compiles its train and predict steps with
    XLA, once per batch shape, and its initializers once per weight shape,
    in every process: a quarter of the GLUE recipe's MiniLM job on 2 CPU
    cores. This turns on JAX's persistent compilation cache for every
    compilation (none is too quick to keep), so a later run of the same
    model and shapes (the next seed of a grid, in the same process or not,
    a resumed run, the same job again) loads each executable instead of
    compiling it: that job's second run took 82 s against 100 s
    (`benchmarks/results/ANALYSIS.md`). The executables are the ones XLA
    compiles, so results are bit-identical; an entry that cannot be read
    (a damaged file) is compiled again, with a warning. JAX decides
    whether to use the cache at its first compilation: call this before
    the process computes anything. The recipe calls it. Entries are kept
    until the directory is deleted (a few MB per model and batch shape).

    Args:
        directory: Where the executables are kept. Default: JAX's own
            setting (`JAX_COMPILATION_CACHE_DIR`) if any, else
            `keras_isobn/jax` under `XDG_CACHE_HOME` (`~/.cache`).

    Returns:
        The cache directory, or `None` where nothing was set: a backend
        other than JAX (TensorFlow and PyTorch run the recipe's steps
        without ahead-of-time compilation), or JAX's cache turned off
        (`JAX_ENABLE_COMPILATION_CACHE=false`).

    Example:

    ```python
    from keras_isobn import runtime
    runtime.cache_compilations()  # Before the first JAX computation.
    ```
    """
    import keras

    if keras.config.backend() != "jax":
        return None
    import jax

    if not jax.config.jax_enable_compilation_cache:
        return None
    directory = directory or jax.config.jax_compilation_cache_dir
    if not directory:
        cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(
            os.path.expanduser("~"), ".cache"
        )
        directory = os.path.join(cache_home, "keras_isobn", "jax")
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    return directory


class _StartupFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of each heavy top-level package."""

    def __init__(self):
        self._finding = set()

    def find_spec(self, name, path=None, target=None):
        if name not in _HEAVY_PACKAGES or name in self._finding:
            return None
        self._finding.add(name)  # The other finders find it.
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding.discard(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _StartupLoader(spec.loader)
        return spec


class _StartupLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):  # Resources and the like: the real loader.
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The module as any other, once loaded.
        module.__loader__ = module.__spec__.loader = self._loader
        outermost = gc.isenabled()
        gc.disable()
        try:
            if module.__name__ != "tensorflow":
                self._loader.exec_module(module)
                return
            with _dropped_lines(STARTUP_LINES):
                self._loader.exec_module(module)
                module.config.list_physical_devices()  # cuInit, if any.
        finally:
            if outermost:
                gc.freeze()
                gc.enable()


@contextlib.contextmanager
def _dropped_lines(pattern):
    """Standard error, less the lines matching `pattern`, in the block."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # No file descriptor 2: nothing to filter.
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", errors="replace")
            kept = [
                line
                for line in text.splitlines(keepends=True)
                if not pattern.search(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
