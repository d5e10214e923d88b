"""The sample GLUE dataset shipped with keras-isobn (see `make_sample.py`)."""

import os

__all__ = ["sample_data_dir", "sample_vocabulary_path"]


def sample_data_dir():
    """Returns the path of the sample GLUE data directory.

    The directory has the original GLUE TSV layout, for
    `load_split(..., data_dir=sample_data_dir())`: `SST-2/`, `MRPC/` and
    `STS-B/`, each with `train.tsv` (480 rows) and `dev.tsv` (120 rows) of
    synthetic examples whose labels can be learnt from the text. It lets
    the GLUE recipe run offline in minutes; its scores say nothing about
    GLUE.

    Example:

    >>> from keras_isobn.glue import load_split, sample_data_dir
    >>> train = load_split("sst2", "train", data_dir=sample_data_dir())
    >>> train.features[1], train.labels[1]
    ('the soundtrack is deeply stale . ', np.int32(0))
    """
    return os.path.dirname(os.path.abspath(__file__))


def sample_vocabulary_path():
    """Returns the path of the sample's WordPiece vocabulary file.

    `vocab.txt` holds `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`, then every
    lower-cased word and punctuation mark of the sample, one per line: a
    `keras_hub.tokenizers.WordPieceTokenizer` (or `BertTokenizer`) built on
    it with `lowercase=True` maps the whole sample without `[UNK]`.
    """
    return os.path.join(sample_data_dir(), "vocab.txt")
