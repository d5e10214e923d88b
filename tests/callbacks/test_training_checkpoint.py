import csv
import errno
import json
import math
import os
import shutil

import keras
import numpy as np
import pytest

from keras_isobn.batching import SeededBatches
from keras_isobn.callbacks import ResumableEarlyStopping
from keras_isobn.callbacks import TrainingCheckpoint
from keras_isobn.files import DamagedFileError
from keras_isobn.files import DiskFullError
from keras_isobn.files import verified
from tests.helpers.scored_training import Scores
from tests.helpers.scored_training import fit_scored
from tests.helpers.scored_training import isobn_model
from tests.helpers.scored_training import toy_data
from tests.helpers.scored_training import variable_values


def _fit(model, checkpoint, epochs, initial_epoch=0, stop_at=None):
    x, y = toy_data(rows=20)
    batches = SeededBatches(
        x, y, batch_size=8, seed=5, epochs=epochs, initial_epoch=initial_epoch
    )
    return model.fit(
        batches,
        epochs=epochs if stop_at is None else stop_at,
        initial_epoch=initial_epoch,
        steps_per_epoch=batches.steps_per_epoch,
        shuffle=False,  # Keras would shuffle the batches of all epochs.
        callbacks=[checkpoint],
        verbose=0,
    )


@pytest.mark.parametrize("dropout_seed", [None, 3])
def test_resumed_training_is_bit_identical(tmp_path, dropout_seed):
    straight = isobn_model(dropout_seed=dropout_seed)
    straight_checkpoint = TrainingCheckpoint(str(tmp_path / "straight"))
    history = _fit(straight, straight_checkpoint, epochs=3)

    # A run killed after its first epoch ...
    killed = isobn_model(dropout_seed=dropout_seed)
    killed_checkpoint = TrainingCheckpoint(str(tmp_path / "resumed"))
    _fit(killed, killed_checkpoint, epochs=3, stop_at=1)
    assert killed_checkpoint.initial_epoch == 1
    del killed
    # ... and started again in a fresh model.
    resumed = isobn_model(dropout_seed=dropout_seed)
    checkpoint = TrainingCheckpoint(str(tmp_path / "resumed"))
    assert checkpoint.initial_epoch == 0
    restored = checkpoint.restore(resumed)
    assert [row["epoch"] for row in restored] == [0]
    assert checkpoint.initial_epoch == 1
    resumed_history = _fit(resumed, checkpoint, epochs=3, initial_epoch=1)
    assert resumed_history.epoch == [1, 2]

    isobn = resumed.get_layer("isobn")
    assert np.any(keras.ops.convert_to_numpy(isobn.moving_covariance) != 0)
    paths = [v.path for v in resumed.variables]
    assert any(p.endswith("isobn/moving_covariance") for p in paths)
    assert any(p.endswith("isobn/moving_std") for p in paths)
    assert any("seed_generator" in p for p in paths)  # Dropout's state.
    assert [v.name for v in resumed.variables] == [
        v.name for v in straight.variables
    ]
    for path, want, got in zip(
        paths, variable_values(straight.variables), variable_values(resumed.variables)
    ):
        np.testing.assert_array_equal(got, want, err_msg=path)
    for want, got in zip(
        variable_values(straight.optimizer.variables),
        variable_values(resumed.optimizer.variables),
    ):
        np.testing.assert_array_equal(got, want)
    assert int(keras.ops.convert_to_numpy(resumed.optimizer.iterations)) == 6

    assert checkpoint.epochs == straight_checkpoint.epochs
    assert [row["loss"] for row in checkpoint.epochs] == history.history["loss"]
    assert resumed_history.history["loss"] == history.history["loss"][1:]
    # Not trivially equal: the model trained.
    assert len(set(history.history["loss"])) == 3


def test_a_checkpoint_that_does_not_write(tmp_path):
    # In a cluster, the processes but the chief: the same logs and best
    # epoch, read from the chief's files, and nothing written.
    writer = TrainingCheckpoint(
        str(tmp_path / "state"), monitor="score", csv_path=str(tmp_path / "c")
    )
    reader = TrainingCheckpoint(
        str(tmp_path / "state"), monitor="score",
        csv_path=str(tmp_path / "other.csv"), write=False,
    )  # fmt: skip
    fit_scored(isobn_model(), [Scores([0.1, 0.3]), reader], epochs=2)
    assert [row["epoch"] for row in reader.epochs] == [0, 1]
    assert reader.best_epoch() == 1
    assert os.listdir(tmp_path) == []
    model = isobn_model()
    scores = Scores([0.1, 0.3])
    fit_scored(model, [scores, writer], epochs=2)
    reader.restore(isobn_model())  # Reads the writer's state, writes no CSV.
    assert reader.epochs == writer.epochs
    assert sorted(os.listdir(tmp_path)) == ["c", "c.sha256", "state"]
    restored = isobn_model()
    reader.restore_best(restored)
    for want, got in zip(scores.weights[1], variable_values(restored.variables)):
        np.testing.assert_array_equal(got, want)


def test_restore_best_and_csv(tmp_path):
    csv_path = str(tmp_path / "logs" / "epochs.csv")
    checkpoint = TrainingCheckpoint(
        str(tmp_path / "state"), monitor="score", mode="min", csv_path=csv_path
    )
    scores = Scores([0.5, 0.2, float("nan"), 0.2])
    model = isobn_model()
    fit_scored(model, [scores, checkpoint], epochs=4)
    assert checkpoint.best_epoch() == 1
    last = variable_values(model.variables)
    checkpoint.restore_best(model)
    for want, got in zip(scores.weights[1], variable_values(model.variables)):
        np.testing.assert_array_equal(got, want)
    assert any(
        not np.array_equal(a, b) for a, b in zip(last, scores.weights[1])
    )
    # `best.npz` is the best epoch's whole state (logs of epochs 0-1), kept
    # as a second link to that file rather than written again.
    with np.load(checkpoint.best_path) as best:
        assert len(json.loads(str(best["epochs"]))) == 2
    single = TrainingCheckpoint(str(tmp_path / "one"), monitor="score")
    fit_scored(isobn_model(), [Scores([0.5]), single], epochs=1)
    assert os.path.samefile(single.state_path, single.best_path)

    with open(csv_path) as file:
        rows = list(csv.DictReader(file))
    assert [int(row["epoch"]) for row in rows] == [0, 1, 2, 3]
    assert list(rows[0]) == ["epoch", "accuracy", "loss", "score"]
    assert math.isnan(float(rows[2]["score"]))
    assert [float(row["loss"]) for row in rows] == [
        row["loss"] for row in checkpoint.epochs
    ]

    # `restore()` writes the CSV of the epochs run, e.g. after a kill that
    # left it behind the state.
    os.remove(csv_path)
    again = TrainingCheckpoint(
        str(tmp_path / "state"), monitor="score", mode="min", csv_path=csv_path
    )
    again.restore(isobn_model())
    with open(csv_path) as file:
        assert len(list(csv.DictReader(file))) == 4


def test_an_epoch_run_again_replaces_its_row(tmp_path):
    csv_path = str(tmp_path / "epochs.csv")
    checkpoint = TrainingCheckpoint(str(tmp_path), csv_path=csv_path)
    model = isobn_model()
    fit_scored(model, [checkpoint], epochs=3)
    # As if the process restored epoch 0 only, then ran epoch 1 again.
    checkpoint.on_epoch_end(1, {"loss": 9.0, "accuracy": 0.0})
    assert [row["epoch"] for row in checkpoint.epochs] == [0, 1]
    assert checkpoint.epochs[1]["loss"] == 9.0
    with open(csv_path) as file:
        rows = list(csv.DictReader(file))
    assert [(row["epoch"], row["loss"]) for row in rows][1] == ("1", "9.0")
    assert len(rows) == 2


def test_best_epoch_with_nan_and_ties():
    checkpoint = TrainingCheckpoint("unused", monitor="score", mode="min")
    assert checkpoint.best_epoch() is None
    nan, inf = float("nan"), float("inf")
    for scores, best in [
        ([nan, 0.5, 0.5, inf, 0.7], 1),
        ([0.3, nan, 0.1, 0.1], 2),
        ([nan, nan], 0),
        ([-inf, 2.0], 1),  # Non-finite is the worst, whatever its sign.
    ]:
        checkpoint.epochs = [
            {"epoch": epoch, "score": score} for epoch, score in enumerate(scores)
        ]
        assert checkpoint.best_epoch() == best, scores
    maximum = TrainingCheckpoint("unused", monitor="score")
    maximum.epochs = [
        {"epoch": epoch, "score": score}
        for epoch, score in enumerate([nan, 0.2, 0.7, 0.7, inf])
    ]
    assert maximum.best_epoch() == 2
    unmonitored = TrainingCheckpoint("unused")
    unmonitored.epochs = maximum.epochs
    assert unmonitored.best_epoch() is None


def test_finished():
    checkpoint = TrainingCheckpoint("unused", monitor="score", mode="min")
    assert not checkpoint.finished(3)
    assert not checkpoint.finished(3, patience=1)
    checkpoint.epochs = [
        {"epoch": epoch, "score": score}
        for epoch, score in enumerate([0.5, 0.4, 0.45])
    ]
    assert not checkpoint.finished(4)
    assert checkpoint.finished(3)
    assert checkpoint.finished(2)
    assert checkpoint.finished(10, patience=1)
    assert not checkpoint.finished(10, patience=2)


def test_bad_arguments_and_other_models(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        TrainingCheckpoint(str(tmp_path), mode="best")
    checkpoint = TrainingCheckpoint(str(tmp_path), monitor="val_missing")
    with pytest.raises(ValueError, match="val_missing"):
        fit_scored(isobn_model(), [checkpoint], epochs=1)

    directory = str(tmp_path / "state")
    fit_scored(isobn_model(), [TrainingCheckpoint(directory)], epochs=1)
    keras.utils.set_random_seed(1)
    wider = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(7), keras.layers.Dense(2)]
    )
    wider.compile(optimizer="adam", loss="mse")
    with pytest.raises(ValueError, match="state.npz"):
        TrainingCheckpoint(directory).restore(wider)
    # Nothing saved: nothing restored, nothing changed.
    fresh = isobn_model()
    before = variable_values(fresh.variables)
    empty = TrainingCheckpoint(str(tmp_path / "empty"))
    assert empty.restore(fresh) == []
    assert empty.initial_epoch == 0
    for want, got in zip(before, variable_values(fresh.variables)):
        np.testing.assert_array_equal(got, want)


def test_resumable_early_stopping_refuses_to_restore_best_weights():
    # Replayed epochs have no weights to restore: the checkpoint has them.
    with pytest.raises(ValueError, match="restore_best"):
        ResumableEarlyStopping([], restore_best_weights=True)


def test_resumable_early_stopping_stops_where_plain_early_stopping_does(
    tmp_path,
):
    scores = [0.5, 0.4, 0.45, 0.3, 0.35, 0.6, 0.7, 0.8, 0.9, 1.0]
    kwargs = {"monitor": "score", "mode": "min", "patience": 2}

    plain = fit_scored(
        isobn_model(),
        [Scores(scores), keras.callbacks.EarlyStopping(**kwargs)],
        epochs=10,
    )
    assert plain.epoch == [0, 1, 2, 3, 4, 5]

    for cut in (2, 4):
        directory = str(tmp_path / f"cut{cut}")
        first = TrainingCheckpoint(directory, monitor="score", mode="min")
        fit_scored(
            isobn_model(),
            [Scores(scores), ResumableEarlyStopping([], **kwargs), first],
            epochs=cut,
        )
        checkpoint = TrainingCheckpoint(directory, monitor="score", mode="min")
        model = isobn_model()
        done = checkpoint.restore(model)
        assert len(done) == cut
        assert not checkpoint.finished(10, patience=2)
        resumed = fit_scored(
            model,
            [
                Scores(scores),
                ResumableEarlyStopping(done, **kwargs),
                checkpoint,
            ],
            epochs=10,
            initial_epoch=checkpoint.initial_epoch,
        )
        assert resumed.epoch == list(range(cut, 6)), cut
        assert checkpoint.finished(10, patience=2)
        assert [row["epoch"] for row in checkpoint.epochs] == plain.epoch


def _damage(path):
    with open(path, "r+b") as file:
        file.truncate(100)


def test_keeps_the_last_states_with_checksums(tmp_path):
    checkpoint = TrainingCheckpoint(str(tmp_path), monitor="score")
    fit_scored(isobn_model(), [Scores([0.5, 0.1, 0.2, 0.3]), checkpoint], 4)
    assert sorted(os.listdir(tmp_path)) == [
        "best.npz",
        "best.npz.sha256",
        "state-3.npz",
        "state-3.npz.sha256",
        "state.npz",
        "state.npz.sha256",
    ]
    assert checkpoint.state_paths() == [
        checkpoint.state_path,
        str(tmp_path / "state-3.npz"),
    ]
    three = TrainingCheckpoint(str(tmp_path / "three"), keep=3)
    fit_scored(isobn_model(), [three], epochs=4)
    names = [os.path.basename(p) for p in three.state_paths()]
    assert names == ["state.npz", "state-3.npz", "state-2.npz"]
    one = TrainingCheckpoint(str(tmp_path / "one"), keep=1)
    fit_scored(isobn_model(), [one], epochs=2)
    assert one.state_paths() == [one.state_path]
    for keep in (0, 1.5):
        with pytest.raises(ValueError, match="keep"):
            TrainingCheckpoint(str(tmp_path), keep=keep)


def test_a_damaged_newest_state_resumes_from_the_one_before(tmp_path, capsys):
    csv_path = str(tmp_path / "epochs.csv")
    directory = str(tmp_path / "state")
    kwargs = dict(monitor="loss", mode="min")
    straight = TrainingCheckpoint(str(tmp_path / "straight"), **kwargs)
    model = isobn_model()
    _fit(model, straight, epochs=3)
    first = TrainingCheckpoint(directory, csv_path=csv_path, **kwargs)
    _fit(isobn_model(), first, epochs=3, stop_at=2)
    _damage(first.state_path)  # Epoch 1's state (and best.npz, its link).

    checkpoint = TrainingCheckpoint(directory, csv_path=csv_path, **kwargs)
    resumed = isobn_model()
    assert [row["epoch"] for row in checkpoint.restore(resumed)] == [0]
    assert checkpoint.best_epoch() == 0  # The best of the epochs restored.
    with open(csv_path) as file:  # Rolled back too.
        assert [row["epoch"] for row in csv.DictReader(file)] == ["0"]
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"Warning: {first.state_path} is damaged")
    assert os.path.exists(first.state_path + ".damaged")
    _fit(resumed, checkpoint, epochs=3, initial_epoch=1)
    assert checkpoint.epochs == straight.epochs
    assert checkpoint.best_epoch() == straight.best_epoch()
    checkpoint.restore_best(resumed)
    straight.restore_best(model)
    for want, got in zip(
        variable_values(model.variables), variable_values(resumed.variables)
    ):
        np.testing.assert_array_equal(got, want)
    assert os.path.exists(first.state_path + ".damaged")  # Still kept.


def test_no_whole_state_raises_and_changes_nothing(tmp_path):
    checkpoint = TrainingCheckpoint(str(tmp_path / "state"))
    fit_scored(isobn_model(), [checkpoint], epochs=2)
    for path in checkpoint.state_paths():
        _damage(path)
    before = sorted(os.listdir(tmp_path / "state"))
    with pytest.raises(DamagedFileError) as info:
        TrainingCheckpoint(str(tmp_path / "state")).restore(isobn_model())
    assert "No saved state" in str(info.value)
    assert info.value.paths == checkpoint.state_paths()
    assert "state-1.npz" in str(info.value) and "move" in str(info.value)
    assert sorted(os.listdir(tmp_path / "state")) == before


def test_a_state_from_before_checksums_is_taken(tmp_path):
    checkpoint = TrainingCheckpoint(str(tmp_path))
    fit_scored(isobn_model(), [checkpoint], epochs=2)
    os.remove(checkpoint.state_path + ".sha256")
    again = TrainingCheckpoint(str(tmp_path))
    assert len(again.restore(isobn_model())) == 2
    assert os.path.exists(checkpoint.state_path + ".sha256")


def test_a_damaged_best_state_is_taken_from_a_kept_state(tmp_path):
    directory = str(tmp_path / "state")
    checkpoint = TrainingCheckpoint(directory, monitor="score", keep=3)
    scores = Scores([0.1, 0.3, 0.2])
    fit_scored(isobn_model(), [scores, checkpoint], epochs=3)
    # best.npz written again (e.g. copied back from a backup), then damaged.
    best_path = checkpoint.best_path
    shutil.copyfile(best_path, best_path + ".copy")
    os.replace(best_path + ".copy", best_path)
    _damage(best_path)
    model = isobn_model()
    checkpoint.restore_best(model)  # From state-2.npz.
    for want, got in zip(scores.weights[1], variable_values(model.variables)):
        np.testing.assert_array_equal(got, want)
    assert os.path.exists(best_path + ".damaged")
    # Without it: one error naming the file.
    os.remove(os.path.join(directory, "state-2.npz"))
    with pytest.raises(DamagedFileError, match="best epoch"):
        checkpoint.restore_best(model)


def test_a_full_disk_keeps_the_last_state(tmp_path, monkeypatch):
    checkpoint = TrainingCheckpoint(str(tmp_path))
    model = isobn_model()
    fit_scored(model, [checkpoint], epochs=1)
    with open(checkpoint.state_path, "rb") as file:
        before = file.read()

    def full(path, **arrays):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(DiskFullError, match="disk is full"):
        fit_scored(model, [checkpoint], epochs=2, initial_epoch=1)
    with open(checkpoint.state_path, "rb") as file:
        assert file.read() == before
    assert verified(checkpoint.state_path)
    assert not any("partial" in name for name in os.listdir(tmp_path))
