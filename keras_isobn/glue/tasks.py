"""The GLUE tasks: what each one reads, predicts and is scored by."""

import dataclasses
import os

__all__ = ["TASKS", "GlueTask", "get_task"]

# The TSV file of each split, in the layout written by GLUE's
# `download_glue_data.py`. Split names are those of TFDS `glue/<task>`.
_TSV_FILES = {
    "train": "train.tsv",
    "validation": "dev.tsv",
    "validation_matched": "dev_matched.tsv",
    "validation_mismatched": "dev_mismatched.tsv",
}


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """Description of one GLUE task.

    Everything the loaders and metrics of `keras_isobn.glue` need to know
    about a task lives here; nothing in it refers to a model.

    Args:
        name: String. The task name, as in TFDS (`"sst2"`, `"stsb"`, ...).
        tsv_folder: String. The task's folder in the original GLUE layout
            (`"SST-2"`, `"STS-B"`, ...).
        text_features: Tuple of 1 or 2 strings. The TFDS feature names of the
            text inputs, in input order (`("premise", "hypothesis")` for
            MNLI).
        tsv_text_columns: Tuple of 1 or 2 strings or integers. The TSV header
            names of the same text columns, or their 0-based positions for a
            file without a header (CoLA).
        tsv_label_column: String or integer. The TSV label column, by header
            name or by position.
        label_names: Tuple of strings. The class names in the order of the
            TFDS label ids (`label_names[i]` is class `i`). Empty for a
            regression task (STS-B).
        tsv_has_header: Boolean. Whether the TSV files start with a header
            line. Defaults to `True`; only CoLA's files have none.
        dev_splits: Tuple of strings. The TFDS names of the labelled
            evaluation splits: `("validation",)`, or for MNLI
            `("validation_matched", "validation_mismatched")`. Defaults to
            `("validation",)`.
        metric_names: Tuple of strings. The keys `compute_metrics` returns,
            the primary one (used to select a model) first: `("mcc",)` for
            CoLA, `("pearson", "spearman")` for STS-B, `("f1", "accuracy")`
            for MRPC and QQP. Defaults to `("accuracy",)`.
        group: String or `None`. `"small"` or `"large"`, the grouping of the
            IsoBN paper (small: CoLA, STS-B, MRPC, RTE; large: SST-2, MNLI,
            QNLI, QQP); `None` for WNLI, which the paper leaves out.
            Defaults to `"large"`.
    """

    name: str
    tsv_folder: str
    text_features: tuple
    tsv_text_columns: tuple
    tsv_label_column: object
    label_names: tuple
    tsv_has_header: bool = True
    dev_splits: tuple = ("validation",)
    metric_names: tuple = ("accuracy",)
    group: object = "large"

    @property
    def tfds_name(self):
        """The TFDS dataset name, e.g. `"glue/sst2"`."""
        return f"glue/{self.name}"

    @property
    def primary_metric(self):
        """The metric used to select a model: `metric_names[0]`."""
        return self.metric_names[0]

    @property
    def is_regression(self):
        """Whether the label is a float score (STS-B) and not a class."""
        return not self.label_names

    @property
    def num_classes(self):
        """The number of classes; `1` (one output) for regression."""
        return 1 if self.is_regression else len(self.label_names)

    @property
    def is_pair(self):
        """Whether an example is a pair of texts."""
        return len(self.text_features) == 2

    @property
    def splits(self):
        """All the labelled splits: `("train",) + dev_splits`."""
        return ("train",) + self.dev_splits

    def tsv_path(self, data_dir, split):
        """The path of a split's TSV file under a GLUE data directory.

        Args:
            data_dir: String or path-like. The GLUE data root, the folder
                that holds `CoLA/`, `SST-2/`, ...
            split: String. One of `self.splits`.

        Returns:
            A string, e.g. `"<data_dir>/MNLI/dev_matched.tsv"`.
        """
        self.check_split(split)
        return os.path.join(
            os.fspath(data_dir), self.tsv_folder, _TSV_FILES[split]
        )

    def check_split(self, split):
        """Raises a `ValueError` unless `split` is one of `self.splits`."""
        if split not in self.splits:
            raise ValueError(
                f"Unknown split {split!r} for GLUE task {self.name!r}. "
                f"Use one of {list(self.splits)} (test splits have no "
                "labels and are not supported)."
            )


_NLI = ("entailment", "not_entailment")

# Every GLUE task with labelled data, by name.
TASKS = {
    task.name: task
    for task in (
        GlueTask(
            name="cola",
            tsv_folder="CoLA",
            text_features=("sentence",),
            tsv_text_columns=(3,),
            tsv_label_column=1,
            label_names=("unacceptable", "acceptable"),
            tsv_has_header=False,
            metric_names=("mcc",),
            group="small",
        ),
        GlueTask(
            name="sst2",
            tsv_folder="SST-2",
            text_features=("sentence",),
            tsv_text_columns=("sentence",),
            tsv_label_column="label",
            label_names=("negative", "positive"),
        ),
        GlueTask(
            name="mrpc",
            tsv_folder="MRPC",
            text_features=("sentence1", "sentence2"),
            tsv_text_columns=("#1 String", "#2 String"),
            tsv_label_column="Quality",
            label_names=("not_equivalent", "equivalent"),
            metric_names=("f1", "accuracy"),
            group="small",
        ),
        GlueTask(
            name="stsb",
            tsv_folder="STS-B",
            text_features=("sentence1", "sentence2"),
            tsv_text_columns=("sentence1", "sentence2"),
            tsv_label_column="score",
            label_names=(),
            metric_names=("pearson", "spearman"),
            group="small",
        ),
        GlueTask(
            name="qqp",
            tsv_folder="QQP",
            text_features=("question1", "question2"),
            tsv_text_columns=("question1", "question2"),
            tsv_label_column="is_duplicate",
            label_names=("not_duplicate", "duplicate"),
            metric_names=("f1", "accuracy"),
        ),
        GlueTask(
            name="mnli",
            tsv_folder="MNLI",
            text_features=("premise", "hypothesis"),
            tsv_text_columns=("sentence1", "sentence2"),
            tsv_label_column="gold_label",
            label_names=("entailment", "neutral", "contradiction"),
            dev_splits=("validation_matched", "validation_mismatched"),
        ),
        GlueTask(
            name="qnli",
            tsv_folder="QNLI",
            text_features=("question", "sentence"),
            tsv_text_columns=("question", "sentence"),
            tsv_label_column="label",
            label_names=_NLI,
        ),
        GlueTask(
            name="rte",
            tsv_folder="RTE",
            text_features=("sentence1", "sentence2"),
            tsv_text_columns=("sentence1", "sentence2"),
            tsv_label_column="label",
            label_names=_NLI,
            group="small",
        ),
        # WNLI's TSV labels are 0/1 with 1 = entailment, hence TFDS's order.
        GlueTask(
            name="wnli",
            tsv_folder="WNLI",
            text_features=("sentence1", "sentence2"),
            tsv_text_columns=("sentence1", "sentence2"),
            tsv_label_column="label",
            label_names=_NLI[::-1],
            group=None,
        ),
    )
}


def get_task(name):
    """Returns the `GlueTask` of a task name.

    Names are case-insensitive, and the GLUE folder spellings are accepted
    too (`"SST-2"`, `"sts-b"`, `"CoLA"`, `"sst_2"`).

    Args:
        name: String, a task name, or a `GlueTask` (returned as is).

    Returns:
        A `GlueTask`.

    Raises:
        ValueError: if the task is not a GLUE task; the message lists the
            known ones.

    Example:

    >>> task = get_task("STS-B")
    >>> task.name, task.is_regression, task.primary_metric
    ('stsb', True, 'pearson')
    """
    if isinstance(name, GlueTask):
        return name
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    if key not in TASKS:
        raise ValueError(
            f"Unknown GLUE task {name!r}. Known tasks: {', '.join(TASKS)}."
        )
    return TASKS[key]
