"""`RunDirectory`: the output folder of one resumable training run."""

import json
import os
import shutil
import tempfile

from keras_isobn import distribution
from keras_isobn.callbacks import TrainingCheckpoint
from keras_isobn.files import atomic_write

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
        """The JSON file `name`, or `None` if there is none."""
        if not os.path.exists(self.path(name)):
            return None
        with open(self.path(name)) as file:
            return json.load(file)

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
        first epoch), so nothing half-written is kept. In a cluster, every
        process returns once that is done.
        """
        resuming = os.path.exists(checkpoint.state_path)
        if self.write and not resuming and os.path.isdir(self.directory):
            print(f"Removing {self.directory}, stopped in its first epoch.")
            shutil.rmtree(self.directory)
        distribution.barrier(f"start {self.directory}")
        return resuming

    def finish(self):
        """Removes the checkpoint's `backup/` once the results are saved."""
        if self.write:
            shutil.rmtree(self.path("backup"), ignore_errors=True)
