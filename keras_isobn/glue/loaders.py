"""Reading a labelled GLUE split from TFDS or from the GLUE TSV files."""

import codecs
import csv
import dataclasses
import math
import os
import socket
import urllib.parse

import numpy as np

from keras_isobn.glue.tasks import GlueTask
from keras_isobn.glue.tasks import get_task

__all__ = ["GlueSplit", "load_split"]

# STS-B rates the similarity of a pair from 0 to 5.
_SCORE_RANGE = (0.0, 5.0)


@dataclasses.dataclass(frozen=True, eq=False)
class GlueSplit:
    """One labelled split of a GLUE task, held as NumPy arrays.

    Args:
        task: The `GlueTask`.
        split: String. The split name (`"train"`, `"validation"`, ...).
        texts: Tuple of 1 or 2 one-dimensional NumPy arrays of Python `str`
            (dtype `object`), in the order of `task.text_features`.
        labels: One-dimensional NumPy array: `int32` class ids, or `float32`
            scores for a regression task.

    Example:

    >>> split = load_split("sst2", "validation", data_dir=sample_data_dir())
    >>> x, y = split.features, split.labels   # x: array of sentences
    >>> small = split.limit(32, seed=0)       # 32 examples, shuffled
    >>> ds = small.to_tf_dataset().batch(8)   # ((s1[, s2]), y) batches
    """

    task: GlueTask
    split: str
    texts: tuple
    labels: np.ndarray

    def __len__(self):
        return len(self.labels)

    @property
    def features(self):
        """The model inputs: the array of texts, or a tuple of two arrays.

        This is what a KerasHub `TextClassifierPreprocessor` takes as `x`.
        """
        return self.texts[0] if len(self.texts) == 1 else tuple(self.texts)

    def limit(self, num_examples, seed=0):
        """Keeps the first `num_examples` examples of a seeded shuffle.

        The same `seed` always keeps the same examples, in the same
        (shuffled) order. All examples are kept, shuffled, when the split
        has no more than `num_examples`.

        Args:
            num_examples: Positive integer. How many examples to keep.
            seed: Integer. Seed of the shuffle. Defaults to `0`.

        Returns:
            A new `GlueSplit`.
        """
        if (
            isinstance(num_examples, bool)
            or not isinstance(num_examples, (int, np.integer))
            or num_examples < 1
        ):
            raise ValueError(
                "`num_examples` must be a positive integer. "
                f"Received: num_examples={num_examples!r}"
            )
        order = np.random.default_rng(seed).permutation(len(self))
        order = order[:num_examples]
        return dataclasses.replace(
            self,
            texts=tuple(column[order] for column in self.texts),
            labels=self.labels[order],
        )

    def to_tf_dataset(self):
        """Returns an unbatched `tf.data.Dataset` of `(x, y)` pairs.

        `x` is a string tensor for single-sentence tasks and a tuple
        `(sentence1, sentence2)` of string tensors for pair tasks, `y` the
        `int32` class id or `float32` score: the input format of KerasHub's
        `TextClassifierPreprocessor` and `TextClassifier.fit`.
        """
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices((self.features, self.labels))


def load_split(task, split, data_dir=None, tfds_data_dir=None):
    """Loads one labelled split of a GLUE task.

    With `data_dir`, the split is read from the original GLUE TSV files
    (as written by GLUE's `download_glue_data.py`), e.g.
    `<data_dir>/SST-2/dev.tsv` or `<data_dir>/MNLI/dev_matched.tsv`. The
    quirks of the real files are handled: CoLA has no header, MRPC starts
    with a UTF-8 byte-order mark, fields are read with quoting off (RTE,
    MNLI and QNLI rows contain unbalanced quotes), STS-B scores are floats,
    and string labels (`"entailment"`, ...) map to the TFDS class ids.
    Lines end with `\\n` or `\\r\\n`; blank lines are skipped. A file that
    does not read exactly so raises a `ValueError` naming the file and, for
    a faulty row, its line (1-based, as an editor counts): text that is not
    UTF-8, a NUL or a lone carriage return, a missing column, a row with
    another number of fields than the header (CoLA's: 4), a class label
    that is not one of the task's, an STS-B score that is not a number from
    0 to 5, or a file without examples.

    Without `data_dir`, the split comes from TFDS `glue/<task>`, which
    downloads and prepares GLUE on first use (internet needed) into
    `tfds_data_dir` (TFDS's default, `~/tensorflow_datasets`, if `None`).
    Examples are returned in the order of the original files.

    Args:
        task: String (`"sst2"`, `"SST-2"`, ...) or `GlueTask`.
        split: String. `"train"` or one of `task.dev_splits`: `"validation"`,
            or for MNLI `"validation_matched"` / `"validation_mismatched"`.
        data_dir: Optional string or path-like. The root of the GLUE TSV
            files, the folder that holds `CoLA/`, `SST-2/`, ... Defaults to
            `None`: read from TFDS.
        tfds_data_dir: Optional string. The TFDS data directory. Ignored
            when `data_dir` is given.

    Returns:
        A `GlueSplit`.

    Example:

    >>> from keras_isobn.glue import load_split, sample_data_dir
    >>> dev = load_split("mrpc", "validation", data_dir=sample_data_dir())
    >>> sentence1, sentence2 = dev.features
    """
    task = get_task(task)
    task.check_split(split)
    if data_dir is not None:
        texts, labels = _read_tsv(task, task.tsv_path(data_dir, split))
    else:
        texts, labels = _read_tfds(task, split, tfds_data_dir)
    dtype = "float32" if task.is_regression else "int32"
    return GlueSplit(
        task=task,
        split=split,
        texts=tuple(np.array(column, dtype=object) for column in texts),
        labels=np.asarray(labels, dtype=dtype),
    )


def _read_tfds(task, split, tfds_data_dir):
    import tensorflow_datasets as tfds

    def load(download):
        return tfds.load(
            task.tfds_name,
            split=split,
            data_dir=tfds_data_dir,
            download=download,
        )

    try:
        try:
            dataset = load(download=False)  # Prepared already: no network.
        except Exception as error:
            # Fail in seconds offline, not after TFDS's download retries.
            url = getattr(
                tfds.builder(task.tfds_name).builder_config, "data_url", None
            )
            host = urllib.parse.urlparse(url).hostname if url else None
            if host is not None and not _reachable(host):
                raise ConnectionError(
                    f"it is not prepared in the TFDS data directory ({error}) "
                    f"and its download host {host} cannot be reached"
                ) from error
            dataset = load(download=True)
    except Exception as error:
        raise RuntimeError(
            f"Could not load the TFDS dataset {task.tfds_name!r}, split "
            f"{split!r}: {error}\nTFDS downloads GLUE on first use, which "
            "needs internet access. Offline, read the original GLUE TSV "
            f"files instead: pass data_dir=<GLUE folder holding "
            f"{task.tsv_folder}/> (`--data-dir` in recipes/glue.py)."
        ) from error
    batches = list(tfds.as_numpy(dataset.batch(8192)))
    if not batches:
        raise ValueError(f"TFDS {task.tfds_name!r} {split!r} has no examples.")
    data = {
        key: np.concatenate([batch[key] for batch in batches])
        for key in batches[0]
    }
    order = np.argsort(data["idx"], kind="stable")
    texts = [
        [text.decode("utf-8") for text in data[feature][order]]
        for feature in task.text_features
    ]
    return texts, data["label"][order]


def _reachable(host, port=443, timeout=5.0):
    """Whether a TCP connection to `host` opens within `timeout` seconds."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _read_tsv(task, path):
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"GLUE file not found: {path}. `data_dir` must hold the original "
            f"GLUE TSV layout ({task.tsv_folder}/train.tsv, "
            f"{task.tsv_folder}/dev.tsv, ...), as written by "
            "download_glue_data.py."
        )
    with open(path, "rb") as file:
        reader = csv.reader(
            _decoded_lines(file, path), delimiter="\t", quoting=csv.QUOTE_NONE
        )
        try:
            return _read_rows(task, path, reader)
        except csv.Error as error:
            raise ValueError(
                f"{path}, line {reader.line_num}: {error}"
            ) from error


def _read_rows(task, path, reader):
    wanted = task.tsv_text_columns + (task.tsv_label_column,)
    positions = wanted
    if task.tsv_has_header:
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: the file is empty.")
        missing = [name for name in wanted if name not in header]
        if missing:
            raise ValueError(
                f"{path}, line 1: the header {_shown(header)} lacks the "
                f"column(s) {missing} of GLUE task {task.name!r}. Is this "
                f"the {task.tsv_folder} file of the GLUE data?"
            )
        positions = [header.index(name) for name in wanted]
        num_fields = len(header)
    else:
        # Without a header (CoLA), a row ends with the last column read.
        num_fields = max(positions) + 1
    texts = [[] for _ in task.tsv_text_columns]
    labels = []
    for row in reader:
        where = f"{path}, line {reader.line_num}"
        if not row:
            continue
        if len(row) < num_fields and not task.tsv_has_header:
            raise ValueError(
                f"{where}: expected at least {num_fields} tab-separated "
                f"fields, found {len(row)}."
            )
        if len(row) != num_fields:
            like = "like the header" if task.tsv_has_header else "per row"
            raise ValueError(
                f"{where}: expected {num_fields} tab-separated fields {like}, "
                f"found {len(row)}. The row is malformed (a missing field, or "
                "a tab inside a text)."
            )
        *row_texts, label = (row[position] for position in positions)
        for column, text in zip(texts, row_texts):
            column.append(text)
        labels.append(_parse_label(task, label, where))
    if not labels:
        raise ValueError(f"{path}: the file holds no examples.")
    return texts, labels


def _decoded_lines(file, path):
    """Yields the lines of a binary UTF-8 file, without its BOM.

    Lines end with `\\n` or `\\r\\n`; line `N` is line `N` in an editor.
    """
    for number, line in enumerate(file, start=1):
        where = f"{path}, line {number}"
        try:
            text = line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as error:
            if number == 1 and line.startswith(
                (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
            ):
                raise ValueError(
                    f"{where}: the text is not UTF-8 but UTF-16 (it starts "
                    "with a UTF-16 byte-order mark). GLUE files are UTF-8."
                ) from None
            raise ValueError(
                f"{where}: the text is not UTF-8 ({error.reason} at byte "
                f"{error.start} of the line). GLUE files are UTF-8."
            ) from None
        # The csv module would take a NUL as text and a lone CR as an error
        # with a misleading hint; neither is in a GLUE file.
        if "\x00" in text:
            raise ValueError(
                f"{where}: the line holds a NUL character, which no GLUE "
                "file does. Is the file damaged, or UTF-16?"
            )
        if "\r" in text.rstrip("\r\n"):
            raise ValueError(
                f"{where}: a carriage return (\\r) inside the line. Lines "
                "must end with \\n or \\r\\n."
            )
        yield text


def _parse_label(task, value, where):
    if task.is_regression:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        low, high = _SCORE_RANGE
        if not low <= score <= high:
            raise ValueError(
                f"{where}: the {task.name} score {_shown(value)} is not a "
                f"finite number from {low:g} to {high:g}."
            )
        return score
    if value in task.label_names:
        return task.label_names.index(value)
    try:
        class_id = int(value)
    except ValueError:
        class_id = -1
    if 0 <= class_id < task.num_classes:
        return class_id
    raise ValueError(
        f"{where}: the {task.name} label {_shown(value)} is neither one of "
        f"{list(task.label_names)} nor a class id from 0 to "
        f"{task.num_classes - 1}."
    )


def _shown(value, limit=80):
    """`repr(value)`, cut to `limit` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
