"""Tiny KerasHub backbones and data, and NumPy references, for the tests."""

import keras_hub
import numpy as np
from keras import ops

BERT_VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
    "the", "a", "movie", "film", "was", "is", "great", "good", "bad",
    "dull", "boring", "fun", "i", "loved", "hated", "it", "acting", "plot",
    "and", "but", "not", "very", "really", "story", "ending", ".", ",",
]  # fmt: skip
SENTENCES = [
    "the movie was great",
    "a dull and boring film",
    "i loved it",
    "the acting was bad , really bad",
    "not a good story but a fun ending",
    "i hated the plot",
    "a very good film .",
    "the ending is boring",
]
SECOND_SENTENCES = [
    "it was fun",
    "the film is great",
    "i hated it",
    "good acting",
    "the story was dull",
    "a good plot",
    "it is bad",
    "really fun",
]
LABELS = np.array([1, 0, 1, 0, 1, 0, 1, 0])
SEQUENCE_LENGTH = 16


def bert_backbone(dropout=0.1):
    return keras_hub.models.BertBackbone(
        vocabulary_size=len(BERT_VOCABULARY),
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        dropout=dropout,
        max_sequence_length=32,
    )


def bert_preprocessor():
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=BERT_VOCABULARY)
    return keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=SEQUENCE_LENGTH
    )


def _byte_pair_vocabulary():
    words = sorted(set(" ".join(SENTENCES + SECOND_SENTENCES).split()))
    vocabulary = {"<s>": 0, "<pad>": 1, "</s>": 2, "<mask>": 3, "<unk>": 4}
    merges = []
    for word in words:
        # Byte-level BPE marks a leading space with "Ġ"; merge every word
        # into one token, left to right, with and without it.
        for piece in (word, "Ġ" + word):
            token = piece[0]
            vocabulary.setdefault(token, len(vocabulary))
            for char in piece[1:]:
                vocabulary.setdefault(char, len(vocabulary))
                merge = f"{token} {char}"
                if merge not in merges:
                    merges.append(merge)
                token += char
                vocabulary.setdefault(token, len(vocabulary))
    return vocabulary, merges


ROBERTA_VOCABULARY, ROBERTA_MERGES = _byte_pair_vocabulary()


def roberta_backbone(dropout=0.1):
    return keras_hub.models.RobertaBackbone(
        vocabulary_size=len(ROBERTA_VOCABULARY),
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        dropout=dropout,
        max_sequence_length=32,
    )


def roberta_preprocessor():
    tokenizer = keras_hub.models.RobertaTokenizer(
        vocabulary=ROBERTA_VOCABULARY, merges=ROBERTA_MERGES
    )
    return keras_hub.models.RobertaTextClassifierPreprocessor(
        tokenizer, sequence_length=SEQUENCE_LENGTH
    )


def token_inputs(preprocessor, x):
    """Preprocessed inputs as int32 NumPy arrays, as the backbone takes."""
    if isinstance(x, tuple):
        features = preprocessor(x, y=None)
    else:
        features = preprocessor(x)
    return {
        name: np.asarray(value).astype("int32")
        for name, value in features.items()
    }


def numpy_isobn_scale(covariance, std, epsilon=1e-3, beta=0.5):
    """IsoBN's scale from its moving statistics, in float64 NumPy."""
    correlation = np.clip(covariance / np.outer(std, std), -1.0, 1.0)
    gamma = np.mean(correlation**2, axis=1)
    a = (gamma * std + epsilon) ** -beta
    variance = np.diag(covariance)
    m = np.sqrt(variance.sum() / (np.sum(variance * a**2) + epsilon))
    return m * a


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x), dtype="float64")
