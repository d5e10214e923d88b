"""Each epoch's wall time and learning rate, in the logs."""

import time

import keras

__all__ = ["EpochLogs"]


class EpochLogs(keras.callbacks.Callback):
    """Adds each epoch's seconds and last learning rate to its logs.

    `logs["epoch_time_s"]` is the wall time of the epoch (evaluation by
    earlier callbacks included) and `logs["learning_rate"]` the
    optimizer's learning rate at its end (a schedule's current value), so
    `CSVLogger`, `TensorBoard` and `History` record them. Put it before
    the callbacks that should see them.

    Example:

    ```python
    history = model.fit(x, y, epochs=2, callbacks=[EpochLogs()])
    history.history["epoch_time_s"], history.history["learning_rate"]
    ```
    """

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        rate = self.model.optimizer.learning_rate
        logs["learning_rate"] = float(keras.ops.convert_to_numpy(rate))
        logs["epoch_time_s"] = time.time() - self._start
