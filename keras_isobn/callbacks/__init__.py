"""Callbacks for fine-tuning: isotropy, whole-set metrics, exact resume.

- `EVkCallback`: EV_k of the embeddings entering and leaving a layer.
- `WholeSetMetrics`: metrics that do not average over batches (Matthews or
  Pearson correlation, F1), on a whole evaluation set, at each epoch end.
- `EpochLogs`: each epoch's seconds and learning rate, in the logs.
- `TrainingCheckpoint` and `ResumableEarlyStopping`: a run killed and
  started again ends as one never interrupted.
"""

from keras_isobn.callbacks.epoch_logs import EpochLogs
from keras_isobn.callbacks.ev_k_callback import EVkCallback
from keras_isobn.callbacks.training_checkpoint import ResumableEarlyStopping
from keras_isobn.callbacks.training_checkpoint import TrainingCheckpoint
from keras_isobn.callbacks.whole_set_metrics import WholeSetMetrics

__all__ = [
    "EpochLogs",
    "EVkCallback",
    "ResumableEarlyStopping",
    "TrainingCheckpoint",
    "WholeSetMetrics",
]
