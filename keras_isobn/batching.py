"""Batches for training and prediction: seeded order, padding cut.

`SeededBatches` draws the batches of every epoch in an order fixed by the
seed and the epoch (not by how often a pipeline was restarted), the first
half of an exact resume (`keras_isobn.callbacks.TrainingCheckpoint` is the
other). `trim_padding()` cuts a batch of padded sequences to its longest
one; `pad_rows()` fills the last batch of an array by repeating its first
rows, so that every batch is full.
"""

import keras
import numpy as np

__all__ = ["SeededBatches", "pad_rows", "sequence_lengths", "trim_padding"]


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

    Example:

    >>> import numpy as np
    >>> x, y = np.arange(10).reshape(5, 2), np.arange(5)
    >>> batches = SeededBatches(x, y, batch_size=2, seed=0, epochs=3)
    >>> batches.steps_per_epoch, len(batches)
    (2, 6)
    >>> later = SeededBatches(
    ...     x, y, batch_size=2, seed=0, epochs=3, initial_epoch=2
    ... )
    >>> bool(np.array_equal(later[0][1], batches[4][1]))  # Epoch 2, step 0.
    True
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
        # The length each row needs; a batch is cut to its rows' longest.
        lengths = multiple and tf.constant(_trimmed_lengths(mask, multiple))

        def gather(indices):
            batch = keras.tree.map_structure(
                lambda tensor: tf.gather(tensor, indices), tensors
            )
            if not multiple:
                return batch
            x = dict(batch[0])
            length = tf.reduce_max(tf.gather(lengths, indices))
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
    # At least what a batch of all-padding rows keeps: one position.
    least = min(multiple, mask.shape[1])
    length = int(np.max(_trimmed_lengths(mask, multiple), initial=least))
    if length == mask.shape[1]:
        return x
    return {
        key: array[:, :length]
        if np.ndim(array) >= 2 and np.shape(array)[:2] == mask.shape
        else array
        for key, array in x.items()
    }



def pad_rows(array, multiple):
    """`array` with its first rows repeated to a multiple of `multiple` rows.

    Args:
        array: A NumPy array of at least one row.
        multiple: Integer `>= 1`.

    Returns:
        A NumPy array of `len(array)` rounded up to a multiple of `multiple`
        rows: `array`, then its first rows again.

    Example:

    >>> import numpy as np
    >>> pad_rows(np.arange(5), 4)
    array([0, 1, 2, 3, 4, 0, 1, 2])
    """
    size = len(array)
    return np.resize(array, (size + (-size) % multiple,) + array.shape[1:])


def sequence_lengths(mask):
    """The length of each padded sequence: up to its last kept position.

    Args:
        mask: Array of shape `(batch, length)`, true (non-zero) at the
            positions kept, as KerasHub's `"padding_mask"`.

    Returns:
        An integer NumPy array of shape `(batch,)`: for each row, the index
        of its last kept position plus one; `1` for a row of padding only.

    Example:

    >>> import numpy as np
    >>> sequence_lengths(np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]))
    array([2, 3, 1])
    """
    mask = np.asarray(mask, bool)
    if mask.shape[1] == 0:
        return np.ones(len(mask), "int64")
    lengths = mask.shape[1] - np.argmax(mask[:, ::-1], axis=1)
    lengths[~mask.any(axis=1)] = 1
    return lengths


def _trimmed_lengths(mask, multiple):
    """Each row's length, rounded up to a multiple of `multiple`, capped."""
    lengths = sequence_lengths(mask)
    return np.minimum(-(-lengths // multiple) * multiple, np.shape(mask)[1])
