"""Fine-tuning that a kill cannot change: seeded batches, exact checkpoints.

A run killed at any point (`SIGKILL` included) and started again ends with
the same weights, IsoBN statistics, losses and metrics as a run never
interrupted, when it

- draws its batches from `SeededBatches`, whose order is a function of the
  seed and the epoch (not of how often a pipeline was restarted);
- restores, before `fit`, the state that `TrainingCheckpoint` saved at the
  last epoch end: every model variable (IsoBN statistics and the dropout
  layers' random-seed states included) and every optimizer variable, written
  atomically (to a temporary file, then renamed), so a kill never leaves a
  torn file;
- passes `initial_epoch=checkpoint.initial_epoch` to `fit`, and gives
  `ResumableEarlyStopping` the logs of the epochs already run.

An epoch cut short is run again from its start.

With several processes (`keras_isobn.distribution.join_cluster()`), every
process runs the same program: `SeededBatches.as_tf_dataset()` gives each
its share of the same global batches (Keras shards the dataset by process),
and `TrainingCheckpoint(..., write=is_chief())` lets the chief alone write,
in a folder every process reads (the same disk, or a shared file system).
Example:

```python
checkpoint = TrainingCheckpoint("run/state", monitor="val_accuracy")
checkpoint.restore(model)  # Nothing to restore the first time.
batches = SeededBatches(
    x, y, batch_size=32, seed=1, epochs=3,
    initial_epoch=checkpoint.initial_epoch,
)
model.fit(
    batches,  # `batches.as_tf_dataset()` for a KerasHub task.
    epochs=3,
    initial_epoch=checkpoint.initial_epoch,
    steps_per_epoch=batches.steps_per_epoch,
    shuffle=False,  # Else Keras shuffles the batches of all epochs.
    callbacks=[checkpoint],
)
checkpoint.restore_best(model)  # The weights of the best epoch.
```
"""

import contextlib
import csv
import fcntl
import functools
import json
import math
import os
import platform
import shutil
import sys
import tempfile

import keras
import numpy as np

from keras_isobn import distribution


class SeededBatches(keras.utils.PyDataset):
    """Shuffled batches of in-memory arrays, in an order fixed by the seed.

    Epoch `e` presents the examples in the order of
    `np.random.default_rng([seed, e]).permutation(n)`, cut into
    `steps_per_epoch = n // batch_size` full batches (the last incomplete
    batch is dropped). The dataset holds the batches of all epochs from
    `initial_epoch` on, one after the other: give `fit` the matching
    `initial_epoch` and `steps_per_epoch`, and `shuffle=False` (by default
    `fit` shuffles a `PyDataset`'s batches, of all epochs together), and it
    reads them in order. So the batches of an epoch do not depend on when
    the process started.

    Args:
        x: NumPy array, or dict or tuple of NumPy arrays, of `n` rows.
        y: Optional NumPy array (or structure of them) of `n` rows.
        batch_size: Integer `>= 1`, at most `n`.
        seed: Integer, the seed of the order.
        epochs: Integer, the epoch `fit` ends at.
        initial_epoch: Integer, the epoch `fit` starts at. Defaults to `0`.
        trim_padding: `None` (the default) or an integer `>= 1`: cut each
            batch of a dict `x` holding a `"padding_mask"` to its longest
            sequence, rounded up to a multiple of `trim_padding` (see
            `trim_padding()`), for a model whose outputs do not depend on
            padded positions (a KerasHub text classifier). The batches and
            the result are those of the padded arrays, at the cost of the
            tokens kept.
        **kwargs: `keras.utils.PyDataset` arguments (`workers`, ...).
    """

    def __init__(
        self,
        x,
        y=None,
        *,
        batch_size,
        seed,
        epochs,
        initial_epoch=0,
        trim_padding=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.x = x
        self.y = y
        self.size = len(keras.tree.flatten(x)[0])
        if not 1 <= batch_size <= self.size:
            raise ValueError(
                f"`batch_size` must be in [1, {self.size}] (the number of "
                f"examples). Received: batch_size={batch_size}"
            )
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.epochs = int(epochs)
        self.initial_epoch = int(initial_epoch)
        self.trim_padding = trim_padding
        self.steps_per_epoch = self.size // self.batch_size
        self._order = (None, None)

    def as_tf_dataset(self):
        """The batches as a `tf.data.Dataset`, e.g. for a KerasHub task.

        KerasHub tasks take arrays or datasets in `fit`, not a
        `keras.utils.PyDataset`; this dataset yields the same batches, in
        the same order, on every backend. It gathers them in TensorFlow
        ops (no Python generator competing with the training step).

        In a cluster (JAX, `keras_isobn.distribution`), `fit` gives every
        process its share of each global batch of `batch_size` rows (Keras
        shards a dataset by process): the same batches, in the same order,
        as one process, split evenly (`batch_size` a multiple of the
        devices). Trimmed padding is that of the global batch.
        """
        import tensorflow as tf

        rows = np.concatenate(
            [
                self.order(epoch)[: self.steps_per_epoch * self.batch_size]
                for epoch in range(self.initial_epoch, self.epochs)
            ]
            or [np.zeros((0,), "int64")]
        )
        data = (self.x,) if self.y is None else (self.x, self.y)
        tensors = keras.tree.map_structure(tf.constant, data)
        mask = self.x.get("padding_mask") if isinstance(self.x, dict) else None
        multiple = self.trim_padding
        if multiple and (mask is None or np.ndim(mask) != 2):
            multiple = None
        sequences = multiple and {
            key
            for key, array in self.x.items()
            if np.ndim(array) >= 2 and np.shape(array)[:2] == np.shape(mask)
        }

        def gather(indices):
            batch = keras.tree.map_structure(
                lambda tensor: tf.gather(tensor, indices), tensors
            )
            if not multiple:
                return batch
            x = dict(batch[0])
            kept = tf.reduce_any(tf.cast(x["padding_mask"], tf.bool), axis=0)
            positions = tf.where(kept)[:, 0]
            used = tf.reduce_max(tf.concat([positions + 1, [1]], axis=0))
            full = tf.cast(tf.shape(kept)[0], tf.int64)
            length = tf.minimum(-(-used // multiple) * multiple, full)
            for key in sequences:
                x[key] = x[key][:, :length]
            return (x,) + tuple(batch[1:])

        dataset = tf.data.Dataset.from_tensor_slices(rows)
        dataset = dataset.batch(self.batch_size, drop_remainder=True)
        dataset = dataset.map(gather).prefetch(2)
        # No autotuning: deleting an autotuned iterator (as `fit` ends) was
        # seen to wait 20-40 s for the thread that autotuning starts.
        options = tf.data.Options()
        options.autotune.enabled = False
        return dataset.with_options(options)

    def order(self, epoch):
        """The example indices of `epoch`, in the order they are batched."""
        if self._order[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = (epoch, rng.permutation(self.size))
        return self._order[1]

    @property
    def num_batches(self):
        return max(self.epochs - self.initial_epoch, 0) * self.steps_per_epoch

    def __len__(self):
        return self.num_batches

    def __getitem__(self, index):
        epoch, step = divmod(index, self.steps_per_epoch)
        start = step * self.batch_size
        rows = self.order(self.initial_epoch + epoch)[
            start : start + self.batch_size
        ]
        x = keras.tree.map_structure(lambda array: array[rows], self.x)
        if self.trim_padding:
            x = trim_padding(x, self.trim_padding)
        if self.y is None:
            return (x,)
        return x, keras.tree.map_structure(lambda array: array[rows], self.y)


def trim_padding(x, multiple=8):
    """Cuts a batch of padded sequences to its longest one.

    KerasHub preprocessors pad every sequence to `sequence_length`; a batch
    of short sentences then computes mostly padding. For a dict `x` with a
    `"padding_mask"` of shape `(batch, length)`, every array whose first
    two axes have that shape is cut to the positions up to the last one
    that any row of the mask keeps, rounded up to a multiple of `multiple`
    (at most `length`), so a compiled step sees few distinct shapes. Only
    padding is removed: a model that masks padded positions (the KerasHub
    text models, FNet aside, which has no mask) gives the same outputs, up
    to floating-point rounding.

    Args:
        x: A batch of model inputs. Anything but a dict with a
            `"padding_mask"` is returned as it is.
        multiple: Integer `>= 1`. Defaults to `8`.

    Returns:
        `x`, its sequence arrays cut.

    Example:

    >>> import numpy as np
    >>> mask = np.array([[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]], bool)
    >>> batch = {"token_ids": np.ones((2, 6), int), "padding_mask": mask}
    >>> trim_padding(batch, multiple=2)["token_ids"].shape
    (2, 4)
    """
    if not isinstance(x, dict) or "padding_mask" not in x:
        return x
    mask = np.asarray(x["padding_mask"])
    if mask.ndim != 2:
        return x
    kept = np.flatnonzero(mask.any(axis=0))
    used = int(kept[-1]) + 1 if kept.size else 1
    length = min(-(-used // multiple) * multiple, mask.shape[1])
    if length == mask.shape[1]:
        return x
    return {
        key: array[:, :length]
        if np.ndim(array) >= 2 and np.shape(array)[:2] == mask.shape
        else array
        for key, array in x.items()
    }


class TrainingCheckpoint(keras.callbacks.Callback):
    """Saves the whole training state at each epoch end, to resume exactly.

    At the end of every epoch it writes, atomically, `state.npz` in
    `directory`: the values of all `model.variables` (weights, moving
    statistics and random-seed states) and `model.optimizer.variables`
    (iterations, moments), with the logs of every epoch so far and, on
    PyTorch, the state of torch's global random generator (which Keras's
    unseeded dropout draws from). When `monitor` improves, `best.npz` is that
    epoch's state too: a second link to the file, made before `state.npz`
    is replaced, not a second write. With `csv_path` it then rewrites that
    CSV file with the logs of every epoch (a `CSVLogger` that a kill cannot
    leave with a missing or doubled row). `restore()` reads them back
    before `fit`, `restore_best()` the best epoch's model variables.

    Args:
        directory: Folder of the checkpoint files (created if needed).
        monitor: Optional log key (e.g. `"val_accuracy"`) whose best epoch
            `best.npz` keeps. `None`: no best checkpoint.
        mode: `"max"` or `"min"`: whether a larger or smaller `monitor` is
            better. Defaults to `"max"`.
        csv_path: Optional path of a CSV file of the epochs' logs, one row
            per epoch, rewritten atomically at each epoch end and by
            `restore()`.
        write: Whether this process writes the files. In a cluster, pass
            `keras_isobn.distribution.is_chief()`: the chief writes, the
            other processes write nothing, keep the logs in memory and wait
            at each epoch end until the chief's files are complete (so
            `restore_best()` reads the epoch just saved). Defaults to
            `True`.

    Attributes:
        epochs: List of dicts, the logs of the epochs run so far (restored
            ones included), each with an `"epoch"` key (from 0).
        initial_epoch: The number of epochs run so far: `fit`'s
            `initial_epoch` after `restore()`.
    """

    def __init__(
        self, directory, monitor=None, mode="max", csv_path=None, write=True
    ):
        super().__init__()
        if mode not in ("max", "min"):
            raise ValueError(f'`mode` must be "max" or "min". Received: {mode}')
        self.directory = directory
        self.monitor = monitor
        self.mode = mode
        self.csv_path = csv_path
        self.write = write
        self.epochs = []
        self._torch_rng = None

    @property
    def initial_epoch(self):
        return len(self.epochs)

    @property
    def state_path(self):
        return os.path.join(self.directory, "state.npz")

    @property
    def best_path(self):
        return os.path.join(self.directory, "best.npz")

    def best_epoch(self):
        """The index of the best epoch so far by `monitor`.

        A non-finite score (e.g. a NaN correlation of constant predictions)
        is the worst; of equal scores the first wins. `None` before any
        epoch or without `monitor`.
        """
        if self.monitor is None or not self.epochs:
            return None
        sign = 1.0 if self.mode == "max" else -1.0
        scores = [
            sign * score if math.isfinite(score) else -math.inf
            for score in (row[self.monitor] for row in self.epochs)
        ]
        return scores.index(max(scores))

    def finished(self, epochs, patience=None):
        """Whether the epochs run end the training.

        Args:
            epochs: Integer, the epochs to run in all.
            patience: Optional integer, the epochs without a better
                `monitor` after which `EarlyStopping` stops.
        """
        if len(self.epochs) >= epochs:
            return True
        if patience is None or not self.epochs:
            return False
        return len(self.epochs) - 1 - self.best_epoch() >= patience

    def restore(self, model):
        """Restores the state of the last completed epoch, if saved.

        Call it after `compile()`, before `fit`. The optimizer is built
        first if it is not.

        Args:
            model: The compiled model, built as when the state was saved.

        Returns:
            The logs of the epochs already run (`self.epochs`); empty if
            there is no saved state.
        """
        self.epochs = []
        self._torch_rng = None
        if os.path.exists(self.state_path):
            with np.load(self.state_path) as state:
                self.epochs = json.loads(str(state["epochs"]))
                _assign(
                    _state_variables(model),
                    [state[f"v{i}"] for i in range(int(state["count"]))],
                    self.state_path,
                )
                if "torch_rng" in state:
                    self._torch_rng = state["torch_rng"]
            self._write_csv()
        return self.epochs

    def on_train_batch_begin(self, batch, logs=None):
        # Keras's PyTorch dropout without a seed (KerasHub's) draws from
        # torch's global generator. Its state at the first batch is the one
        # saved at the last epoch end: set here, not in `restore()`, since
        # starting `fit` (its data loader) draws from it too.
        if self._torch_rng is not None:
            import torch

            torch.set_rng_state(torch.from_numpy(self._torch_rng))
            self._torch_rng = None

    def restore_best(self, model):
        """Sets the model variables to those of the best epoch."""
        with np.load(self.best_path) as best:
            key = "model_count" if "model_count" in best else "count"
            count = int(best[key])
            _assign(
                model.variables,
                [best[f"v{i}"] for i in range(count)],
                self.best_path,
            )

    def on_epoch_end(self, epoch, logs=None):
        row = {"epoch": epoch}
        row.update({k: _to_float(v) for k, v in (logs or {}).items()})
        self.epochs = [r for r in self.epochs if r["epoch"] < epoch] + [row]
        if self.monitor is not None and self.monitor not in row:
            raise ValueError(
                f"TrainingCheckpoint monitors {self.monitor!r}, which is not "
                f"in the logs ({', '.join(sorted(row))}). Put the callback "
                "that logs it before the checkpoint."
            )
        best = self.monitor is not None and (
            self.best_epoch() == len(self.epochs) - 1
        )
        extra = {"model_count": len(self.model.variables)}
        if keras.backend.backend() == "torch":
            import torch

            extra["torch_rng"] = torch.get_rng_state().numpy()
        if self.write:
            _save(
                self.state_path, _state_variables(self.model), self.epochs,
                also=self.best_path if best else None, **extra,
            )  # fmt: skip
            self._write_csv()
        distribution.barrier(f"checkpoint {self.directory} {epoch}")

    def _write_csv(self):
        if self.csv_path is None or not self.epochs or not self.write:
            return
        keys = sorted({key for row in self.epochs for key in row} - {"epoch"})

        def write(path):
            with open(path, "w", newline="") as file:
                writer = csv.DictWriter(file, ["epoch"] + keys)
                writer.writeheader()
                writer.writerows(self.epochs)

        atomic_write(self.csv_path, write)


class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """`EarlyStopping` that continues counting from the epochs already run.

    Args:
        epochs_done: List of dicts, the logs of the epochs run before an
            interruption (e.g. `TrainingCheckpoint.epochs`, with an
            `"epoch"` key).
        **kwargs: `keras.callbacks.EarlyStopping` arguments.
    """

    def __init__(self, epochs_done, **kwargs):
        if kwargs.get("restore_best_weights"):
            raise ValueError(
                "ResumableEarlyStopping cannot restore the best weights of "
                "epochs run before a resume: use "
                "`TrainingCheckpoint.restore_best(model)` after `fit`."
            )
        super().__init__(**kwargs)
        self.epochs_done = epochs_done

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        for row in self.epochs_done:
            self.on_epoch_end(int(row["epoch"]), dict(row))


def _state_variables(model):
    variables = list(model.variables)
    if getattr(model, "optimizer", None) is not None:
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        variables += list(model.optimizer.variables)
    return variables


def _to_float(value):
    return float(keras.ops.convert_to_numpy(value))


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


def _save(path, variables, epochs=(), also=None, **extra):
    """Writes the variables (logs, extra arrays) to `path`, atomically.

    With `also`, the file is also at that path (a hard link, or a copy where
    the file system has none), put there before `path` is replaced.
    """
    arrays = {
        f"v{i}": keras.ops.convert_to_numpy(variable)
        for i, variable in enumerate(variables)
    }

    def write(temporary):
        np.savez(
            temporary, count=len(arrays), epochs=json.dumps(list(epochs)),
            **arrays, **extra,
        )  # fmt: skip
        if also is not None:
            atomic_write(also, functools.partial(_link, temporary))

    atomic_write(path, write)


def _link(source, path):
    try:
        os.link(source, path)
    except OSError:  # No hard links here (e.g. FAT, some network drives).
        shutil.copyfile(source, path)


def _assign(variables, values, path):
    shapes = [tuple(variable.shape) for variable in variables]
    if shapes != [tuple(np.shape(value)) for value in values]:
        raise ValueError(
            f"The checkpoint {path} does not fit this model: it holds "
            f"{len(values)} variables, the model {len(variables)}, or their "
            "shapes differ. It was written by another model or setting: "
            "delete its folder, or use another output folder."
        )
    for variable, value in zip(variables, values):
        variable.assign(value)


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
            self.path("backup"), monitor, mode, self.path("epochs.csv"),
            write=self.write,
        )  # fmt: skip

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


def package_versions():
    """The versions of the software of this process, for a run's results.

    Returns:
        A dict of `python`, `keras_isobn`, `keras`, `keras_hub`,
        `tensorflow` and `numpy` (those imported) to their versions, with
        `backend` and `backend_version`.
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
