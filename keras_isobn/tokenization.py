"""Tokenizes text for a KerasHub task once, in tf.data."""

import keras
import numpy as np

__all__ = ["tokenize", "tokenize_splits"]


def tokenize(classifier, features, batch_size=1024):
    """Runs raw text through a classifier's preprocessor, once, in tf.data.

    A classifier that trains and predicts on the result (with its
    `preprocessor` set to `None` meanwhile) does not tokenize the same
    text again at every epoch and evaluation.

    Args:
        classifier: A KerasHub text classifier with its `preprocessor`, or
            a KerasHub text classifier preprocessor itself (e.g.
            `keras_hub.models.BertTextClassifierPreprocessor`).
        features: Strings, or a tuple `(first, second)` of equally long
            sequences of strings for sentence pairs.
        batch_size: int. Examples per preprocessing batch.

    Returns:
        A dict of NumPy arrays, one row per example (`"token_ids"`,
        `"segment_ids"` and an int32 `"padding_mask"` for BERT).

    Example:

    ```python
    train_x = tokenize(classifier, train_sentences)
    classifier.preprocessor = None
    classifier.fit(train_x, train_labels)
    ```
    """
    import tensorflow as tf  # KerasHub preprocesses in tf.data.

    # `(features,)`: a pair `(first, second)` is one `x`, not `(x, y)`.
    # No autotuning: its thread can hold up the iterator's deletion.
    options = tf.data.Options()
    options.autotune.enabled = False
    preprocess = _preprocess_function(classifier)
    batches = (
        tf.data.Dataset.from_tensor_slices((features,))
        .batch(batch_size)
        .map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
        .with_options(options)
    )
    return keras.tree.map_structure(
        lambda *arrays: np.concatenate(arrays), *batches.as_numpy_iterator()
    )


def _preprocess_function(classifier):
    """`x -> model inputs` of a classifier or of a preprocessor."""
    if hasattr(classifier, "preprocess_samples"):
        return classifier.preprocess_samples
    if not callable(classifier):
        raise TypeError(
            "`tokenize()` takes a KerasHub text classifier or its "
            f"preprocessor. Received: {type(classifier).__name__}"
        )

    def preprocess(x):  # `x=`: a pair is one `x`; drop the `(x,)` packing.
        return keras.utils.unpack_x_y_sample_weight(classifier(x=x))[0]

    return preprocess


def tokenize_splits(classifier, splits, batch_size=1024):
    """`tokenize()` for several splits at once, in one pipeline.

    The preprocessor is traced once for all of them (e.g. a training and
    its evaluation splits) rather than once per split.

    Args:
        classifier: A KerasHub text classifier with its `preprocessor`.
        splits: A list of features, each as `tokenize()` takes them, all
            of the same kind (all strings or all pairs).
        batch_size: int. Examples per preprocessing batch.

    Returns:
        A list of dicts of NumPy arrays, one per split, as `tokenize()`
        returns them.
    """
    features = keras.tree.map_structure(
        lambda *parts: np.concatenate(parts), *splits
    )
    tokens = tokenize(classifier, features, batch_size)
    ends = np.cumsum([len(keras.tree.flatten(split)[0]) for split in splits])
    pieces = {key: np.split(array, ends[:-1]) for key, array in tokens.items()}
    return [
        {key: pieces[key][index] for key in tokens}
        for index in range(len(splits))
    ]
