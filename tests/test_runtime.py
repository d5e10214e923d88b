import os
import platform
import subprocess
import sys
import textwrap

import keras
import pytest

from keras_isobn import runtime

REPO_ROOT = os.path.dirname(os.path.dirname(__file__))


def _run(code, **env):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        env={
            **{
                k: v
                for k, v in os.environ.items()
                if k != "TF_CPP_MIN_LOG_LEVEL"
            },
            "KERAS_BACKEND": keras.config.backend(),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "line",
    [
        "WARNING: All log messages before absl::InitializeLog() is called "
        "are written to STDERR",
        "I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on.",
        "I0000 00:00:1.0 1 cudart_stub.cc:31] Could not find cuda drivers on "
        "your machine, GPU will not be used.",
        "E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit: "
        "INTERNAL: CUDA error",
    ],
)
def test_startup_lines_are_known(line):
    assert runtime.STARTUP_LINES.search(line)


def test_tensorflow_imports_quietly_and_other_lines_stay():
    # A script that imports keras_isobn first: TensorFlow's start-up lines
    # go, a line written to standard error during its import stays.
    done = _run("""
        import sys
        import keras_isobn
        print("before", file=sys.stderr, flush=True)
        import tensorflow as tf
        print(len(tf.config.list_physical_devices("CPU")), flush=True)
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "1"
    assert done.stderr == "before\n"


def test_heavy_imports_run_with_the_collector_paused_then_frozen():
    done = _run("""
        import gc
        import sys

        import keras_isobn

        during = []
        gc.callbacks.append(
            lambda phase, info: during.append(1)
            if phase == "start" and "keras_hub" in sys.modules
            and sys.modules["keras_hub"].__spec__._initializing
            else None
        )
        import keras_hub
        print(len(during), gc.get_freeze_count() > 0, gc.isenabled())
        print(type(keras_hub.__loader__).__name__)
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    counts, loader = done.stdout.strip().splitlines()
    assert counts == "0 True True"
    assert loader != "_StartupLoader"  # An ordinary module once loaded.
    assert done.stderr == ""


GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_large_blocks_come_from_the_heap_after_reuse_freed_memory():
    # In its own process: the setting is process-wide. `hblks` counts the
    # blocks glibc maps on their own.
    done = _run("""
        import ctypes

        from keras_isobn import runtime

        class Info(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                "fsmblks", "uordblks", "fordblks", "keepcost")]

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Info
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]

        def mapped(size):
            before = libc.mallinfo2().hblks
            block = libc.malloc(size)
            count = libc.mallinfo2().hblks - before
            libc.free(block)
            return count

        # Freeing the first raises glibc's own threshold to its size: the
        # second is larger, so that glibc would map it too by default.
        before = mapped(24 * 2**20)
        print(before, runtime.reuse_freed_memory(), mapped(28 * 2**20))
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    # Mapped on its own by default (and unmapped when freed: its pages are
    # faulted in again at the next step); from the heap after the call.
    assert done.stdout.split() == ["1", "True", "0"]


def test_cache_compilations_does_nothing_off_jax_or_when_turned_off():
    # The tests' processes turn JAX's cache off (conftest.py).
    assert runtime.cache_compilations() is None


# A Keras train step on JAX, with the cache as the recipe sets it: the
# cache's hits, and a hash of the weights after the step.
_CACHED_STEP = """
    import hashlib

    import jax
    import numpy as np

    from keras_isobn import runtime

    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event)
        if event == "/jax/compilation_cache/cache_hits" else None
    )
    print(runtime.cache_compilations())
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    model.train_on_batch(np.ones((8, 4)), np.linspace(0, 1, 24).reshape(8, 3))
    weights = b"".join(w.tobytes() for w in model.get_weights())
    print(hashlib.sha256(weights).hexdigest())
    print(len(hits))
"""


@pytest.mark.skipif(
    keras.config.backend() != "jax", reason="JAX's compilation cache"
)
def test_jax_compilations_are_kept_and_a_damaged_entry_is_compiled_again(
    tmp_path,
):
    def run():
        done = _run(
            _CACHED_STEP,
            KERAS_BACKEND="jax",
            XDG_CACHE_HOME=str(tmp_path),
            JAX_ENABLE_COMPILATION_CACHE="true",
            JAX_COMPILATION_CACHE_DIR="",
        )
        assert done.returncode == 0, done.stderr[-3000:]
        directory, weights, hits = done.stdout.split()
        return directory, weights, int(hits), done.stderr

    cache = tmp_path / "keras_isobn" / "jax"
    directory, weights, hits, _ = run()
    assert directory == str(cache)
    entries = sorted(cache.glob("*-cache"))
    assert entries and hits == 0  # Every compilation kept.
    # A second process loads them all: the same step, bit for bit.
    assert run()[1:3] == (weights, len(entries))
    for entry in entries:
        entry.write_bytes(b"damaged")
    _, again, hits, stderr = run()
    assert (again, hits) == (weights, 0)  # Compiled, as without a cache.
    assert "Error reading persistent compilation cache entry" in stderr
