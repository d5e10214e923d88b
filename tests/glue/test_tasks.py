import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from keras_isobn.glue import TASKS
from keras_isobn.glue import GlueTask
from keras_isobn.glue import get_task

ALL_TASKS = [
    "cola",
    "sst2",
    "mrpc",
    "stsb",
    "qqp",
    "mnli",
    "qnli",
    "rte",
    "wnli",
]


def test_every_glue_task_is_known():
    assert sorted(TASKS) == sorted(ALL_TASKS)
    for name, task in TASKS.items():
        assert isinstance(task, GlueTask)
        assert task.name == name
        assert task.tfds_name == f"glue/{name}"


@pytest.mark.parametrize(
    "alias, name",
    [
        ("SST-2", "sst2"),
        ("sst-2", "sst2"),
        ("sst_2", "sst2"),
        ("sts-b", "stsb"),
        ("STS-B", "stsb"),
        ("CoLA", "cola"),
        (" MNLI ", "mnli"),
        ("qqp", "qqp"),
    ],
)
def test_get_task_accepts_aliases(alias, name):
    assert get_task(alias) is TASKS[name]


def test_get_task_returns_a_task_unchanged():
    task = TASKS["rte"]
    assert get_task(task) is task


def test_unknown_task_lists_the_known_ones():
    with pytest.raises(ValueError, match="Unknown GLUE task 'sst3'") as info:
        get_task("sst3")
    for name in ALL_TASKS:
        assert name in str(info.value)


def test_tasks_are_frozen():
    with pytest.raises(AttributeError):
        TASKS["cola"].name = "other"


@pytest.mark.parametrize(
    "name, num_classes, primary, metrics",
    [
        ("cola", 2, "mcc", ("mcc",)),
        ("sst2", 2, "accuracy", ("accuracy",)),
        ("mrpc", 2, "f1", ("f1", "accuracy")),
        ("stsb", 1, "pearson", ("pearson", "spearman")),
        ("qqp", 2, "f1", ("f1", "accuracy")),
        ("mnli", 3, "accuracy", ("accuracy",)),
        ("qnli", 2, "accuracy", ("accuracy",)),
        ("rte", 2, "accuracy", ("accuracy",)),
        ("wnli", 2, "accuracy", ("accuracy",)),
    ],
)
def test_classes_and_metrics(name, num_classes, primary, metrics):
    task = TASKS[name]
    assert task.num_classes == num_classes
    assert task.is_regression == (name == "stsb")
    assert task.primary_metric == primary
    assert task.metric_names == metrics


def test_paper_task_groups():
    small = {name for name, task in TASKS.items() if task.group == "small"}
    large = {name for name, task in TASKS.items() if task.group == "large"}
    assert small == {"cola", "stsb", "mrpc", "rte"}
    assert large == {"sst2", "mnli", "qnli", "qqp"}
    assert TASKS["wnli"].group is None


def test_pair_tasks():
    singles = {name for name, task in TASKS.items() if not task.is_pair}
    assert singles == {"cola", "sst2"}


def test_splits_and_tsv_paths():
    mnli = TASKS["mnli"]
    assert mnli.splits == (
        "train",
        "validation_matched",
        "validation_mismatched",
    )
    root = os.path.join("data", "glue")
    assert mnli.tsv_path(root, "validation_matched") == os.path.join(
        root, "MNLI", "dev_matched.tsv"
    )
    assert mnli.tsv_path(root, "validation_mismatched") == os.path.join(
        root, "MNLI", "dev_mismatched.tsv"
    )
    assert TASKS["sst2"].tsv_path(root, "validation") == os.path.join(
        root, "SST-2", "dev.tsv"
    )
    assert TASKS["cola"].tsv_path(root, "train") == os.path.join(
        root, "CoLA", "train.tsv"
    )


@pytest.mark.parametrize("split", ["test", "validation", "dev"])
def test_unknown_split_lists_the_splits(split):
    with pytest.raises(ValueError, match="Unknown split") as info:
        TASKS["mnli"].tsv_path("glue", split)
    assert "validation_matched" in str(info.value)


@pytest.mark.parametrize("name", ALL_TASKS)
def test_tasks_agree_with_the_tfds_glue_builder(name):
    task = TASKS[name]
    # Under mock_data the builder is made from TFDS's code, offline.
    with tfds.testing.mock_data():
        builder = tfds.builder(task.tfds_name)
    config = builder.builder_config
    features = builder.info.features
    assert tuple(config.text_features) == task.text_features
    assert config.data_dir == task.tsv_folder
    if task.is_regression:
        assert features["label"].np_dtype == np.float32
    else:
        assert tuple(features["label"].names) == task.label_names
    if name not in ("cola", "mrpc"):  # TFDS reads these two differently.
        assert tuple(config.text_features.values()) == task.tsv_text_columns
        assert config.label_column == task.tsv_label_column
