import numpy as np
import pytest

from keras_isobn.batching import SeededBatches
from keras_isobn.batching import pad_rows
from keras_isobn.batching import sequence_lengths
from keras_isobn.batching import trim_padding
from tests.helpers.scored_training import toy_data


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
    x, y = toy_data(rows=11)
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
    x, y = toy_data(rows=10)
    assert SeededBatches(x, y, batch_size=10, seed=0, epochs=2).num_batches == 2
    done = SeededBatches(x, y, batch_size=5, seed=0, epochs=2, initial_epoch=3)
    assert done.num_batches == len(done) == 0
    for batch_size in (0, 11):
        with pytest.raises(ValueError, match="batch_size"):
            SeededBatches(x, y, batch_size=batch_size, seed=0, epochs=1)


def test_as_tf_dataset_yields_the_same_batches():
    x, y = toy_data(rows=9)
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


def test_pad_rows_repeats_the_first_rows():
    array = np.arange(10).reshape(5, 2)
    padded = pad_rows(array, 4)
    assert padded.shape == (8, 2)
    np.testing.assert_array_equal(padded[:5], array)
    np.testing.assert_array_equal(padded[5:], array[:3])
    assert pad_rows(array, 5).shape == (5, 2)
    assert pad_rows(array, 1).shape == (5, 2)


def test_docstring_examples():
    import doctest

    import keras_isobn.batching

    result = doctest.testmod(keras_isobn.batching)
    assert result.attempted >= 3 and result.failed == 0


def test_sequence_lengths_end_at_the_last_kept_position():
    x = _padded_tokens([3, 12, 0])
    x["padding_mask"][0, 5] = True  # A hole: the row ends at position 5.
    lengths = sequence_lengths(x["padding_mask"])
    assert lengths.tolist() == [6, 12, 1]
    assert sequence_lengths(x["padding_mask"].astype("int32")).tolist() == [
        6,
        12,
        1,
    ]
