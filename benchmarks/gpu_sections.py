"""The sections of the GPU check (`benchmarks.gpu_check part`).

Each `section_<name>(bundle, args)` measures on the loaded backend and
returns a dict, with `"checks"` (name to bool) where it checks.
"""

import contextlib
import time

import numpy as np

from benchmarks import harness

# The classifiers of the throughput section: (normalization, optimizer);
# "isobn_frozen" is IsoBN with `trainable=False` (no statistics update).
VARIANTS = {
    "isobn": ("isobn", "fine_tuning_adamw"),
    "isobn_frozen": ("isobn_frozen", "fine_tuning_adamw"),
    "none": (None, "fine_tuning_adamw"),
    "batchnorm": ("batchnorm", "fine_tuning_adamw"),
    "none_keras_adamw": (None, "keras_adamw"),
}
# The throughput ratios: name to (numerator, denominator) of `VARIANTS`.
RATIOS = {
    "isobn_over_none": ("isobn", "none"),
    "isobn_frozen_over_none": ("isobn_frozen", "none"),
    "batchnorm_over_none": ("batchnorm", "none"),
    "fine_tuning_adamw_over_keras_adamw": ("none", "none_keras_adamw"),
}


def statistics_check(layer, every):
    """A callback recording IsoBN's statistics every `every` batches."""
    import keras

    class Check(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.records = []

        def on_train_batch_end(self, batch, logs=None):
            if (batch + 1) % every == 0:
                self.check(batch + 1, (logs or {}).get("loss"))

        def on_train_end(self, logs=None):
            self.check("end", (logs or {}).get("loss"))

        def check(self, step, loss):
            if hasattr(self.model, "jax_state_sync"):
                self.model.jax_state_sync()  # JAX's state lives outside.
            covariance, std = layer.moving_covariance, layer.moving_std
            values = [keras.ops.convert_to_numpy(v) for v in (covariance, std)]
            self.records.append({
                "step": step,
                "dtypes": [covariance.dtype, std.dtype],
                "finite": bool(all(np.all(np.isfinite(v)) for v in values)),
                "nonzero": bool(np.any(values[1] != 0.0)),
                "max_std": float(np.max(values[1])),
                "loss": None if loss is None else float(loss),
            })

    return Check()


def make_classifier(bundle, normalization, optimizer, total_steps, args):
    """A compiled `IsoBNBertTextClassifier` on the bundle's checkpoint.

    Built under the global dtype policy, for token ids and
    `keras.Model.fit`: KerasHub's own `fit` batches even token ids in
    `tf.data` or Grain, which a bare GPU host lacks.

    Args:
        bundle: The `gpu_bundle.Bundle`.
        normalization: A normalization of `VARIANTS`.
        optimizer: `"fine_tuning_adamw"` or `"keras_adamw"`.
        total_steps: The length of `fine_tuning_adamw`'s schedule.
        args: The parsed command line (`seed`, `learning_rate`).
    """
    import keras
    import keras_hub

    from benchmarks import end_to_end
    from keras_isobn import IsoBatchNormalization
    from keras_isobn.optimizers import fine_tuning_adamw

    keras.utils.set_random_seed(args.seed)
    backbone = keras_hub.models.BertBackbone.from_preset(bundle.checkpoint)
    if normalization == "isobn_frozen":
        # A template layer: IsoBN whose statistics are not updated.
        normalization = IsoBatchNormalization(trainable=False)
    if optimizer == "fine_tuning_adamw":
        optimizer = fine_tuning_adamw(args.learning_rate, total_steps)
    else:
        optimizer = keras.optimizers.AdamW(args.learning_rate)
    return end_to_end.make_classifier(
        backbone, normalization, bundle.manifest["num_classes"], optimizer)


def train_and_check(bundle, args, policy, steps):
    """Fine-tunes the IsoBN classifier; returns it and the result dict."""
    import keras

    keras.mixed_precision.set_global_policy(policy)
    batch = args.batch_size
    rows = slice(0, steps * batch)
    classifier = make_classifier(bundle, "isobn", "fine_tuning_adamw",
                                 steps, args)
    layer = classifier.get_layer("pooled_normalization")
    monitor = statistics_check(layer, every=max(1, steps // 10))
    clock = harness.step_clock(wait=False)
    start = time.perf_counter()
    history = keras.Model.fit(
        classifier, bundle.inputs("train", rows), bundle.labels("train", rows),
        batch_size=batch, epochs=1, shuffle=False, verbose=0,
        callbacks=[monitor, clock])
    fit_s = time.perf_counter() - start
    scale = keras.ops.convert_to_numpy(layer.scale())
    losses = history.history["loss"]
    records = monitor.records
    all_losses = losses + [r["loss"] for r in records if r["loss"] is not None]
    checks = {
        "statistics_float32": all(r["dtypes"] == ["float32", "float32"]
                                  for r in records),
        "layer_computes_in_policy_dtype":
            layer.compute_dtype == keras.DTypePolicy(policy).compute_dtype,
        "statistics_finite": all(r["finite"] for r in records),
        "statistics_updated": all(r["nonzero"] for r in records),
        "scale_finite_positive": bool(np.all(np.isfinite(scale) & (scale > 0))),
        "losses_finite": bool(np.all(np.isfinite(all_losses))),
    }
    result = {
        "policy": policy,
        "layer_compute_dtype": layer.compute_dtype,
        "steps": steps,
        "batch_size": batch,
        "fit_s_with_compile": fit_s,
        "train_examples_per_s": harness.steady_rate(clock.times, batch),
        "final_loss": float(losses[-1]),
        "scale_range": [float(scale.min()), float(scale.max())],
        "statistics_records": records,
        "checks": checks,
    }
    return classifier, result


def section_finetune(bundle, args):
    """One epoch of IsoBN's classifier under mixed_float16, checked.

    IsoBN's statistics are checked (float32, finite, updated) at every
    tenth of the run; then the dev accuracy.
    """
    import keras

    steps = len(bundle.labels("train")) // args.batch_size
    classifier, result = train_and_check(bundle, args, "mixed_float16", steps)
    logits = np.asarray(keras.Model.predict(
        classifier, bundle.inputs("dev"), batch_size=args.batch_size, verbose=0
    ), dtype="float32")
    labels = bundle.labels("dev")
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == labels))
    result["dev_accuracy"] = accuracy
    majority = np.max(np.bincount(labels)) / len(labels)
    result["dev_majority_rate"] = float(majority)
    if args.min_accuracy > 0:  # A few small steps learn nothing: unchecked.
        result["checks"]["dev_accuracy"] = accuracy >= args.min_accuracy
    return result


def section_bfloat16(bundle, args):
    """Shorter fine-tuning under mixed_bfloat16, with the same checks."""
    steps = args.bfloat16_steps
    return train_and_check(bundle, args, "mixed_bfloat16", steps)[1]


def section_throughput(bundle, args):
    """Train examples/s of the `VARIANTS`, and the `RATIOS` of their times.

    In `fit` blocks, paired `train_on_batch` steps and, on JAX, blocks of
    the jitted train step alone (without `fit`'s host work).
    """
    import keras

    from benchmarks import end_to_end

    keras.mixed_precision.set_global_policy("mixed_float16")
    batch, block = args.batch_size, args.fit_block_steps
    total = 1000  # The schedule's length; the timed steps stay in it.
    classifiers = {
        name: make_classifier(bundle, norm, optimizer, total, args)
        for name, (norm, optimizer) in VARIANTS.items()
    }
    rows = slice(0, block * batch)
    x, y = bundle.inputs("train", rows), bundle.labels("train", rows)

    def fit_block(classifier):
        return lambda _: keras.Model.fit(classifier, x, y, batch_size=batch,
                                         epochs=1, shuffle=False, verbose=0)

    # The first (untimed) block of each compiles; then rounds, rotated.
    blocks = {name: fit_block(c) for name, c in classifiers.items()}
    timed = harness.alternate(blocks, args.fit_rounds)
    fit = {n: harness.rate(t["times"], block, batch) for n, t in timed.items()}
    batches = [(bundle.inputs("train", rows), bundle.labels("train", rows))
               for rows in (slice(0, batch), slice(batch, 2 * batch))]
    steps = end_to_end.time_steps(classifiers, batches, args.timing_steps)
    for timing in steps.values():
        timing["examples_per_s"] = batch / timing["median_s"]
    compiled = None
    if keras.backend.backend() == "jax":
        compiled = compiled_step_blocks(classifiers, batches[0], block,
                                        args.fit_rounds)
    ratios = {}
    for name, (top, bottom) in RATIOS.items():
        ratios[name] = {
            "fit_blocks": fit[top]["median_s"] / fit[bottom]["median_s"],
            "train_on_batch": harness.paired_ratio(steps[top], steps[bottom]),
        }
        if compiled:
            ratios[name]["compiled_step_blocks"] = (
                compiled[top]["median_s"] / compiled[bottom]["median_s"])
    result = {
        "policy": "mixed_float16",
        "batch_size": batch,
        "fit": fit,
        "train_on_batch": steps,
        "ratios": ratios,
    }
    if compiled:
        result["compiled_step_blocks"] = compiled
    return result


def compiled_step_blocks(classifiers, data, block, rounds):
    """`harness.rate()` of `block` jitted train steps per classifier (JAX).

    Each `train_step`, its state donated as in `fit`, runs `block` times
    before the wait, on copies of the variables; the classifiers alternate
    for `rounds` rounds. `data` is one batch `(inputs, labels)`.
    """
    import jax

    inputs, labels = data
    inputs = {k: np.asarray(v) for k, v in inputs.items()}
    # int32, as `preprocess_samples` makes it in `fit`'s data pipeline.
    inputs["padding_mask"] = inputs["padding_mask"].astype("int32")
    data = jax.device_put((inputs, np.asarray(labels)))
    batch = len(labels)

    def runner(classifier):
        state = harness.jax_state(classifier, copy=True)
        step = jax.jit(classifier.train_step, donate_argnums=0)

        def run(index):
            nonlocal state
            for _ in range(block):
                logs, state = step(state, data)
            jax.block_until_ready((logs, state))

        return run

    runners = {name: runner(c) for name, c in classifiers.items()}
    timed = harness.alternate(runners, rounds)
    return {name: harness.rate(t["times"], block, batch)
            for name, t in timed.items()}


def section_numerics(bundle, args):
    """The layer's batch statistics on this device against float64 NumPy.

    One training call with `momentum=1` on [CLS]-like features (float16
    inputs), under "float32" and "mixed_float16". A TF32 matrix product,
    XLA's default on NVIDIA GPUs, is off by more than the 1e-4 allowed: on
    JAX the default precision is reported and `"highest"` checked.
    """
    import keras

    from keras_isobn import IsoBatchNormalization
    from keras_isobn.isotropy import isobn_reference_scale

    rng = np.random.default_rng(args.seed)
    n, d = args.layer_batch, args.layer_dim
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    scales = np.exp(rng.uniform(-2.0, 1.0, size=d))
    x = (rng.normal(size=(n, d)) @ mix) * scales + rng.normal(0, 3.0, size=d)
    x = x.astype("float16")
    y = x.astype("float64") - x.astype("float64").mean(axis=0)
    covariance = y.T @ y / len(y)
    std = np.sqrt(np.diag(covariance))
    scale = isobn_reference_scale(covariance, std)
    precisions = {"default": contextlib.nullcontext}
    if keras.backend.backend() == "jax":
        import jax

        precisions["highest"] = lambda: jax.default_matmul_precision("highest")
    result = {"batch_size": n, "dim": d, "checks": {}}
    for precision, context in precisions.items():
        for policy in ("float32", "mixed_float16"):
            layer = IsoBatchNormalization(momentum=1.0, dtype=policy)
            with context():
                layer(x, training=True)
            got = [keras.ops.convert_to_numpy(v).astype("float64") for v in (
                layer.moving_covariance, layer.moving_std, layer.moving_scale
            )]
            errors = {
                "covariance": float(np.max(np.abs(got[0] - covariance))
                                    / np.max(np.abs(covariance))),
                "std": float(np.max(np.abs(got[1] - std) / std)),
                "scale": float(np.max(np.abs(got[2] - scale) / scale)),
            }
            key = f"{policy}/{precision}_matmul_precision"
            result[key] = {"max_relative_error": errors}
            if precision == list(precisions)[-1]:
                check = f"{policy}_statistics_match_float64"
                result["checks"][check] = max(errors.values()) <= 1e-4
    return result
