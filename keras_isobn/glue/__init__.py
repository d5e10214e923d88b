"""GLUE data for keras-isobn: tasks, loaders, metrics and a sample dataset.

Typical use (this package knows no model; see `recipes/glue.py`):

```python
from keras_isobn import glue

task = glue.get_task("mrpc")
train = glue.load_split(task, "train", data_dir=glue.sample_data_dir())
train = train.limit(256, seed=0)             # optional: a small budget
dev = glue.load_split(task, "validation", data_dir=glue.sample_data_dir())
ds = train.to_tf_dataset().shuffle(256).batch(32)  # (x, y) for KerasHub
...
scores = glue.compute_metrics(task, dev.labels, model.predict(dev.features))
best = scores[task.primary_metric]           # "f1" for MRPC
```

`glue.metric_fn(task)` is the same metrics as a function of `(labels,
predictions)`, for `keras_isobn.callbacks.WholeSetMetrics` to log them at
every epoch end.
"""

from keras_isobn.glue.loaders import GlueSplit
from keras_isobn.glue.loaders import load_split
from keras_isobn.glue.metrics import compute_metrics
from keras_isobn.glue.metrics import metric_fn
from keras_isobn.glue.sample import sample_data_dir
from keras_isobn.glue.sample import sample_vocabulary_path
from keras_isobn.glue.tasks import TASKS
from keras_isobn.glue.tasks import GlueTask
from keras_isobn.glue.tasks import get_task

__all__ = [
    "TASKS",
    "GlueSplit",
    "GlueTask",
    "compute_metrics",
    "get_task",
    "load_split",
    "metric_fn",
    "sample_data_dir",
    "sample_vocabulary_path",
]
