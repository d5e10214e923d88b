"""Tiny KerasHub backbones and data, and NumPy references, for the tests."""

import dataclasses
import functools
import io

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


def small_bert_classifier(**kwargs):
    """`keras_isobn.models.small_bert_text_classifier` at the tiny size."""
    from keras_isobn.models import small_bert_text_classifier

    return small_bert_text_classifier(
        BERT_VOCABULARY,
        num_classes=2,
        sequence_length=SEQUENCE_LENGTH,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        **kwargs,
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


@functools.cache
def _sentencepiece_proto(style):
    """A word-level SentencePiece model of the test sentences, in memory.

    As KerasHub's own tests make theirs
    (`tools/sentencepiece_testing/create_*_test_proto.py`): `"albert"`
    special pieces for ALBERT, FNet and XLM-RoBERTa, `"deberta"` for
    DeBERTaV3.
    """
    import sentencepiece

    pieces = {
        "albert": ["<pad>", "<unk>", "[CLS]", "[SEP]"],
        "deberta": ["[PAD]", "[CLS]", "[SEP]", "[UNK]"],
    }[style]
    kinds = {"albert": ["pad", "unk", "bos", "eos"]}.get(
        style, ["pad", "bos", "eos", "unk"]
    )
    specials = {}
    for index, (kind, piece) in enumerate(zip(kinds, pieces)):
        specials[f"{kind}_id"] = index
        specials[f"{kind}_piece"] = piece
    sentences = SENTENCES + SECOND_SENTENCES
    words = set(" ".join(sentences).split())
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=proto,
        vocab_size=len(words) + 5,  # the words, 4 specials and "[MASK]"
        model_type="WORD",
        user_defined_symbols="[MASK]",
        minloglevel=2,
        **specials,
    )
    return proto.getvalue()


@dataclasses.dataclass(frozen=True)
class Family:
    """A KerasHub text classifier family, with a tiny backbone.

    Attributes:
        name: The family's name, e.g. `"bert"`.
        backbone_cls: KerasHub's backbone class of the family.
        tokenizer: Makes the family's tokenizer of the test sentences.
        backbone_kwargs: Arguments of `backbone_cls` beyond the common tiny
            sizes; `None` drops a common one.
    """

    name: str
    backbone_cls: type
    tokenizer: object
    backbone_kwargs: dict = dataclasses.field(default_factory=dict)

    @property
    def classifier(self):
        """The `keras_isobn.models` class of the family."""
        from keras_isobn import models

        return models.text_classifier_class(self.backbone_cls)

    @property
    def keras_hub_classifier(self):
        """KerasHub's own classifier class of the family."""
        name = self.backbone_cls.__name__.replace("Backbone", "TextClassifier")
        return getattr(keras_hub.models, name)

    def backbone(self, dropout=0.1):
        kwargs = {
            "vocabulary_size": self.tokenizer().vocabulary_size(),
            "num_layers": 1,
            "num_heads": 2,
            "hidden_dim": 16,
            "intermediate_dim": 32,
            "dropout": dropout,
            "max_sequence_length": 32,
        }
        kwargs.update(self.backbone_kwargs)
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return self.backbone_cls(**kwargs)

    def preprocessor(self):
        return self.classifier.preprocessor_cls(
            self.tokenizer(), sequence_length=SEQUENCE_LENGTH
        )


FAMILIES = {
    family.name: family
    for family in [
        Family(
            "albert",
            keras_hub.models.AlbertBackbone,
            lambda: keras_hub.models.AlbertTokenizer(
                proto=_sentencepiece_proto("albert")
            ),
            {"embedding_dim": 8},
        ),
        Family(
            "bert",
            keras_hub.models.BertBackbone,
            lambda: keras_hub.models.BertTokenizer(vocabulary=BERT_VOCABULARY),
        ),
        Family(
            "deberta_v3",
            keras_hub.models.DebertaV3Backbone,
            lambda: keras_hub.models.DebertaV3Tokenizer(
                proto=_sentencepiece_proto("deberta")
            ),
            {"bucket_size": 8},
        ),
        Family(
            "distil_bert",
            keras_hub.models.DistilBertBackbone,
            lambda: keras_hub.models.DistilBertTokenizer(
                vocabulary=BERT_VOCABULARY
            ),
        ),
        Family(
            "f_net",
            keras_hub.models.FNetBackbone,
            lambda: keras_hub.models.FNetTokenizer(
                proto=_sentencepiece_proto("albert")
            ),
            {"num_heads": None},
        ),
        Family(
            "roberta",
            keras_hub.models.RobertaBackbone,
            lambda: keras_hub.models.RobertaTokenizer(
                vocabulary=ROBERTA_VOCABULARY, merges=ROBERTA_MERGES
            ),
        ),
        Family(
            "roformer_v2",
            keras_hub.models.RoformerV2Backbone,
            lambda: keras_hub.models.RoformerV2Tokenizer(
                vocabulary=BERT_VOCABULARY
            ),
            {"head_size": 8, "max_sequence_length": None},
        ),
        Family(
            "xlm_roberta",
            keras_hub.models.XLMRobertaBackbone,
            lambda: keras_hub.models.XLMRobertaTokenizer(
                proto=_sentencepiece_proto("albert")
            ),
        ),
    ]
}


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


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x), dtype="float64")
