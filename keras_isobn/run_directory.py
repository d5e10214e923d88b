"""`RunDirectory`: the output folder of one resumable training run."""

import csv
import json
import os
import tempfile
import zipfile

import numpy as np

from keras_isobn import distribution
from keras_isobn.callbacks import TrainingCheckpoint
from keras_isobn.files import DAMAGED_SUFFIX
from keras_isobn.files import DamagedFileError
from keras_isobn.files import atomic_write
from keras_isobn.files import read_verified

__all__ = ["RunDirectory"]


class RunDirectory:
    """The output folder of one training run, resumable, with one writer.

    A run writes its files through `save()` (atomically) and its state
    through `checkpoint()`; a later start reads `load_json()` to skip a
    finished run, and `start()` says whether to resume. In a cluster of
    processes, which all compute the same results, only the chief writes
    (`write=keras_isobn.distribution.is_chief()`, the default): the others
    write nothing and read what the chief wrote.

    Args:
        directory: The run's folder.
        write: Whether this process writes. Defaults to
            `keras_isobn.distribution.is_chief()` (`True` in one process).

    Example:

    ```python
    run_dir = RunDirectory("runs/sst2/seed-1")
    results = run_dir.load_json("results.json")  # None until finished.
    checkpoint = run_dir.checkpoint("val_accuracy")
    resuming = run_dir.start(checkpoint)
    ...  # fit with the checkpoint, then:
    run_dir.save("results.json", json.dumps(results))
    run_dir.finish()
    ```
    """

    def __init__(self, directory, write=None):
        self.directory = directory
        self.write = distribution.is_chief() if write is None else write

    def path(self, name):
        """The path of the file `name` in the run's folder."""
        return os.path.join(self.directory, name)

    def load_json(self, name):
        """The JSON file `name`, or `None` if there is none or it is damaged.

        A damaged file (one that does not match its checksum) is set aside
        as `<name>.damaged`, with a line on standard error, to be written
        again.
        """
        try:
            return self.read(name)
        except DamagedFileError:
            return None

    def read(self, name):
        """The contents of the file `name`, checked against its checksum.

        JSON files are parsed, `.npz` files read into a dict of arrays,
        CSV files into a list of rows (dicts); other files (`.keras`, ...)
        are checked whole and `None` is returned.

        Returns:
            The contents, or `None` if there is no such file.

        Raises:
            DamagedFileError: if it is damaged (set aside by the writer).
        """
        if not os.path.exists(self.path(name)):
            return None
        return read_verified(self.path(name), _reader(name), self.write)

    def damaged(self, names):
        """Which of the files `names` (those present) are damaged.

        Each is checked (`read()`); the damaged ones are set aside.
        """
        damaged = []
        for name in names:
            try:
                self.read(name)
            except DamagedFileError:
                damaged.append(name)
        return damaged

    def save(self, name, content):
        """`atomic_write(self.path(name), content)` by the writer.

        The other processes of a cluster call a callable `content` too, on
        a path in a private temporary folder deleted at once: writing a
        model (`model.save`) reads its variables in a computation of all
        the processes, which waits for each of them.
        """
        if self.write:
            atomic_write(self.path(name), content)
        elif callable(content):
            with tempfile.TemporaryDirectory() as directory:
                content(os.path.join(directory, os.path.basename(name)))

    def checkpoint(self, monitor=None, mode="max"):
        """A `TrainingCheckpoint` in `backup/`, its logs in `epochs.csv`."""
        return TrainingCheckpoint(
            self.path("backup"),
            monitor,
            mode,
            self.path("epochs.csv"),
            write=self.write,
        )

    def start(self, checkpoint):
        """Whether the run resumes: if `checkpoint` saved an epoch.

        Otherwise the writer empties the folder (of a run stopped in its
        first epoch), so nothing half-written is kept, but for the files
        set aside as damaged (`*.damaged`). In a cluster, every process
        returns once that is done.
        """
        resuming = bool(checkpoint.state_paths())
        if self.write and not resuming and os.path.isdir(self.directory):
            print(f"Starting {self.directory} afresh: it holds no saved "
                  "epoch (files set aside as damaged stay).")
            _empty(self.directory)
        distribution.barrier(f"start {self.directory}")
        return resuming

    def restart(self):
        """Keeps the folder, renamed `<folder>.restarted`, for a fresh start.

        (`<folder>.restarted-2`, ... if that is taken.) In a cluster, every
        process returns once the writer renamed it.

        Returns:
            The folder's new name, or `None` if there was no folder.
        """
        target = None
        if self.write and os.path.isdir(self.directory):
            target, number = f"{self.directory}.restarted", 1
            while os.path.lexists(target):
                number += 1
                target = f"{self.directory}.restarted-{number}"
            os.replace(self.directory, target)
        distribution.barrier(f"restart {self.directory}")
        return target

    def finish(self):
        """Removes the checkpoint's `backup/` once the results are saved
        (but for the files set aside as damaged)."""
        if self.write and os.path.isdir(self.path("backup")):
            _empty(self.path("backup"))


def _empty(directory):
    """Removes what `directory` holds, but for files set aside as damaged;
    then the folder itself, if nothing is left."""
    for entry in os.scandir(directory):
        if DAMAGED_SUFFIX in entry.name:
            continue
        if entry.is_dir(follow_symlinks=False):
            _empty(entry.path)
        else:
            os.remove(entry.path)
    if not os.listdir(directory):
        os.rmdir(directory)


def _read_json(path):
    with open(path) as file:
        return json.load(file)


def _read_npz(path):
    with np.load(path) as arrays:
        return {name: arrays[name] for name in arrays.files}


def _read_csv(path):
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows or None in rows[-1] or None in rows[-1].values():
        raise ValueError("a row is missing or cut short")
    return rows


def _read_zip(path):
    with zipfile.ZipFile(path) as archive:
        if (name := archive.testzip()) is not None:
            raise ValueError(f"{name} is damaged")


def _reader(name):
    extension = os.path.splitext(name)[1]
    return {".json": _read_json, ".npz": _read_npz, ".csv": _read_csv}.get(
        extension, _read_zip
    )
