"""IsoBN under `keras.callbacks.BackupAndRestore`: resumed statistics."""

import os

import keras
import numpy as np
import pytest

from tests.helpers.small_models import small_data
from tests.helpers.small_models import small_model


class Interrupted(Exception):
    pass


class Interrupt(keras.callbacks.Callback):
    """Raises after batch `batch` of epoch `epoch`, as a killed run stops."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise Interrupted(f"killed after batch {batch}, epoch {self.epoch}")


class Recorder(keras.callbacks.Callback):
    """Records the training state: weights, IsoBN statistics, optimizer."""

    def __init__(self):
        super().__init__()
        self.states = {}

    def state(self):
        model = self.model  # On JAX, this syncs the state of `fit` first.
        state = {
            v.path: keras.ops.convert_to_numpy(v) for v in model.weights
        }
        # Optimizer variables by position (their paths hold its name).
        for i, v in enumerate(model.optimizer.variables):
            state[f"optimizer/{i}"] = keras.ops.convert_to_numpy(v)
        return state

    def on_train_begin(self, logs=None):
        self.states["begin"] = self.state()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.states[(self.epoch, batch)] = self.state()

    def on_train_end(self, logs=None):
        self.states["end"] = self.state()


def assert_same_state(actual, expected):
    assert sorted(actual) == sorted(expected)
    assert "iso/moving_covariance" in actual and "iso/moving_std" in actual
    for name in expected:
        np.testing.assert_array_equal(
            actual[name], expected[name], err_msg=name
        )


def fit(model, callbacks):
    x, y = small_data()  # 6 batches of 4, always in this order.
    return model.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )


@pytest.fixture(scope="module")
def uninterrupted():
    """The state after each batch of a run that was not interrupted."""
    recorder = Recorder()
    fit(small_model(), [recorder])
    return recorder.states


def test_killed_mid_epoch_resumes_from_the_epoch_backup(
    tmp_path, uninterrupted
):
    expected = uninterrupted
    path = str(tmp_path / "backup")
    with pytest.raises(Interrupted):
        fit(
            small_model(),
            [keras.callbacks.BackupAndRestore(path), Interrupt(1, batch=3)],
        )
    # As in a new process: a new, differently initialised model restores
    # the backup of the end of epoch 0, then trains epoch 1 again.
    recorder = Recorder()
    history = fit(
        small_model(seed=7),
        [keras.callbacks.BackupAndRestore(path), recorder],
    )
    assert len(history.history["loss"]) == 1
    assert_same_state(recorder.states["begin"], expected[(0, 5)])
    assert_same_state(recorder.states["end"], expected["end"])
    assert not os.path.exists(path)  # Deleted once training completes.


def test_batch_backup_restores_the_statistics_exactly(
    tmp_path, uninterrupted
):
    expected = uninterrupted
    path = str(tmp_path / "backup")
    with pytest.raises(Interrupted):
        fit(
            small_model(),
            [
                keras.callbacks.BackupAndRestore(path, save_freq=4),
                Interrupt(1, batch=3),
            ],
        )
    # Backups after 4 and 8 batches: the last one after batch 1 of epoch 1
    # (counting from 0), two batches before the kill.
    recorder = Recorder()
    with pytest.raises(Interrupted):
        fit(
            small_model(seed=7),
            [
                keras.callbacks.BackupAndRestore(path, save_freq=4),
                recorder,
                Interrupt(1, batch=0),
            ],
        )
    restored = recorder.states["begin"]
    assert_same_state(restored, expected[(1, 1)])
    assert int(restored["optimizer/0"]) == 8  # Adam's step counter.
