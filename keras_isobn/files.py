"""Files that a kill cannot tear, a folder lock, and the versions of a run.

`atomic_write()` leaves a file either whole or as it was, `exclusive()`
keeps a second process out of a run's folder, and `package_versions()`
records the software that produced a result.
"""

import contextlib
import fcntl
import os
import platform
import sys

import keras

__all__ = ["atomic_write", "exclusive", "package_versions"]


def atomic_write(path, content):
    """Writes a file that a kill leaves either whole or as it was.

    Writes to a path beside `path` with the same extension
    (`best.partial.keras` for `best.keras`, so that writers that check the
    extension accept it), then renames it to `path` in one step
    (`os.replace`).

    Args:
        path: The file to write; its folder is created if needed.
        content: A string (the file's text), or a callable that writes a
            whole file at the path it is given, e.g. `model.save` or
            `lambda p: np.savez(p, **arrays)`.

    Example:

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "results.json")
    >>> atomic_write(path, '{"accuracy": 0.9}')
    >>> open(path).read()
    '{"accuracy": 0.9}'
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    stem, extension = os.path.splitext(path)
    temporary = f"{stem}.partial{extension}"
    try:
        if isinstance(content, str):
            with open(temporary, "w") as file:
                file.write(content)
        else:
            content(temporary)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    os.replace(temporary, path)


@contextlib.contextmanager
def exclusive(directory):
    """Holds a lock on `directory` (POSIX); a second holder fails at once.

    Two runs writing to the same folder would corrupt each other's files.
    The lock (`fcntl.flock` on `directory/.lock`) is released when the
    context ends or the process dies, `SIGKILL` included.

    Args:
        directory: The folder, created if needed.

    Raises:
        RuntimeError: if another process holds the lock.

    Example:

    ```python
    with exclusive("runs/sst2"):
        ...  # Train, writing to runs/sst2 alone.
    ```
    """
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(
                f"Another process is using {directory}: wait for it to end, "
                "or use another folder."
            ) from None
        yield


def package_versions():
    """The versions of the software of this process, for a run's results.

    Returns:
        A dict of `python`, `keras_isobn`, `keras`, `keras_hub`,
        `tensorflow` and `numpy` (those imported) to their versions, with
        `backend` and `backend_version`.

    Example:

    >>> import keras
    >>> versions = package_versions()
    >>> versions["keras"] == keras.__version__
    True
    """
    names = ("keras_isobn", "keras", "keras_hub", "tensorflow", "numpy")
    versions = {
        name: sys.modules[name].__version__
        for name in names
        if name in sys.modules
    }
    backend = keras.backend.backend()
    return {
        "python": platform.python_version(),
        **versions,
        "backend": backend,
        "backend_version": sys.modules[backend].__version__,
    }
