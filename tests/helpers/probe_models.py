"""A tiny BERT with IsoBN in its head, and token ids, to probe its layers."""

import keras
import numpy as np

from keras_isobn import IsoBatchNormalization
from tests.helpers.tiny_models import BERT_VOCABULARY
from tests.helpers.tiny_models import bert_backbone


SEQUENCE_LENGTH = 8


def isobn_classifier():
    """A tiny BERT with IsoBN, BatchNormalization and Dropout in its head."""
    backbone = bert_backbone()
    inputs = backbone.input
    x = backbone(inputs)["pooled_output"]
    x = IsoBatchNormalization(name="isobn")(x)
    x = keras.layers.BatchNormalization(name="batchnorm")(x)
    x = keras.layers.Dropout(0.1)(x)
    outputs = keras.layers.Dense(2, name="logits")(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def token_inputs(rng, samples=32):
    lengths = rng.integers(3, SEQUENCE_LENGTH + 1, size=samples)
    padding_mask = np.arange(SEQUENCE_LENGTH) < lengths[:, None]
    token_ids = rng.integers(5, len(BERT_VOCABULARY), size=padding_mask.shape)
    return {
        "token_ids": np.where(padding_mask, token_ids, 0).astype("int32"),
        "segment_ids": np.zeros(padding_mask.shape, "int32"),
        "padding_mask": padding_mask,
    }


def independent_ev(x, k):
    """EV_k from the eigenvalues of the float64 covariance (independent)."""
    eigenvalues = np.sort(np.linalg.eigvalsh(np.cov(np.float64(x).T)))[::-1]
    return eigenvalues[:k].sum() / eigenvalues.sum()
