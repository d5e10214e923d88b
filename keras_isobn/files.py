"""Files that a kill cannot tear and a damage cannot hide; a folder lock.

`atomic_write()` leaves a file either whole or as it was, with the SHA-256
checksum of its contents beside it (`<name>.sha256`, in `sha256sum`'s
format); `read_verified()` reads a file back only if it still matches it,
and sets a damaged file aside (`<name>.damaged`), never deleting it.
`exclusive()` keeps a second process out of a run's folder, and
`package_versions()` records the software that produced a result.
"""

import contextlib
import errno
import fcntl
import hashlib
import os
import platform
import shutil
import sys

import keras

__all__ = [
    "DamagedFileError",
    "DiskFullError",
    "atomic_link",
    "atomic_write",
    "checksum_path",
    "exclusive",
    "file_digest",
    "package_versions",
    "read_verified",
    "set_aside",
    "verified",
    "write_checksum",
]

CHECKSUM_SUFFIX = ".sha256"
DAMAGED_SUFFIX = ".damaged"


class DamagedFileError(ValueError):
    """A file does not hold what was written to it.

    Attributes:
        paths: The damaged files (where they were found).
    """

    def __init__(self, message, paths=(), reason=None):
        super().__init__(message)
        self.paths = list(paths)
        self.reason = reason


class DiskFullError(OSError):
    """A write found no space left on the disk (`errno.ENOSPC`)."""

    def __str__(self):
        return self.strerror


def checksum_path(path):
    """The path of the checksum written beside `path`: `<path>.sha256`."""
    return path + CHECKSUM_SUFFIX


def file_digest(path):
    """The SHA-256 digest of the file at `path`, in hexadecimal."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _partial(path):
    stem, extension = os.path.splitext(path)
    return f"{stem}.partial{extension}"


def _disk_full(error, path):
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return DiskFullError(
            errno.ENOSPC,
            f"The disk is full: could not write {path}; the previous file, "
            "if any, is kept. Free some space and run again.",
        )
    return None


def write_checksum(path, digest=None):
    """Writes `<path>.sha256` atomically, of `digest` or of the file.

    Args:
        path: The file whose checksum to write.
        digest: Optional hexadecimal SHA-256 digest of the file (computed
            when `None`).
    """
    digest = digest or file_digest(path)
    line = f"{digest}  {os.path.basename(path)}\n"
    _replace(checksum_path(path), lambda p: _write_text(p, line))


def _write_text(path, text):
    with open(path, "w") as file:
        file.write(text)


def _replace(path, write):
    """`write(temporary)`, then renames it to `path` (the old one kept on
    failure, a full disk raised as `DiskFullError`)."""
    temporary = _partial(path)
    if os.path.lexists(temporary):  # Left by a kill.
        os.remove(temporary)
    try:
        write(temporary)
    except BaseException as error:
        if os.path.lexists(temporary):
            os.remove(temporary)
        full = _disk_full(error, path)
        if full is not None:
            raise full from None
        raise
    os.replace(temporary, path)


def atomic_write(path, content):
    """Writes a file that a kill leaves either whole or as it was.

    Writes to a path beside `path` with the same extension
    (`best.partial.keras` for `best.keras`, so that writers that check the
    extension accept it), then renames it to `path` in one step
    (`os.replace`), and then writes the SHA-256 checksum of its contents
    beside it, `<path>.sha256`, the same way (`read_verified()` checks it).
    A write that fails, a full disk included, leaves the previous file and
    checksum as they were and removes the temporary file.

    Args:
        path: The file to write; its folder is created if needed.
        content: A string (the file's text), or a callable that writes a
            whole file at the path it is given, e.g. `model.save` or
            `lambda p: np.savez(p, **arrays)`.

    Raises:
        DiskFullError: if the disk is full (an `OSError`, `errno.ENOSPC`),
            with one line naming `path`.

    Example:

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "results.json")
    >>> atomic_write(path, '{"accuracy": 0.9}')
    >>> open(path).read()
    '{"accuracy": 0.9}'
    >>> sorted(os.listdir(os.path.dirname(path)))
    ['results.json', 'results.json.sha256']
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = _partial(path)
    sidecar = checksum_path(path)
    sidecar_temporary = _partial(sidecar)
    try:
        if isinstance(content, str):
            _write_text(temporary, content)
        else:
            content(temporary)
        line = f"{file_digest(temporary)}  {os.path.basename(path)}\n"
        _write_text(sidecar_temporary, line)
    except BaseException as error:
        for leftover in (temporary, sidecar_temporary):
            if os.path.lexists(leftover):
                os.remove(leftover)
        full = _disk_full(error, path)
        if full is not None:
            raise full from None
        raise
    # Both written: the renames need no space. A kill between them leaves
    # a file that its old checksum calls damaged: read as such, not as
    # whole.
    os.replace(temporary, path)
    os.replace(sidecar_temporary, sidecar)


def atomic_link(source, path):
    """Makes `path` the file `source` is, atomically, with its checksum.

    A hard link (no copy of the data), or a copy where the file system has
    none; it replaces `path` in one step, then `<path>.sha256` is written:
    the checksum `source` has beside it (so a damaged `source` gives a
    damaged `path`), else that of its contents.

    Args:
        source: An existing file.
        path: The second name to give it.
    """

    def link(temporary):
        try:
            os.link(source, temporary)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise
            # No hard links here (e.g. FAT, some network drives).
            shutil.copyfile(source, temporary)

    digest = _recorded_digest(source) or file_digest(source)
    _replace(path, link)
    write_checksum(path, digest)


def set_aside(path, reason="it does not match its checksum"):
    """Renames a damaged file (and its checksum) out of the way.

    The file becomes `<path>.damaged` (`<path>.damaged-2`, ... if that is
    taken): nothing is deleted, and it is never read again. One line on
    standard error names it.

    Args:
        path: The damaged file.
        reason: What is wrong with it, for the line on standard error.

    Returns:
        The path it has now.
    """
    target, number = path + DAMAGED_SUFFIX, 1
    while os.path.lexists(target) or os.path.lexists(checksum_path(target)):
        number += 1
        target = f"{path}{DAMAGED_SUFFIX}-{number}"
    os.replace(path, target)
    if os.path.exists(checksum_path(path)):
        os.replace(checksum_path(path), checksum_path(target))
    print(
        f"Warning: {path} is damaged ({reason}); kept as {target}.",
        file=sys.stderr,
        flush=True,
    )
    return target


def _recorded_digest(path):
    """The digest in the checksum file of `path`; `None` if there is none,
    `""` if it is unreadable."""
    try:
        with open(checksum_path(path)) as file:
            return file.read().split()[0]
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, IndexError):
        return ""


def _damage(path):
    """Why `path` does not verify, or `None` if it does or has no checksum."""
    expected = _recorded_digest(path)
    if expected is None:
        return None
    if not expected:
        return "its checksum file is unreadable"
    try:
        if file_digest(path) != expected:
            return "it does not match its checksum"
    except OSError as error:
        return f"it cannot be read: {error.strerror or error}"
    return None


def read_verified(path, read, repair=True):
    """Reads a file written by `atomic_write()` if it is whole.

    A file whose `<path>.sha256` does not match is damaged: it is set aside
    (`set_aside()`) and `DamagedFileError` raised. A file without a
    checksum (written before keras_isobn wrote checksums) is accepted if
    `read` reads it without error, and its checksum is written then;
    otherwise it is damaged too.

    Args:
        path: The file. It must exist.
        read: `read(path)` returns its contents, e.g. `json.load` of the
            opened file, and raises on a file it cannot read.
        repair: Whether to set damaged files aside and write the checksum
            of a file without one. `False` in the processes of a cluster
            that do not write. Defaults to `True`.

    Returns:
        `read(path)`.

    Raises:
        DamagedFileError: naming `path` (and where it was set aside).

    Example:

    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "results.json")
    >>> atomic_write(path, '{"accuracy": 0.9}')
    >>> read_verified(path, lambda p: json.load(open(p)))
    {'accuracy': 0.9}
    """
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "No such file", path)
    reason = _damage(path)
    if reason is None and not os.path.exists(checksum_path(path)):
        try:  # From before checksums: whole if it reads.
            contents = read(path)
        except Exception as error:
            reason = f"it cannot be read: {type(error).__name__}: {error}"
        else:
            if repair:
                write_checksum(path)
            return contents
    if reason is not None:
        where = f"; kept as {set_aside(path, reason)}" if repair else ""
        raise DamagedFileError(
            f"{path} is damaged: {reason}{where}.", [path], reason
        )
    return read(path)


def verified(path):
    """Whether `path` matches its checksum (`True` without one)."""
    return _damage(path) is None


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
