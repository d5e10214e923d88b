import keras
import numpy as np

from keras_isobn.callbacks import EpochLogs
from keras_isobn.optimizers import WarmupLinearDecay


def test_epoch_logs_record_time_and_the_schedules_learning_rate():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    schedule = WarmupLinearDecay(1e-2, total_steps=8, warmup_steps=2)
    model.compile(keras.optimizers.SGD(schedule), "mse")
    x, y = np.ones((16, 3), "float32"), np.ones((16, 1), "float32")
    history = model.fit(
        x, y, batch_size=4, epochs=2, callbacks=[EpochLogs()], verbose=0
    )
    rates = history.history["learning_rate"]
    np.testing.assert_allclose(rates, [schedule(4), schedule(8)], atol=1e-7)
    assert all(seconds > 0 for seconds in history.history["epoch_time_s"])
