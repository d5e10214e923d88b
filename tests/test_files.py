import errno
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_isobn import files
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
    # Each file with its checksum beside it.
    assert sorted(os.listdir(tmp_path)) == [
        "arrays.npz",
        "arrays.npz.sha256",
        "new",
    ]


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
    # No leftover.
    assert sorted(os.listdir(tmp_path)) == ["model.keras", "model.keras.sha256"]
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
    assert result.attempted >= 5 and result.failed == 0


def _read_text(path):
    with open(path) as file:
        return file.read()


def test_checksum_beside_each_file(tmp_path):
    path = str(tmp_path / "results.json")
    atomic_write(path, "whole")
    digest = files.file_digest(path)
    assert _read_text(files.checksum_path(path)) == f"{digest}  results.json\n"
    assert files.read_verified(path, _read_text) == "whole"
    assert files.verified(path)


@pytest.mark.parametrize("kind", ["truncate", "flip", "empty", "checksum"])
def test_a_damaged_file_is_set_aside_not_deleted(tmp_path, kind, capsys):
    path = str(tmp_path / "results.json")
    atomic_write(path, '{"accuracy": 0.9}')
    target = files.checksum_path(path) if kind == "checksum" else path
    content = _read_text(target)
    with open(target, "w") as file:
        file.write(
            {
                "truncate": content[:5],
                "flip": content.replace("9", "8"),
                "empty": "",
                "checksum": "not hex",
            }[kind]
        )
    assert not files.verified(path)
    # A reader that does not write: nothing renamed.
    with pytest.raises(files.DamagedFileError, match="results.json"):
        files.read_verified(path, _read_text, repair=False)
    assert os.path.exists(path)
    with pytest.raises(files.DamagedFileError) as info:
        files.read_verified(path, _read_text)
    assert info.value.paths == [path]
    assert not os.path.exists(path)
    assert os.path.exists(path + ".damaged")
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"Warning: {path} is damaged")
    # A second damaged one does not replace the first.
    atomic_write(path, "x")
    with open(path, "w") as file:
        file.write("y")
    assert files.set_aside(path) == path + ".damaged-2"
    assert sorted(os.listdir(tmp_path)) == [
        "results.json.damaged",
        "results.json.damaged-2",
        "results.json.damaged-2.sha256",
        "results.json.damaged.sha256",
    ]


def test_a_file_from_before_checksums(tmp_path):
    # Written by an older keras_isobn: accepted if it reads, then checked.
    path = str(tmp_path / "results.json")
    with open(path, "w") as file:
        file.write('{"a": 1}')

    def read_json(p):
        return json.loads(_read_text(p))

    assert files.read_verified(path, read_json, repair=False) == {"a": 1}
    assert not os.path.exists(files.checksum_path(path))
    assert files.read_verified(path, read_json) == {"a": 1}
    assert files.verified(path) and os.path.exists(files.checksum_path(path))
    torn = str(tmp_path / "torn.json")
    with open(torn, "w") as file:
        file.write('{"a": ')
    with pytest.raises(files.DamagedFileError, match="JSONDecodeError"):
        files.read_verified(torn, read_json)
    assert os.path.exists(torn + ".damaged")
    with pytest.raises(FileNotFoundError):
        files.read_verified(str(tmp_path / "none.json"), read_json)


def test_a_full_disk_keeps_the_previous_file(tmp_path, monkeypatch):
    path = str(tmp_path / "state.npz")
    atomic_write(path, lambda p: np.savez(p, a=np.arange(3)))
    before = open(path, "rb").read()

    def full(temporary):
        with open(temporary, "wb") as file:
            file.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(files.DiskFullError) as info:
        atomic_write(path, full)
    assert info.value.errno == errno.ENOSPC
    assert isinstance(info.value, OSError)
    assert str(info.value).startswith("The disk is full: could not write")
    assert path in str(info.value) and "\n" not in str(info.value)
    assert open(path, "rb").read() == before and files.verified(path)
    assert sorted(os.listdir(tmp_path)) == ["state.npz", "state.npz.sha256"]
    # Full while writing the checksum: the same.
    def no_space(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "file_digest", no_space)
    with pytest.raises(files.DiskFullError):
        atomic_write(path, "new")
    monkeypatch.undo()
    assert open(path, "rb").read() == before and files.verified(path)
    assert sorted(os.listdir(tmp_path)) == ["state.npz", "state.npz.sha256"]


def test_atomic_link(tmp_path):
    source = str(tmp_path / "state.npz")
    atomic_write(source, "contents")
    path = str(tmp_path / "best.npz")
    files.atomic_link(source, path)
    assert os.path.samefile(source, path)
    assert files.read_verified(path, _read_text) == "contents"
