import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_isobn.files import atomic_write
from keras_isobn.files import exclusive
from keras_isobn.files import package_versions


def test_atomic_write_text_and_callable(tmp_path):
    path = str(tmp_path / "new" / "results.json")
    atomic_write(path, '{"accuracy": 0.9}')
    with open(path) as file:
        assert file.read() == '{"accuracy": 0.9}'
    atomic_write(path, "second")
    with open(path) as file:
        assert file.read() == "second"

    seen = []

    def writer(temporary):
        seen.append(temporary)
        np.savez(temporary, a=np.arange(3))

    arrays_path = str(tmp_path / "arrays.npz")
    atomic_write(arrays_path, writer)
    assert seen == [str(tmp_path / "arrays.partial.npz")]
    with np.load(arrays_path) as arrays:
        np.testing.assert_array_equal(arrays["a"], np.arange(3))
    assert sorted(os.listdir(tmp_path)) == ["arrays.npz", "new"]


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    path = str(tmp_path / "model.keras")

    def torn(temporary):
        with open(temporary, "w") as file:
            file.write("half")
        raise KeyboardInterrupt  # E.g. Ctrl-C in the middle of a save.

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, torn)
    assert not os.path.exists(path)

    atomic_write(path, "whole")
    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, torn)
    with open(path) as file:
        assert file.read() == "whole"
    assert sorted(os.listdir(tmp_path)) == ["model.keras"]  # No leftover.
    # A later write succeeds.
    atomic_write(path, "new")
    with open(path) as file:
        assert file.read() == "new"


# Runs in another process: tries the lock, then (after a line on stdin)
# tries it again, then holds it until killed.
LOCKER = textwrap.dedent(
    """
    import sys
    import time

    from keras_isobn.files import exclusive

    def attempt():
        try:
            with exclusive(sys.argv[1]):
                return "acquired"
        except RuntimeError as error:
            return "refused: " + str(error)

    print(attempt(), flush=True)
    sys.stdin.readline()
    print(attempt(), flush=True)
    with exclusive(sys.argv[1]):
        print("holding", flush=True)
        time.sleep(300)
    """
)


def test_exclusive_across_processes(tmp_path):
    directory = str(tmp_path / "run")
    process = subprocess.Popen(
        [sys.executable, "-c", LOCKER, directory],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    try:
        with exclusive(directory):
            # Held here: the other process is refused.
            line = process.stdout.readline().strip()
            assert line.startswith("refused: Another process is using")
            assert directory in line
        # Released: the other process gets it, then holds it.
        process.stdin.write("\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "acquired"
        assert process.stdout.readline().strip() == "holding"
        with pytest.raises(RuntimeError, match="Another process"):
            with exclusive(directory):
                pass
        # A killed holder releases the lock.
        process.kill()
        process.wait(timeout=60)
        with exclusive(directory):
            pass
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)


def test_package_versions():
    versions = package_versions()
    assert versions["backend"] == keras.backend.backend()
    assert versions["keras"] == keras.__version__
    assert {"python", "numpy", "keras_isobn", "backend_version"} <= set(
        versions
    )


def test_docstring_examples():
    import doctest

    import keras_isobn.files

    result = doctest.testmod(keras_isobn.files)
    assert result.attempted >= 3 and result.failed == 0
