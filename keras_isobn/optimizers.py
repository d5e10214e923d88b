"""The optimizer of BERT fine-tuning: AdamW with warmup and linear decay."""

import keras

__all__ = ["FineTuningAdamW", "WarmupLinearDecay", "fine_tuning_adamw"]


@keras.saving.register_keras_serializable(package="keras_isobn")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """A linear warmup to a peak learning rate, then linear decay to 0.

    The schedule of BERT fine-tuning (`get_linear_schedule_with_warmup` of
    Hugging Face Transformers, used by the IsoBN authors). Registered with
    Keras, so a saved model compiled with it reloads with its optimizer
    after `import keras_isobn`.

    Args:
        peak_learning_rate: Float, the learning rate at the end of warmup.
        total_steps: Integer `>= 1`, the training steps; the rate is 0 from
            there on.
        warmup_steps: Integer `>= 0`, the steps of the linear warmup from 0.

    Example:

    >>> schedule = WarmupLinearDecay(1e-3, total_steps=100, warmup_steps=10)
    >>> [round(float(schedule(step)), 6) for step in (0, 5, 10, 55, 100)]
    [0.0, 0.0005, 0.001, 0.0005, 0.0]
    """

    def __init__(self, peak_learning_rate, total_steps, warmup_steps=0):
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                "Need total_steps >= 1 and 0 <= warmup_steps <= total_steps. "
                f"Received: total_steps={total_steps}, "
                f"warmup_steps={warmup_steps}"
            )
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        warmup = step / max(self.warmup_steps, 1)
        decay = (self.total_steps - step) / max(
            self.total_steps - self.warmup_steps, 1
        )
        factor = keras.ops.where(step < self.warmup_steps, warmup, decay)
        return self.peak_learning_rate * keras.ops.clip(factor, 0.0, 1.0)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
        }


def _backend_adamw_class():
    """The class of the objects `keras.optimizers.AdamW(...)` returns.

    On PyTorch, Keras swaps `keras.optimizers.AdamW` for a subclass of it
    that updates all variables at once with a few `torch._foreach_*`
    calls, but only when that exact class is instantiated: a subclass of
    `keras.optimizers.AdamW` falls back to an update variable by variable,
    about ten times the operations (and kernel launches) per step.
    Subclassing the class the public constructor really returns keeps the
    fast path. It is `keras.optimizers.AdamW` itself on TensorFlow and JAX.
    """
    return type(keras.optimizers.AdamW.__new__(keras.optimizers.AdamW))


@keras.saving.register_keras_serializable(package="keras_isobn")
class FineTuningAdamW(_backend_adamw_class()):
    """AdamW whose weight decay spares variables by name, also once reloaded.

    `keras.optimizers.AdamW.exclude_from_weight_decay()` is not part of the
    optimizer's config, so a reloaded AdamW would decay every variable
    again. This subclass keeps the excluded names in its config.

    It updates exactly as `keras.optimizers.AdamW` with the same arguments
    and exclusions does, with the same operations on every backend (on
    PyTorch, Keras's batched `torch._foreach_*` update).

    Args:
        exclude_from_weight_decay_names: Sequence of strings; variables
            whose name contains one of them get no weight decay. Defaults
            to biases and LayerNorm's scale and offset: `("bias",
            "gamma", "beta")`.
        **kwargs: `keras.optimizers.AdamW` arguments.
    """

    def __init__(
        self, exclude_from_weight_decay_names=("bias", "gamma", "beta"), **kwargs
    ):
        super().__init__(**kwargs)
        self.exclude_from_weight_decay_names = list(
            exclude_from_weight_decay_names
        )
        self.exclude_from_weight_decay(
            var_names=self.exclude_from_weight_decay_names
        )

    def get_config(self):
        config = super().get_config()
        config["exclude_from_weight_decay_names"] = (
            self.exclude_from_weight_decay_names
        )
        return config


def fine_tuning_adamw(
    learning_rate,
    total_steps,
    warmup_ratio=0.06,
    weight_decay=0.0,
    epsilon=1e-6,
):
    """AdamW as BERT is fine-tuned: warmup, linear decay, no decay on norms.

    Args:
        learning_rate: Float, the peak learning rate.
        total_steps: Integer `>= 1`, the training steps of the whole run.
        warmup_ratio: Float in `[0, 1)`, the share of the steps with a
            linear warmup. Defaults to `0.06`.
        weight_decay: Float, AdamW's decoupled weight decay, applied to
            neither biases nor LayerNorm scales and offsets (by variable
            name: `bias`, `gamma`, `beta`). Defaults to `0.0`.
        epsilon: Float, Adam's epsilon. Defaults to `1e-6`.

    Returns:
        A `FineTuningAdamW` (a `keras.optimizers.AdamW`) with a
        `WarmupLinearDecay` schedule.

    Example:

    ```python
    steps = len(train_ds) * epochs
    classifier.compile(optimizer=fine_tuning_adamw(5e-5, steps))
    ```
    """
    if not 0.0 <= warmup_ratio < 1.0:
        raise ValueError(
            f"`warmup_ratio` must be in [0, 1). Received: {warmup_ratio}"
        )
    return FineTuningAdamW(
        learning_rate=WarmupLinearDecay(
            learning_rate,
            total_steps=total_steps,
            warmup_steps=int(warmup_ratio * total_steps),
        ),
        weight_decay=weight_decay,
        epsilon=epsilon,
    )
