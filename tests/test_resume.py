import csv
import json
import math
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_isobn import IsoBatchNormalization
from keras_isobn.resume import ResumableEarlyStopping
from keras_isobn.resume import RunDirectory
from keras_isobn.resume import SeededBatches
from keras_isobn.resume import TrainingCheckpoint
from keras_isobn.resume import atomic_write
from keras_isobn.resume import exclusive
from keras_isobn.resume import package_versions
from keras_isobn.resume import trim_padding


def _values(variables):
    return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]


def _data(rows=20, features=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
    return x, y


# SeededBatches


def test_batches_follow_the_seeded_order_of_each_epoch():
    n, batch_size, seed = 10, 3, 42
    x = {"a": np.arange(n) * 10, "b": np.arange(2 * n).reshape(n, 2)}
    y = np.arange(n) + 100
    batches = SeededBatches(x, y, batch_size=batch_size, seed=seed, epochs=3)
    assert batches.steps_per_epoch == 3  # The incomplete 4th is dropped.
    assert batches.num_batches == len(batches) == 9
    orders = []
    for epoch in range(3):
        order = np.random.default_rng([seed, epoch]).permutation(n)
        orders.append(order)
        for step in range(3):
            rows = order[step * batch_size : (step + 1) * batch_size]
            bx, by = batches[epoch * 3 + step]
            np.testing.assert_array_equal(bx["a"], rows * 10)
            np.testing.assert_array_equal(bx["b"], x["b"][rows])
            np.testing.assert_array_equal(by, rows + 100)
    # Every epoch is shuffled anew.
    assert not np.array_equal(orders[0], orders[1])
    # Without labels, a batch is a 1-tuple, as `fit` unpacks it.
    (only,) = SeededBatches(x["a"], batch_size=3, seed=seed, epochs=1)[0]
    np.testing.assert_array_equal(only, orders[0][:3] * 10)


def test_batches_do_not_depend_on_the_epoch_started_at():
    x, y = _data(rows=11)
    full = SeededBatches(x, y, batch_size=4, seed=7, epochs=4)
    for start in (1, 2, 3):
        later = SeededBatches(
            x, y, batch_size=4, seed=7, epochs=4, initial_epoch=start
        )
        assert later.num_batches == (4 - start) * 2
        for index in range(later.num_batches):
            for got, want in zip(later[index], full[start * 2 + index]):
                np.testing.assert_array_equal(got, want)
    # Another seed, another order.
    other = SeededBatches(x, y, batch_size=4, seed=8, epochs=4)
    assert not np.array_equal(other[0][1], full[0][1]) or not np.array_equal(
        other[0][0], full[0][0]
    )


def test_num_batches_and_bad_batch_size():
    x, y = _data(rows=10)
    assert SeededBatches(x, y, batch_size=10, seed=0, epochs=2).num_batches == 2
    done = SeededBatches(x, y, batch_size=5, seed=0, epochs=2, initial_epoch=3)
    assert done.num_batches == len(done) == 0
    for batch_size in (0, 11):
        with pytest.raises(ValueError, match="batch_size"):
            SeededBatches(x, y, batch_size=batch_size, seed=0, epochs=1)


def test_as_tf_dataset_yields_the_same_batches():
    x, y = _data(rows=9)
    batches = SeededBatches(
        {"features": x}, y, batch_size=4, seed=3, epochs=3, initial_epoch=1
    )
    dataset = list(batches.as_tf_dataset().as_numpy_iterator())
    assert len(dataset) == len(batches) == 4
    for index, (bx, by) in enumerate(dataset):
        want_x, want_y = batches[index]
        np.testing.assert_array_equal(bx["features"], want_x["features"])
        np.testing.assert_array_equal(by, want_y)
        assert bx["features"].dtype == np.float32 and by.dtype == np.int32
    # Not autotuned: deleting an autotuned iterator (as `fit` ends) was seen
    # to wait 20-40 s for the thread that autotuning starts.
    assert batches.as_tf_dataset().options().autotune.enabled is False
    # Raw strings, as a KerasHub task takes them.
    text = np.array([f"sentence {i}" for i in range(6)])
    strings = SeededBatches(text, y[:6], batch_size=3, seed=1, epochs=2)
    got = [bx for bx, _ in strings.as_tf_dataset().as_numpy_iterator()]
    assert len(got) == 4
    for index, batch in enumerate(got):
        assert [s.decode() for s in batch] == list(strings[index][0])


# TrainingCheckpoint: resuming is exact.


def _model(seed=11, dropout_seed=None):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(6, activation="relu"),
            keras.layers.Dropout(0.3, seed=dropout_seed),
            IsoBatchNormalization(momentum=0.2, name="isobn"),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _fit(model, checkpoint, epochs, initial_epoch=0, stop_at=None):
    x, y = _data(rows=20)
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


def _padded_tokens(lengths, width=12):
    mask = np.arange(width) < np.asarray(lengths)[:, None]
    return {
        "token_ids": np.where(mask, 7, 0).astype("int32"),
        "segment_ids": np.zeros(mask.shape, "int32"),
        "padding_mask": mask,
        "weights": np.ones((len(lengths), 3), "float32"),  # Not a sequence.
    }


def test_trim_padding_cuts_only_padding():
    x = _padded_tokens([3, 5, 2])
    cut = trim_padding(x, multiple=4)
    for key in ("token_ids", "segment_ids", "padding_mask"):
        assert cut[key].shape == (3, 8)
        np.testing.assert_array_equal(cut[key], x[key][:, :8])
    assert cut["weights"].shape == (3, 3)
    # Never past the length; a mask with holes keeps its last position.
    assert trim_padding(x, multiple=7)["token_ids"].shape == (3, 7)
    assert trim_padding(_padded_tokens([12, 1]), 8)["token_ids"].shape[1] == 12
    holes = _padded_tokens([2, 2])
    holes["padding_mask"][0, 6] = True
    assert trim_padding(holes, 1)["padding_mask"].shape == (2, 7)
    # An all-padding batch keeps one position; other inputs pass as they are.
    assert trim_padding(_padded_tokens([0, 0]), 1)["token_ids"].shape == (2, 1)
    plain = np.ones((2, 12))
    assert trim_padding(plain) is plain
    assert trim_padding({"token_ids": plain})["token_ids"] is plain


def test_seeded_batches_trim_padding():
    rng = np.random.default_rng(0)
    x = _padded_tokens(rng.integers(1, 13, size=40))
    y = np.arange(40)
    full = SeededBatches(x, y, batch_size=8, seed=3, epochs=2)
    cut = SeededBatches(x, y, batch_size=8, seed=3, epochs=2, trim_padding=4)
    lengths = set()
    for index in range(len(full)):
        (a, labels_a), (b, labels_b) = full[index], cut[index]
        np.testing.assert_array_equal(labels_a, labels_b)
        length = b["token_ids"].shape[1]
        lengths.add(length)
        assert length % 4 == 0 or length == 12
        np.testing.assert_array_equal(b["token_ids"], a["token_ids"][:, :length])
        assert not a["padding_mask"][:, length:].any()
    assert len(lengths) > 1
    # The tf.data version takes the varying lengths.
    batches = list(cut.as_tf_dataset().as_numpy_iterator())
    for index, (b, _) in enumerate(batches):
        np.testing.assert_array_equal(b["token_ids"], cut[index][0]["token_ids"])



@pytest.mark.parametrize("dropout_seed", [None, 3])
def test_resumed_training_is_bit_identical(tmp_path, dropout_seed):
    straight = _model(dropout_seed=dropout_seed)
    straight_checkpoint = TrainingCheckpoint(str(tmp_path / "straight"))
    history = _fit(straight, straight_checkpoint, epochs=3)

    # A run killed after its first epoch ...
    killed = _model(dropout_seed=dropout_seed)
    killed_checkpoint = TrainingCheckpoint(str(tmp_path / "resumed"))
    _fit(killed, killed_checkpoint, epochs=3, stop_at=1)
    assert killed_checkpoint.initial_epoch == 1
    del killed
    # ... and started again in a fresh model.
    resumed = _model(dropout_seed=dropout_seed)
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
        paths, _values(straight.variables), _values(resumed.variables)
    ):
        np.testing.assert_array_equal(got, want, err_msg=path)
    for want, got in zip(
        _values(straight.optimizer.variables),
        _values(resumed.optimizer.variables),
    ):
        np.testing.assert_array_equal(got, want)
    assert int(keras.ops.convert_to_numpy(resumed.optimizer.iterations)) == 6

    assert checkpoint.epochs == straight_checkpoint.epochs
    assert [row["loss"] for row in checkpoint.epochs] == history.history["loss"]
    assert resumed_history.history["loss"] == history.history["loss"][1:]
    # Not trivially equal: the model trained.
    assert len(set(history.history["loss"])) == 3


class _Scores(keras.callbacks.Callback):
    """Puts `score` = `scores[epoch]` in the logs; keeps the weights."""

    def __init__(self, scores):
        super().__init__()
        self.scores = scores
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.scores[epoch]
        self.weights.append(_values(self.model.variables))


def _fit_scored(model, callbacks, epochs, initial_epoch=0):
    x, y = _data(rows=16)
    return model.fit(
        x,
        y,
        batch_size=8,
        epochs=epochs,
        initial_epoch=initial_epoch,
        shuffle=False,
        callbacks=callbacks,
        verbose=0,
    )


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
    _fit_scored(_model(), [_Scores([0.1, 0.3]), reader], epochs=2)
    assert [row["epoch"] for row in reader.epochs] == [0, 1]
    assert reader.best_epoch() == 1
    assert os.listdir(tmp_path) == []
    model = _model()
    scores = _Scores([0.1, 0.3])
    _fit_scored(model, [scores, writer], epochs=2)
    reader.restore(_model())  # Reads the writer's state, writes no CSV.
    assert reader.epochs == writer.epochs
    assert sorted(os.listdir(tmp_path)) == ["c", "state"]
    restored = _model()
    reader.restore_best(restored)
    for want, got in zip(scores.weights[1], _values(restored.variables)):
        np.testing.assert_array_equal(got, want)


def test_run_directory_writes_in_one_process(tmp_path):
    chief = RunDirectory(str(tmp_path / "run"))  # One process: the chief.
    other = RunDirectory(str(tmp_path / "run"), write=False)
    assert chief.write and not other.write
    assert chief.load_json("results.json") is None
    seen = []
    other.save("results.json", '{"a": 1}')
    other.save("model.keras", lambda path: seen.append(path) or open(
        path, "w").close())  # fmt: skip
    assert not (tmp_path / "run").exists()
    # A callable runs in every process (a model's save is collective), on
    # a private temporary path, deleted at once.
    assert seen and not seen[0].startswith(str(tmp_path))
    assert not os.path.exists(seen[0])
    chief.save("results.json", '{"a": 1}')
    assert other.load_json("results.json") == {"a": 1}

    checkpoint = chief.checkpoint("score")
    assert checkpoint.write and checkpoint.monitor == "score"
    assert checkpoint.csv_path == chief.path("epochs.csv")
    assert not other.checkpoint().write
    # No saved epoch: the writer empties the folder, the others do not.
    assert other.start(checkpoint) is False
    assert (tmp_path / "run" / "results.json").exists()
    assert chief.start(checkpoint) is False
    assert not (tmp_path / "run").exists()
    _fit_scored(_model(), [_Scores([0.2]), checkpoint], epochs=1)
    assert chief.start(checkpoint) is True
    other.finish()
    assert os.path.exists(checkpoint.state_path)
    chief.finish()
    assert not (tmp_path / "run" / "backup").exists()


def test_package_versions():
    versions = package_versions()
    assert versions["backend"] == keras.backend.backend()
    assert versions["keras"] == keras.__version__
    assert {"python", "numpy", "keras_isobn", "backend_version"} <= set(
        versions
    )


def test_restore_best_and_csv(tmp_path):
    csv_path = str(tmp_path / "logs" / "epochs.csv")
    checkpoint = TrainingCheckpoint(
        str(tmp_path / "state"), monitor="score", mode="min", csv_path=csv_path
    )
    scores = _Scores([0.5, 0.2, float("nan"), 0.2])
    model = _model()
    _fit_scored(model, [scores, checkpoint], epochs=4)
    assert checkpoint.best_epoch() == 1
    last = _values(model.variables)
    checkpoint.restore_best(model)
    for want, got in zip(scores.weights[1], _values(model.variables)):
        np.testing.assert_array_equal(got, want)
    assert any(
        not np.array_equal(a, b) for a, b in zip(last, scores.weights[1])
    )
    # `best.npz` is the best epoch's whole state (logs of epochs 0-1), kept
    # as a second link to that file rather than written again.
    with np.load(checkpoint.best_path) as best:
        assert len(json.loads(str(best["epochs"]))) == 2
    single = TrainingCheckpoint(str(tmp_path / "one"), monitor="score")
    _fit_scored(_model(), [_Scores([0.5]), single], epochs=1)
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
    again.restore(_model())
    with open(csv_path) as file:
        assert len(list(csv.DictReader(file))) == 4


def test_an_epoch_run_again_replaces_its_row(tmp_path):
    csv_path = str(tmp_path / "epochs.csv")
    checkpoint = TrainingCheckpoint(str(tmp_path), csv_path=csv_path)
    model = _model()
    _fit_scored(model, [checkpoint], epochs=3)
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
        _fit_scored(_model(), [checkpoint], epochs=1)

    directory = str(tmp_path / "state")
    _fit_scored(_model(), [TrainingCheckpoint(directory)], epochs=1)
    keras.utils.set_random_seed(1)
    wider = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(7), keras.layers.Dense(2)]
    )
    wider.compile(optimizer="adam", loss="mse")
    with pytest.raises(ValueError, match="state.npz"):
        TrainingCheckpoint(directory).restore(wider)
    # Nothing saved: nothing restored, nothing changed.
    fresh = _model()
    before = _values(fresh.variables)
    empty = TrainingCheckpoint(str(tmp_path / "empty"))
    assert empty.restore(fresh) == []
    assert empty.initial_epoch == 0
    for want, got in zip(before, _values(fresh.variables)):
        np.testing.assert_array_equal(got, want)


# ResumableEarlyStopping


def test_resumable_early_stopping_refuses_to_restore_best_weights():
    # Replayed epochs have no weights to restore: the checkpoint has them.
    with pytest.raises(ValueError, match="restore_best"):
        ResumableEarlyStopping([], restore_best_weights=True)


def test_resumable_early_stopping_stops_where_plain_early_stopping_does(
    tmp_path,
):
    scores = [0.5, 0.4, 0.45, 0.3, 0.35, 0.6, 0.7, 0.8, 0.9, 1.0]
    kwargs = {"monitor": "score", "mode": "min", "patience": 2}

    plain = _fit_scored(
        _model(),
        [_Scores(scores), keras.callbacks.EarlyStopping(**kwargs)],
        epochs=10,
    )
    assert plain.epoch == [0, 1, 2, 3, 4, 5]

    for cut in (2, 4):
        directory = str(tmp_path / f"cut{cut}")
        first = TrainingCheckpoint(directory, monitor="score", mode="min")
        _fit_scored(
            _model(),
            [_Scores(scores), ResumableEarlyStopping([], **kwargs), first],
            epochs=cut,
        )
        checkpoint = TrainingCheckpoint(directory, monitor="score", mode="min")
        model = _model()
        done = checkpoint.restore(model)
        assert len(done) == cut
        assert not checkpoint.finished(10, patience=2)
        resumed = _fit_scored(
            model,
            [
                _Scores(scores),
                ResumableEarlyStopping(done, **kwargs),
                checkpoint,
            ],
            epochs=10,
            initial_epoch=checkpoint.initial_epoch,
        )
        assert resumed.epoch == list(range(cut, 6)), cut
        assert checkpoint.finished(10, patience=2)
        assert [row["epoch"] for row in checkpoint.epochs] == plain.epoch


# atomic_write and exclusive


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

    from keras_isobn.resume import exclusive

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


def test_docstring_examples():
    import doctest

    import keras_isobn.resume

    result = doctest.testmod(keras_isobn.resume)
    assert result.attempted >= 3 and result.failed == 0
