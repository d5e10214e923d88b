"""Exact resume: `TrainingCheckpoint` saves the whole state at each epoch end.

A run killed at any point (`SIGKILL` included) and started again ends with
the same weights, IsoBN statistics, losses and metrics as a run never
interrupted, when it

- draws its batches from `keras_isobn.batching.SeededBatches`, whose order
  is a function of the seed and the epoch (not of how often a pipeline was
  restarted);
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
"""

import csv
import json
import math
import os
import re

import keras
import numpy as np

from keras_isobn import distribution
from keras_isobn.files import DamagedFileError
from keras_isobn.files import atomic_link
from keras_isobn.files import atomic_write
from keras_isobn.files import checksum_path
from keras_isobn.files import read_verified
from keras_isobn.files import set_aside
from keras_isobn.files import verified
from keras_isobn.files import write_checksum

__all__ = ["ResumableEarlyStopping", "TrainingCheckpoint"]


class TrainingCheckpoint(keras.callbacks.Callback):
    """Saves the whole training state at each epoch end, to resume exactly.

    At the end of every epoch it writes, atomically, `state.npz` in
    `directory`: the values of all `model.variables` (weights, moving
    statistics and random-seed states) and `model.optimizer.variables`
    (iterations, moments), with the logs of every epoch so far and, on
    PyTorch, the state of torch's global random generator (which Keras's
    unseeded dropout draws from). When `monitor` improves, `best.npz` is that
    epoch's state too: a second link to the file, made before `state.npz`
    is replaced, not a second write. The `keep - 1` states before stay as
    `state-<n>.npz` (`n`: the epochs run), and every file has its SHA-256
    checksum beside it (`<name>.sha256`). With `csv_path` it then rewrites
    that CSV file with the logs of every epoch (a `CSVLogger` that a kill
    cannot leave with a missing or doubled row). `restore()` reads back,
    before `fit`, the newest state that matches its checksum (a damaged
    one is set aside, never deleted), `restore_best()` the best epoch's
    model variables.

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
        keep: The number of last states kept, `>= 1`, for a damaged newest
            one. Defaults to 2.

    Attributes:
        epochs: List of dicts, the logs of the epochs run so far (restored
            ones included), each with an `"epoch"` key (from 0).
        initial_epoch: The number of epochs run so far: `fit`'s
            `initial_epoch` after `restore()`.

    Example:

    ```python
    checkpoint = TrainingCheckpoint("run/state", monitor="val_accuracy")
    checkpoint.restore(model)  # Nothing to restore the first time.
    batches = keras_isobn.batching.SeededBatches(
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

    def __init__(
        self,
        directory,
        monitor=None,
        mode="max",
        csv_path=None,
        write=True,
        keep=2,
    ):
        super().__init__()
        if mode not in ("max", "min"):
            raise ValueError(f'`mode` must be "max" or "min". Received: {mode}')
        if int(keep) != keep or keep < 1:
            raise ValueError(f"`keep` must be an integer >= 1, not {keep}.")
        self.keep = int(keep)
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

    def state_paths(self):
        """The saved states, newest first: `state.npz`, then `state-<n>.npz`
        (`n`: the epochs it holds)."""
        numbered = []
        if os.path.isdir(self.directory):
            for name in os.listdir(self.directory):
                if match := re.fullmatch(r"state-(\d+)\.npz", name):
                    numbered.append((int(match[1]), name))
        newest = [self.state_path] if os.path.exists(self.state_path) else []
        return newest + [
            os.path.join(self.directory, name)
            for _, name in sorted(numbered, reverse=True)
        ]

    def restore(self, model):
        """Restores the state of the last completed epoch, if saved.

        Call it after `compile()`, before `fit`. The optimizer is built
        first if it is not. It takes the newest state that matches its
        checksum; newer ones, damaged, are set aside (`<name>.damaged`,
        with a line on standard error), and training goes on from the
        epoch of the state taken, as if it had stopped there: `epochs`
        and the CSV file are those of that epoch.

        Args:
            model: The compiled model, built as when the state was saved.

        Returns:
            The logs of the epochs already run (`self.epochs`); empty if
            there is no saved state.

        Raises:
            DamagedFileError: if states are saved but none is whole. No
                file is changed then.
        """
        self.epochs = []
        self._torch_rng = None
        damaged = []
        for path in self.state_paths():
            try:
                state = read_verified(path, _read_arrays, repair=False)
                break
            except FileNotFoundError:  # Set aside by the chief meanwhile.
                continue
            except DamagedFileError as error:
                damaged.append((path, error.reason))
        else:
            if damaged:
                raise DamagedFileError(
                    f"No saved state in {self.directory} is whole: "
                    + "; ".join(f"{p}: {reason}" for p, reason in damaged)
                    + ". Nothing was changed; to start the run afresh, move "
                    f"{os.path.dirname(self.directory) or '.'} away.",
                    [p for p, _ in damaged],
                )
            return self.epochs
        if self.write:
            for damaged_path, reason in damaged:
                set_aside(damaged_path, reason)
            if not os.path.exists(checksum_path(path)):  # From before.
                write_checksum(path)
        self.epochs = json.loads(str(state["epochs"]))
        _assign(
            _state_variables(model),
            [state[f"v{i}"] for i in range(int(state["count"]))],
            path,
        )
        self._torch_rng = state.get("torch_rng")
        if self.write and self.csv_path and os.path.exists(self.csv_path):
            if not verified(self.csv_path):
                set_aside(self.csv_path)
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
        """Sets the model variables to those of the best epoch.

        From `best.npz`; if it is damaged (set aside), from a kept state
        of that epoch.

        Raises:
            DamagedFileError: if no whole file holds the best epoch.
        """
        count = None if self.best_epoch() is None else self.best_epoch() + 1
        tried = []
        others = self.state_paths() if count is not None else []
        for path in [self.best_path] + others:
            if not os.path.exists(path) or (
                path != self.best_path and _epochs_in(path) != count
            ):
                continue
            try:
                best = read_verified(path, _read_arrays, repair=self.write)
            except FileNotFoundError:  # Set aside by the chief meanwhile.
                continue
            except DamagedFileError as error:
                tried.append(f"{path}: {error.reason}")
                continue
            if count is None or len(json.loads(str(best["epochs"]))) == count:
                break
            tried.append(f"{path}: not the best epoch's state")
        else:
            tried = tried or [f"{self.best_path}: missing"]
            raise DamagedFileError(
                f"No whole file in {self.directory} holds the best epoch "
                f"({'; '.join(tried)}). Nothing was deleted; to run it "
                f"again, move {os.path.dirname(self.directory) or '.'} away.",
                [self.best_path],
            )
        key = "model_count" if "model_count" in best else "count"
        _assign(
            model.variables,
            [best[f"v{i}"] for i in range(int(best[key]))],
            path,
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
            self._save(_state_variables(self.model), best, extra)
            self._write_csv()
        distribution.barrier(f"checkpoint {self.directory} {epoch}")

    def _save(self, variables, best, extra):
        """Writes `state.npz` (and `best.npz` when `best`), keeping the last
        `keep` states: the one it replaces stays as `state-<n>.npz`."""
        count = len(self.epochs)
        previous = _epochs_in(self.state_path)
        if self.keep > 1 and previous is not None and previous < count:
            atomic_link(
                self.state_path,
                os.path.join(self.directory, f"state-{previous}.npz"),
            )
        arrays = {
            f"v{i}": keras.ops.convert_to_numpy(variable)
            for i, variable in enumerate(variables)
        }

        def write(temporary):
            np.savez(
                temporary,
                count=len(arrays),
                epochs=json.dumps(self.epochs),
                **arrays,
                **extra,
            )
            if best:  # In place before `state.npz` says it is the best.
                atomic_link(temporary, self.best_path)

        atomic_write(self.state_path, write)
        numbered = self.state_paths()[1:]
        kept = [p for p in numbered if _number(p) < count][: self.keep - 1]
        for path in numbered:
            if path not in kept:
                for name in (path, checksum_path(path)):
                    if os.path.exists(name):
                        os.remove(name)

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


def _read_arrays(path):
    """Every array of the `.npz` file at `path`, read whole (so that a
    torn file raises)."""
    with np.load(path) as state:
        return {name: state[name] for name in state.files}


def _epochs_in(path):
    """The number of epochs whose logs the state at `path` holds, or
    `None` if there is none or it cannot be read."""
    try:
        with np.load(path) as state:
            return len(json.loads(str(state["epochs"])))
    except Exception:  # A missing or damaged file: no epochs to count.
        return None


def _number(path):
    return int(re.fullmatch(r"state-(\d+)\.npz", os.path.basename(path))[1])


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
