"""Loading GLUE through TFDS, offline, with `tfds.testing.mock_data`."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from keras_isobn.glue import load_split


@pytest.mark.parametrize(
    "task, split, num_texts, num_classes",
    [
        ("sst2", "train", 1, 2),
        ("cola", "validation", 1, 2),
        ("mnli", "validation_mismatched", 2, 3),
        ("qqp", "validation", 2, 2),
    ],
)
def test_random_mock_data_converts_to_a_glue_split(
    task, split, num_texts, num_classes
):
    with tfds.testing.mock_data(num_examples=7):
        result = load_split(task, split)
    assert result.split == split
    assert len(result) == 7
    assert len(result.texts) == num_texts
    for column in result.texts:
        assert column.dtype == object and column.shape == (7,)
        assert all(type(text) is str for text in column)
    assert result.labels.dtype == np.int32
    assert np.all((result.labels >= 0) & (result.labels < num_classes))


def test_random_mock_regression_labels_are_float32():
    with tfds.testing.mock_data(num_examples=5):
        result = load_split("stsb", "train")
    assert result.labels.dtype == np.float32
    assert result.labels.shape == (5,)


def _fixed_examples(examples, calls):
    """An `as_dataset_fn` serving `examples` and recording the split."""

    def as_dataset(self, split, **kwargs):
        calls.append((self.name, self.builder_config.name, str(split)))
        columns = {
            key: [example[key] for example in examples] for key in examples[0]
        }
        return tf.data.Dataset.from_tensor_slices(
            {key: tf.constant(value) for key, value in columns.items()}
        )

    return as_dataset


def test_known_examples_map_features_labels_and_order():
    # Served out of `idx` order, with the features in another order than
    # the task's inputs and UTF-8 text.
    examples = [
        {"hypothesis": "h2", "premise": "p2 ü", "label": 2, "idx": 2},
        {"hypothesis": "h0", "premise": "p0", "label": 0, "idx": 0},
        {"hypothesis": "h1 ñ", "premise": "p1", "label": 1, "idx": 1},
    ]
    calls = []
    for example in examples:
        example["label"] = np.int64(example["label"])
        example["idx"] = np.int32(example["idx"])
    with tfds.testing.mock_data(
        as_dataset_fn=_fixed_examples(examples, calls)
    ):
        result = load_split("MNLI", "validation_matched")
    assert calls == [("glue", "mnli", "validation_matched")]
    premise, hypothesis = result.features
    assert premise.tolist() == ["p0", "p1", "p2 ü"]
    assert hypothesis.tolist() == ["h0", "h1 ñ", "h2"]
    assert result.labels.tolist() == [0, 1, 2]
    assert result.labels.dtype == np.int32


def test_known_regression_examples():
    examples = [
        {
            "sentence1": "a",
            "sentence2": "b",
            "label": np.float32(4.25),
            "idx": np.int32(1),
        },
        {
            "sentence1": "c",
            "sentence2": "d",
            "label": np.float32(0.5),
            "idx": np.int32(0),
        },
    ]
    calls = []
    with tfds.testing.mock_data(
        as_dataset_fn=_fixed_examples(examples, calls)
    ):
        result = load_split("sts-b", "train")
    assert calls == [("glue", "stsb", "train")]
    assert result.texts[0].tolist() == ["c", "a"]
    assert result.texts[1].tolist() == ["d", "b"]
    np.testing.assert_array_equal(result.labels, [0.5, 4.25])
    assert result.labels.dtype == np.float32


def test_tfds_failure_suggests_the_tsv_files(monkeypatch):
    def offline_load(*args, **kwargs):
        raise ConnectionError("no network here")

    monkeypatch.setattr(tfds, "load", offline_load)
    with pytest.raises(RuntimeError) as info:
        load_split("rte", "train")
    message = str(info.value)
    assert "'glue/rte'" in message and "no network here" in message
    assert "data_dir" in message and "RTE/" in message
    assert isinstance(info.value.__cause__, ConnectionError)


def test_tfds_data_dir_is_passed_on(monkeypatch):
    received = {}

    def recording_load(name, **kwargs):
        received.update(kwargs, name=name)
        raise ConnectionError("stop")

    monkeypatch.setattr(tfds, "load", recording_load)
    with pytest.raises(RuntimeError):
        load_split("qnli", "validation", tfds_data_dir="/some/tfds")
    assert received["name"] == "glue/qnli"
    assert received["split"] == "validation"
    assert received["data_dir"] == "/some/tfds"


def test_unprepared_dataset_offline_fails_without_downloading(
    monkeypatch, tmp_path
):
    # Offline (the download host unreachable), an unprepared dataset fails
    # at once with the fix, instead of TFDS's minutes of download retries.
    from keras_isobn.glue import loaders

    downloads = []
    original = tfds.load

    def recording_load(*args, **kwargs):
        downloads.append(kwargs.get("download", True))
        return original(*args, **kwargs)

    monkeypatch.setattr(tfds, "load", recording_load)
    monkeypatch.setattr(loaders, "_reachable", lambda host: False)
    with pytest.raises(RuntimeError) as info:
        load_split("sst2", "train", tfds_data_dir=str(tmp_path))
    assert downloads == [False]
    message = str(info.value)
    assert "cannot be reached" in message and "--data-dir" in message
    assert isinstance(info.value.__cause__, ConnectionError)
