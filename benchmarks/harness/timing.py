"""Timing: calls in alternation, step clocks, rates and ratios."""

import contextlib
import functools
import time

import numpy as np


def summarize(times):
    """Median, quartiles, minimum and count of a list of seconds."""
    times = np.asarray(times, dtype="float64")
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return {"median_s": median, "q1_s": q1, "q3_s": q3,
            "min_s": times.min(), "count": int(times.size)}


def paired_ratio(numerator, denominator):
    """Median and quartiles of the step-by-step ratios of two timings."""
    ratios = np.asarray(numerator["steps"]) / np.asarray(denominator["steps"])
    q1, median, q3 = np.percentile(ratios, [25, 50, 75])
    return {"median": median, "q1": q1, "q3": q3,
            "ratio_of_medians": numerator["median_s"] / denominator["median_s"]}


def rate(times, steps, batch):
    """`summarize(times)` of blocks of `steps` steps, with examples/s."""
    return dict(summarize(times), steps_per_block=steps,
                examples_per_s=steps * batch / float(np.median(times)))


def alternate(functions, rounds, warmup=1, max_rounds=None):
    """Calls several functions in turn and times every call.

    Each round calls each function once, in an order rotated by one each
    round, so that a change of load on a shared machine hits all alike.

    Args:
        functions: Dict of name to a function of the call's index that
            does one unit of work, waits for it and returns what to keep.
        rounds: Number of timed rounds.
        warmup: Untimed calls of each function first (the first one's
            seconds are kept as `compile_s`).
        max_rounds: Optional dict of name to fewer timed calls.

    Returns:
        Dict of name to `{"times", "outputs", "compile_s"}`.
    """
    names, limits = list(functions), max_rounds or {}
    timed = {name: {"times": [], "outputs": [], "compile_s": None}
             for name in names}
    for name in names:
        for index in range(warmup):
            start = time.perf_counter()
            functions[name](index)
            if index == 0:
                timed[name]["compile_s"] = time.perf_counter() - start
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            if len(timed[name]["times"]) >= limits.get(name, rounds):
                continue
            start = time.perf_counter()
            output = functions[name](index)
            timed[name]["times"].append(time.perf_counter() - start)
            timed[name]["outputs"].append(output)
    return timed


def steady_rate(times, batch_size, skip=None):
    """Examples/s between the end of step `skip` and the last step.

    `skip` (default: a tenth of the steps, at least 1) leaves out the
    compilation and warm-up; `None` with fewer than 3 steps.
    """
    if len(times) < 3:
        return None
    skip = max(1, len(times) // 10) if skip is None else skip
    skip = min(skip, len(times) - 2)
    return (len(times) - 1 - skip) * batch_size / (times[-1] - times[skip])


def step_clock(wait=True):
    """A Keras callback recording when each train step ends (`.times`).

    With `wait`, it reads the step's loss first, which waits for the step:
    with asynchronous dispatch (JAX) the interval between two ends is then
    one whole step.
    """
    import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_end(self, batch, logs=None):
            if wait and logs and "loss" in logs:
                float(logs["loss"])
            self.times.append(time.perf_counter())

    return Clock()


def jax_state(model, copy=False):
    """A compiled model's state, as its JAX `train_step` takes it.

    With `copy=True`, copies of the values: safe to donate to a jitted
    step without touching the model's variables.
    """
    import jax.numpy as jnp

    groups = (model.trainable_variables, model.non_trainable_variables,
              model.optimizer.variables, model.metrics_variables)
    return tuple([jnp.copy(v.value) if copy else v.value for v in variables]
                 for variables in groups)


class Phases:
    """Seconds per phase of a job; a phase inside another counts once.

    E.g. a save within `fit` is taken out of `fit`. `train`: the epochs'
    time less the phases timed within them, i.e. the training steps.
    """

    def __init__(self):
        self.seconds, self.epochs, self.evaluations = {}, [], []
        self._inner = [0.0]  # Per open phase: the seconds of its inner ones.

    @contextlib.contextmanager
    def __call__(self, name):
        start = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            self._add(name, time.perf_counter() - start, self._inner.pop())

    def _add(self, name, seconds, inner=0.0):
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds - inner
        self._inner[-1] += seconds

    def wrap(self, owner, attribute, name, examples=None):
        """Times each call of `owner.<attribute>` as phase `name`.

        `examples(*args, **kwargs)`: the examples a call evaluates, to
        record `[examples, seconds]` in `evaluations`.
        """
        function = getattr(owner, attribute)

        @functools.wraps(function)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            with self(name):
                result = function(*args, **kwargs)
            if examples:
                count = examples(*args, **kwargs)
                self.evaluations.append([count, time.perf_counter() - start])
            return result

        setattr(owner, attribute, timed)

    def epoch_begin(self):
        self._epoch = time.perf_counter(), self._inner[-1]

    def epoch_end(self):
        start, inner = self._epoch
        seconds = time.perf_counter() - start - (self._inner[-1] - inner)
        self.epochs.append(seconds)
        self._add("train", seconds)


def time_keras_epochs(phases):
    """Marks the epochs of every Keras `fit` in `phases`.

    An epoch ends when its logs are computed (the last step done), before
    any callback's `on_epoch_end` (the recipe's evaluations and saves).
    """
    import keras

    callbacks = keras.callbacks.CallbackList
    begin, end = callbacks.on_epoch_begin, callbacks.on_epoch_end

    def on_epoch_begin(self, epoch, logs=None):
        phases.epoch_begin()
        return begin(self, epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        keras.tree.map_structure(keras.ops.convert_to_numpy, logs or {})
        phases.epoch_end()
        return end(self, epoch, logs)

    callbacks.on_epoch_begin = on_epoch_begin
    callbacks.on_epoch_end = on_epoch_end
