"""Data-parallel training on the backend's own distributed engine.

IsoBN's statistics are those of the *global* batch, as on one device with
the whole batch:

- JAX: `keras.distribution.DataParallel` (or `ModelParallel` with a
  `LayoutMap`) compiles one program over all devices, so the batch sums are
  global without anything else to do.
- TensorFlow: `tf.distribute.MirroredStrategy` runs one copy of the step
  per replica. Each replica computes the statistics of its own share of the
  batch and keeps its own copy of the moving statistics (what is read and
  saved is the first replica's), unless the layers are `synchronized`
  (`synchronize_statistics(model)`): then the batch sums and sums of outer
  products are all-reduced, and every copy holds the statistics of the
  global batch.
- PyTorch: single-process training on one device only; a data-parallel
  or synchronized request raises an error.

Several processes (hosts) train together on JAX: each process calls
`initialize_cluster()` (or `join_cluster()`, from the `KERAS_DISTRIBUTION_*`
variables) first, then builds and fits the model in
`data_parallel_scope("multi_worker")`, the same program everywhere. One
program runs over the devices of all processes, whose collectives (gloo
on CPUs) make the batch statistics and gradients the global batch's.
`stop_cluster_on_error()` stops the survivors when a process dies. On
TensorFlow, Keras 3's `fit` fails under `MultiWorkerMirroredStrategy`
(keras-team/keras#20585), so a multi-process request raises an error there,
as on PyTorch.
"""

from keras_isobn.distribution.backend_support import unsupported_backend_error
from keras_isobn.distribution.cluster import ENVIRONMENT
from keras_isobn.distribution.cluster import barrier
from keras_isobn.distribution.cluster import cluster_environment
from keras_isobn.distribution.cluster import initialize_cluster
from keras_isobn.distribution.cluster import is_chief
from keras_isobn.distribution.cluster import join_cluster
from keras_isobn.distribution.cluster import process_count
from keras_isobn.distribution.cluster import process_index
from keras_isobn.distribution.data_parallel import KINDS
from keras_isobn.distribution.data_parallel import data_parallel_scope
from keras_isobn.distribution.data_parallel import synchronize_statistics
from keras_isobn.distribution.devices import accelerator_visible
from keras_isobn.distribution.devices import virtual_cpu_devices
from keras_isobn.distribution.fault_guard import stop_cluster_on_error

__all__ = [
    "ENVIRONMENT",
    "KINDS",
    "accelerator_visible",
    "barrier",
    "cluster_environment",
    "data_parallel_scope",
    "initialize_cluster",
    "is_chief",
    "join_cluster",
    "process_count",
    "process_index",
    "stop_cluster_on_error",
    "synchronize_statistics",
    "unsupported_backend_error",
    "virtual_cpu_devices",
]
