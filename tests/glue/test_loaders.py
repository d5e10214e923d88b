import os

import numpy as np
import pytest

from keras_isobn.glue import GlueSplit
from keras_isobn.glue import get_task
from keras_isobn.glue import load_split

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

# What each fixture file holds, written out by hand: (texts, labels).
EXPECTED = {
    ("cola", "train"): (
        [
            [
                "Our team won't accept this plan, let alone the next one.",
                "They ate the kitchen.",
                'He said "no and left.',
                "She might not] have left early.",
            ]
        ],
        [1, 0, 1, 0],
    ),
    ("sst2", "validation"): (
        [
            [
                "a warm and often funny film . ",
                "dull , flat and far too long ",
                'a "quirky , crowd-pleasing film ',
            ]
        ],
        [1, 0, 1],
    ),
    ("mrpc", "validation"): (
        [
            [
                "The bank said profits rose 5 percent .",
                "Shares fell on Monday .",
            ],
            [
                '" Profits rose 5 percent , " the bank said .',
                "The company 's shares rose on Tuesday .",
            ],
        ],
        [1, 0],
    ),
    ("stsb", "train"): (
        [
            [
                "A bird is flying away.",
                "A girl is reading a book.",
                "Café owner wins prize",
            ],
            [
                "A small bird is flying away.",
                'A girl is reading a "thick book.',
                "Rain expected today",
            ],
        ],
        [5.0, 3.8, 0.25],
    ),
    ("qqp", "validation"): (
        [
            ["How do I learn Python?", "Why is the sky blue?"],
            ["What is the best way to learn Python?", "Why is grass green?"],
        ],
        [1, 0],
    ),
    ("mnli", "validation_matched"): (
        [
            [
                "The new rules are fine",
                'She said "the report lists every office',
                "yeah i went there and i did that",
            ],
            [
                "Everybody loves the newest rules ",
                "The report lists no offices.",
                "I did that.",
            ],
        ],
        [1, 2, 0],  # neutral, contradiction, entailment
    ),
    ("mnli", "validation_mismatched"): (
        [
            ["Your gift paid for the new library."],
            ["Your gift paid for nothing."],
        ],
        [2],
    ),
    ("qnli", "validation"): (
        [
            [
                "When did the new bridge open?",
                "Which river flows through the capital?",
            ],
            [
                "The new bridge opened in May, after two years of work.",
                'The "old canal was closed in 1950.',
            ],
        ],
        [0, 1],  # entailment, not_entailment
    ),
    ("rte", "train"): (
        [
            [
                "No gold was found in the old mine this year.",
                "The town square, quiet after the mayor retired, became a "
                'place of "celebration.',
            ],
            ["Gold was found in the old mine.", "The mayor retired."],
        ],
        [1, 0],  # not_entailment, entailment
    ),
    ("wnli", "train"): (
        [
            [
                "Anna pushed a nail into the plank. When she pulled the nail "
                "out, it had a hole.",
                "Tom could not reach the shelf above Ben because he is so "
                "short.",
            ],
            ["The plank had a hole.", "Ben is so short."],
        ],
        [1, 0],  # TSV 1 = entailment = TFDS class 1
    ),
}


@pytest.mark.parametrize("task, split", sorted(EXPECTED))
def test_tsv_fixtures_load_exactly(task, split):
    texts, labels = EXPECTED[(task, split)]
    result = load_split(task, split, data_dir=FIXTURES)
    assert isinstance(result, GlueSplit)
    assert result.task.name == task
    assert result.split == split
    assert len(result) == len(labels)
    assert len(result.texts) == len(texts)
    for column, expected in zip(result.texts, texts):
        assert column.dtype == object
        assert column.shape == (len(labels),)
        assert all(type(text) is str for text in column)
        assert column.tolist() == expected
    if task == "stsb":
        assert result.labels.dtype == np.float32
        np.testing.assert_allclose(result.labels, labels, rtol=0, atol=1e-7)
    else:
        assert result.labels.dtype == np.int32
        assert result.labels.tolist() == labels


def test_mrpc_byte_order_mark_is_dropped():
    path = os.path.join(FIXTURES, "MRPC", "dev.tsv")
    with open(path, "rb") as file:
        assert file.read(3) == b"\xef\xbb\xbf"  # The fixture has the quirk.
    result = load_split("MRPC", "validation", data_dir=FIXTURES)
    assert result.labels.tolist() == [1, 0]


def test_path_like_data_dir():
    import pathlib

    result = load_split("sst2", "validation", data_dir=pathlib.Path(FIXTURES))
    assert len(result) == 3


def test_features_are_classifier_inputs():
    single = load_split("sst2", "validation", data_dir=FIXTURES)
    assert single.features is single.texts[0]
    pair = load_split("qnli", "validation", data_dir=FIXTURES)
    assert isinstance(pair.features, tuple) and len(pair.features) == 2
    assert pair.features[0][1] == "Which river flows through the capital?"


def _write(path, text, encoding="utf-8"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as file:
        file.write(text.encode(encoding) if isinstance(text, str) else text)
    return path


def test_missing_file_names_the_path(tmp_path):
    expected = os.path.join(str(tmp_path), "RTE", "dev.tsv")
    with pytest.raises(FileNotFoundError) as info:
        load_split("rte", "validation", data_dir=str(tmp_path))
    assert expected in str(info.value)
    assert "RTE/train.tsv" in str(info.value)


def test_row_with_wrong_field_count_names_path_and_line(tmp_path):
    path = _write(
        os.path.join(tmp_path, "SST-2", "train.tsv"),
        "sentence\tlabel\ngood film\t1\nbad\tfilm\t0\n",
    )
    with pytest.raises(ValueError) as info:
        load_split("sst2", "train", data_dir=tmp_path)
    message = str(info.value)
    assert f"{path}, line 3" in message
    assert "expected 2" in message and "found 3" in message


def test_headerless_row_too_short_names_path_and_line(tmp_path):
    path = _write(
        os.path.join(tmp_path, "CoLA", "train.tsv"),
        "gj04\t1\t\tFine.\ngj04\t0\t*\n",
    )
    with pytest.raises(ValueError, match="at least 4") as info:
        load_split("cola", "train", data_dir=tmp_path)
    assert f"{path}, line 2" in str(info.value)


def test_blank_lines_are_skipped_and_lines_still_counted(tmp_path):
    path = _write(
        os.path.join(tmp_path, "SST-2", "train.tsv"),
        "sentence\tlabel\ngood\t1\n\nfine\t1\r\nbad\t2\n",
    )
    with pytest.raises(ValueError) as info:
        load_split("sst2", "train", data_dir=tmp_path)
    assert f"{path}, line 5" in str(info.value)
    _write(path, "sentence\tlabel\ngood\t1\n\nfine\t1\r\nbad\t0\n")
    result = load_split("sst2", "train", data_dir=tmp_path)
    assert result.texts[0].tolist() == ["good", "fine", "bad"]
    assert result.labels.tolist() == [1, 1, 0]


@pytest.mark.parametrize(
    "task, folder, header, bad_label",
    [
        ("rte", "RTE", "index\tsentence1\tsentence2\tlabel", "neutral"),
        ("sst2", "SST-2", "sentence\tlabel", "2"),
        ("sst2", "SST-2", "sentence\tlabel", "-1"),
        ("mrpc", "MRPC", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", ""),
    ],
)
def test_bad_class_label_names_path_line_and_value(
    tmp_path, task, folder, header, bad_label
):
    num_fields = header.count("\t") + 1
    good = ["1"] * num_fields
    bad = ["x"] * num_fields
    label_index = header.split("\t").index(
        {"rte": "label", "sst2": "label", "mrpc": "Quality"}[task]
    )
    good[label_index] = "entailment" if task == "rte" else "1"
    bad[label_index] = bad_label
    path = _write(
        os.path.join(tmp_path, folder, "train.tsv"),
        "\n".join([header, "\t".join(good), "\t".join(bad)]) + "\n",
    )
    with pytest.raises(ValueError) as info:
        load_split(task, "train", data_dir=tmp_path)
    message = str(info.value)
    assert f"{path}, line 3" in message
    assert repr(bad_label) in message


@pytest.mark.parametrize("score", ["high", "nan", "inf", ""])
def test_bad_stsb_score_names_path_and_line(tmp_path, score):
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\t"
        "sentence1\tsentence2\tscore"
    )
    row = "0\tg\tf\ty\t0\tnone\tnone\tA man.\tA woman.\t"
    path = _write(
        os.path.join(tmp_path, "STS-B", "dev.tsv"),
        f"{header}\n{row}1.5\n{row}{score}\n",
    )
    with pytest.raises(ValueError, match="not a finite number") as info:
        load_split("sts-b", "validation", data_dir=tmp_path)
    assert f"{path}, line 3" in str(info.value)


def test_missing_header_column_is_named(tmp_path):
    path = _write(
        os.path.join(tmp_path, "SST-2", "train.tsv"),
        "text\tlabel\ngood\t1\n",
    )
    with pytest.raises(ValueError) as info:
        load_split("sst2", "train", data_dir=tmp_path)
    message = str(info.value)
    assert f"{path}, line 1" in message and "'sentence'" in message


def test_text_that_is_not_utf8_names_path_and_line(tmp_path):
    path = _write(
        os.path.join(tmp_path, "SST-2", "train.tsv"),
        "sentence\tlabel\ngood\t1\ncaf\xe9\t1\n".encode("latin-1"),
    )
    with pytest.raises(ValueError, match="not UTF-8") as info:
        load_split("sst2", "train", data_dir=tmp_path)
    assert f"{path}, line 3" in str(info.value)


@pytest.mark.parametrize(
    "folder, data, line, expected",
    [
        ("CoLA", b"gj04\t1\t\tHe said\tno.\n", 1, "expected 4"),
        ("SST-2", b"sentence\tlabel\ngood\x00\t1\n", 2, "NUL"),
        ("SST-2", b"sentence\tlabel\ngo\rod\t1\n", 2, "carriage return"),
        ("SST-2", "sentence\tlabel\n".encode("utf-16"), 1, "UTF-16"),
        ("SST-2", "sentence\tlabel\n".encode("utf-16-le"), 1, "UTF-16"),
        ("STS-B", b"sentence1\tsentence2\tscore\nA.\tB.\t1e39\n", 2, "0 to 5"),
        ("STS-B", b"sentence1\tsentence2\tscore\nA.\tB.\t-1\n", 2, "0 to 5"),
    ],
)
def test_damaged_file_names_path_and_line(
    tmp_path, folder, data, line, expected
):
    task = {"CoLA": "cola", "SST-2": "sst2", "STS-B": "stsb"}[folder]
    path = _write(os.path.join(tmp_path, folder, "train.tsv"), data)
    with pytest.raises(ValueError, match=expected) as info:
        load_split(task, "train", data_dir=tmp_path)
    assert type(info.value) is ValueError
    assert str(info.value).startswith(f"{path}, line {line}: ")


def test_long_values_are_cut_short_in_messages(tmp_path):
    _write(
        os.path.join(tmp_path, "SST-2", "train.tsv"),
        "sentence\tlabel\ngood\t" + "9" * 10_000 + "\n",
    )
    with pytest.raises(ValueError, match=r"'9999.*\.\.\. is neither") as info:
        load_split("sst2", "train", data_dir=tmp_path)
    assert len(str(info.value)) < 300


def test_csv_error_names_path_and_line(tmp_path):
    # A field over the csv module's size limit (131072 characters).
    path = _write(
        os.path.join(tmp_path, "SST-2", "train.tsv"),
        "sentence\tlabel\ngood\t1\n" + "a" * 200_000 + "\t0\n",
    )
    with pytest.raises(ValueError, match="field larger than") as info:
        load_split("sst2", "train", data_dir=tmp_path)
    assert f"{path}, line 3" in str(info.value)


@pytest.mark.parametrize("text", ["", "sentence\tlabel\n"])
def test_file_without_examples_is_an_error(tmp_path, text):
    path = _write(os.path.join(tmp_path, "SST-2", "train.tsv"), text)
    with pytest.raises(ValueError) as info:
        load_split("sst2", "train", data_dir=tmp_path)
    assert path in str(info.value)
    assert "None" not in str(info.value)


def test_unknown_task_and_split_errors():
    with pytest.raises(ValueError, match="Known tasks: cola, sst2"):
        load_split("glue", "train", data_dir=FIXTURES)
    with pytest.raises(ValueError, match="Unknown split 'test'"):
        load_split("sst2", "test", data_dir=FIXTURES)


def _toy_split(num_examples):
    texts = np.array([f"text {i}" for i in range(num_examples)], dtype=object)
    others = np.array([f"other {i}" for i in range(num_examples)], dtype=object)
    labels = (np.arange(num_examples) % 3).astype("int32")
    return GlueSplit(
        task=get_task("mnli"),
        split="train",
        texts=(texts, others),
        labels=labels,
    )


def test_limit_is_a_seeded_shuffle_that_keeps_rows_together():
    split = _toy_split(50)
    first = split.limit(10, seed=3)
    again = split.limit(10, seed=3)
    other = split.limit(10, seed=4)
    assert len(first) == 10
    assert first.texts[0].tolist() == again.texts[0].tolist()
    assert first.texts[0].tolist() != other.texts[0].tolist()
    # Not simply the first rows of the file.
    assert first.texts[0].tolist() != split.texts[0][:10].tolist()
    # Each kept example keeps its own second text and label.
    for text, other_text, label in zip(*first.texts, first.labels):
        index = int(text.split()[1])
        assert other_text == f"other {index}"
        assert label == index % 3
    assert len(set(first.texts[0].tolist())) == 10
    # The split itself is unchanged.
    assert split.texts[0][0] == "text 0" and len(split) == 50


def test_limit_larger_than_the_split_keeps_everything_shuffled():
    split = _toy_split(20)
    result = split.limit(1000, seed=0)
    assert len(result) == 20
    assert sorted(result.texts[0].tolist()) == sorted(split.texts[0].tolist())
    assert result.texts[0].tolist() != split.texts[0].tolist()


def test_limit_accepts_numpy_integers():
    assert len(_toy_split(20).limit(np.int64(5))) == 5


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "10", None])
def test_limit_rejects_non_positive_integers(bad):
    with pytest.raises(ValueError, match="positive integer"):
        _toy_split(5).limit(bad)


def test_to_tf_dataset_single_sentence():
    import tensorflow as tf

    split = load_split("sst2", "validation", data_dir=FIXTURES)
    dataset = split.to_tf_dataset()
    x_spec, y_spec = dataset.element_spec
    assert x_spec.dtype == tf.string and x_spec.shape == ()
    assert y_spec.dtype == tf.int32
    rows = list(dataset.as_numpy_iterator())
    assert [x.decode("utf-8") for x, _ in rows] == split.texts[0].tolist()
    assert [int(y) for _, y in rows] == [1, 0, 1]


def test_to_tf_dataset_pairs_and_scores():
    import tensorflow as tf

    split = load_split("stsb", "train", data_dir=FIXTURES)
    dataset = split.to_tf_dataset()
    (s1_spec, s2_spec), y_spec = dataset.element_spec
    assert s1_spec.dtype == tf.string and s2_spec.dtype == tf.string
    assert y_spec.dtype == tf.float32
    (s1, s2), y = list(dataset.as_numpy_iterator())[2]
    assert s1.decode("utf-8") == "Café owner wins prize"
    assert s2.decode("utf-8") == "Rain expected today"
    assert y == np.float32(0.25)
    batch = next(iter(dataset.batch(2)))
    assert batch[0][0].shape == (2,) and batch[1].shape == (2,)
