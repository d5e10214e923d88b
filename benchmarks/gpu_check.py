"""The GPU check of keras-isobn, run from a bundle (see gpu_check.sh).

Runs on a GPU host with JAX or PyTorch and no TensorFlow: the bundle
(`benchmarks/gpu_bundle.py`, built on a CPU machine) holds the token ids,
the checkpoint and the wheels of Keras and KerasHub. Three commands:

- `run BUNDLE`: on the Keras backend of `KERAS_BACKEND`, the sections
  `--sections` (all by default), each in turn, the results written to
  `part_<backend>.json` after each:
  - `finetune`: fine-tunes `IsoBNBertTextClassifier` with
    `fine_tuning_adamw` under `"mixed_float16"` on the bundle's training
    examples (one epoch), checking that the IsoBN statistics are float32,
    finite and updated at every tenth of the run while the layer computes
    in float16, and scores the dev examples;
  - `throughput`: training examples/s of the classifier with IsoBN, with
    IsoBN's statistics frozen (`trainable=False`: the product by the
    scale alone), with BatchNormalization and with none (all with
    `fine_tuning_adamw`), and with none and `keras.optimizers.AdamW` (the
    optimizer's own cost), in whole `fit` blocks and in paired
    `train_on_batch` steps, alternating; on JAX also in blocks of the
    compiled train step alone (`jax.jit(model.train_step)`, no Keras
    loop: the device's time, with what `fit` adds on the host left out);
  - `layer`: the layer alone, a train step on a `(4096, 1024)` float16
    batch, IsoBN against BatchNormalization (`benchmarks.layer_cost`);
  - `numerics`: the layer's batch statistics and scale on the device
    against a float64 NumPy statement (a TF32 matrix product fails it);
  - `bfloat16`: a shorter fine-tuning under `"mixed_bfloat16"`, with the
    statistics checks;
  - `jit`: `jit_compile=True` (`torch.compile` on PyTorch): a few train
    steps of the IsoBN classifier and of the plain one, or the error.
- `hf BUNDLE`: Hugging Face `Trainer` (PyTorch, fp16 on a GPU) fine-tunes
  `BertForSequenceClassification` from the same checkpoint on the same
  token ids, batch, steps and schedule: examples/s and dev accuracy
  (`part_hf.json`). Needs `transformers`; imports no Keras.
- `merge DIR`: gathers the parts into `gpu_check.json`, prints one
  PASS/FAIL line per check and a summary; exit code 0 when all pass.

`--small` shrinks the timings to run on a CPU in a minute (with a tiny
bundle). Nothing here imports TensorFlow.

Usage:

```
python -m benchmarks.gpu_check run BUNDLE --output OUT
python -m benchmarks.gpu_check hf BUNDLE --output OUT
python -m benchmarks.gpu_check merge OUT
```
"""

import argparse
import glob
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np

from benchmarks import common

SECTIONS = ("finetune", "throughput", "layer", "numerics", "bfloat16",
            "jit")
# Sizes of the check, at full size and with --small.
FULL = dict(batch_size=32, learning_rate=5e-5, fit_block_steps=100,
            fit_rounds=5, timing_steps=40, bfloat16_steps=100,
            layer_batch=4096, layer_dim=1024, layer_repeats=20,
            jit_steps=10, min_accuracy=0.7)
# PyTorch's steps are many times slower (eager): fewer keep it in minutes.
FULL_TORCH = dict(fit_block_steps=40, fit_rounds=3, timing_steps=30)
SMALL = dict(batch_size=8, learning_rate=5e-5, fit_block_steps=2,
             fit_rounds=1, timing_steps=3, bfloat16_steps=3,
             layer_batch=64, layer_dim=32, layer_repeats=3,
             jit_steps=2, min_accuracy=0.0)
# Goals of issue 27, reported beside the checks (timings, not checks).
GOALS = {
    "isobn_over_none_jax": 1.03,
    "fine_tuning_adamw_over_keras_adamw": 1.05,
}
# The classifiers of the throughput section: (normalization, optimizer);
# "isobn_frozen" is IsoBN with `trainable=False` (no statistics update).
VARIANTS = {
    "isobn": ("isobn", "fine_tuning_adamw"),
    "isobn_frozen": ("isobn_frozen", "fine_tuning_adamw"),
    "none": (None, "fine_tuning_adamw"),
    "batchnorm": ("batchnorm", "fine_tuning_adamw"),
    "none_keras_adamw": (None, "keras_adamw"),
}


class Bundle:
    """The checkpoint, token ids and manifest of a bundle folder.

    Args:
        folder: A folder written by `benchmarks.gpu_bundle`.
    """

    def __init__(self, folder):
        manifest = os.path.join(folder, "manifest.json")
        if not os.path.isfile(manifest):
            raise FileNotFoundError(
                f"{folder!r} is not a GPU-check bundle (no manifest.json). "
                "Build one on a CPU machine with `benchmarks/gpu_check.sh "
                "bundle GLUE_DIR OUT`."
            )
        with open(manifest) as f:
            self.manifest = json.load(f)
        self.checkpoint = os.path.join(folder, "checkpoint")
        with np.load(os.path.join(folder, "data.npz")) as data:
            self.arrays = {key: data[key] for key in data.files}

    def inputs(self, split, rows=slice(None)):
        """The BERT inputs of `split` (`"train"` or `"dev"`), int32."""
        return {
            "token_ids": self.arrays[f"{split}_token_ids"][rows].astype(
                "int32"
            ),
            "segment_ids": self.arrays[f"{split}_segment_ids"][rows].astype(
                "int32"
            ),
            "padding_mask": self.arrays[f"{split}_padding_mask"][rows],
        }

    def labels(self, split, rows=slice(None)):
        return self.arrays[f"{split}_labels"][rows]


def statistics_check(layer, every):
    """A callback that records the IsoBN statistics every `every` batches.

    Each record (`callback.records`) holds the step, the dtypes of
    `moving_covariance` and `moving_std`, whether they are finite and
    whether the std is non-zero, and the loss.
    """
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

        def check(self, step, loss=None):
            if hasattr(self.model, "jax_state_sync"):
                # JAX keeps the training state outside the model until
                # synced.
                self.model.jax_state_sync()
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


def step_clock():
    """A callback that records the time at the end of each train batch."""
    import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter())

    return Clock()


def steady_rate(times, batch_size, skip=None):
    """Examples/s between the end of step `skip` and the last step.

    `skip` (default: a tenth of the steps, at least 1) leaves out the
    compilation and warm-up.
    """
    if len(times) < 3:
        return None
    skip = max(1, len(times) // 10) if skip is None else skip
    skip = min(skip, len(times) - 2)
    return (len(times) - 1 - skip) * batch_size / (times[-1] - times[skip])


def make_classifier(bundle, normalization, optimizer, total_steps, args,
                    jit_compile=None):
    """A compiled `IsoBNBertTextClassifier` on the bundle's checkpoint.

    Built under the global dtype policy (set it first); `jit_compile=None`
    is Keras's default (XLA on JAX, eager on PyTorch). It takes token ids
    (no preprocessor) and is trained through `keras.Model.fit` and
    `keras.Model.predict`: KerasHub's own `fit` batches even token ids in
    `tf.data` or Grain, which a bare GPU host lacks (`train_on_batch`
    needs neither).
    """
    import keras
    import keras_hub

    from keras_isobn import IsoBatchNormalization
    from keras_isobn.models import IsoBNBertTextClassifier
    from keras_isobn.optimizers import fine_tuning_adamw

    keras.utils.set_random_seed(args.seed)
    backbone = keras_hub.models.BertBackbone.from_preset(bundle.checkpoint)
    if normalization == "isobn_frozen":
        # A template layer (see `get_pooled_normalization`): IsoBN whose
        # statistics are not updated in training.
        normalization = IsoBatchNormalization(trainable=False)
    classifier = IsoBNBertTextClassifier(
        backbone=backbone,
        num_classes=bundle.manifest["num_classes"],
        preprocessor=None,
        normalization=normalization,
    )
    if optimizer == "fine_tuning_adamw":
        optimizer = fine_tuning_adamw(args.learning_rate, total_steps)
    else:
        optimizer = keras.optimizers.AdamW(args.learning_rate)
    classifier.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["sparse_categorical_accuracy"],
        jit_compile="auto" if jit_compile is None else jit_compile,
    )
    return classifier


def train_and_check(bundle, args, policy, steps):
    """Fine-tunes the IsoBN classifier `steps` steps under `policy`.

    Returns:
        `(classifier, result)`: the classifier and a dict with the
        statistics records, checks, time and examples/s.
    """
    import keras

    keras.mixed_precision.set_global_policy(policy)
    batch = args.batch_size
    rows = slice(0, steps * batch)
    classifier = make_classifier(bundle, "isobn", "fine_tuning_adamw",
                                 steps, args)
    layer = classifier.get_layer("pooled_normalization")
    monitor = statistics_check(layer, every=max(1, steps // 10))
    clock = step_clock()
    start = time.perf_counter()
    history = keras.Model.fit(
        classifier, bundle.inputs("train", rows), bundle.labels("train", rows),
        batch_size=batch, epochs=1, shuffle=False, verbose=0,
        callbacks=[monitor, clock],
    )
    fit_s = time.perf_counter() - start
    scale = keras.ops.convert_to_numpy(layer.scale())
    losses = history.history["loss"]
    records = monitor.records
    checks = {
        "statistics_float32": all(
            r["dtypes"] == ["float32", "float32"] for r in records
        ),
        "layer_computes_in_policy_dtype":
            layer.compute_dtype == keras.DTypePolicy(policy).compute_dtype,
        "statistics_finite": all(r["finite"] for r in records),
        "statistics_updated": all(r["nonzero"] for r in records),
        "scale_finite_positive": bool(
            np.all(np.isfinite(scale)) and np.all(scale > 0)
        ),
        "losses_finite": bool(np.all(np.isfinite(losses)) and all(
            np.isfinite(r["loss"]) for r in records if r["loss"] is not None
        )),
    }
    result = {
        "policy": policy,
        "layer_compute_dtype": layer.compute_dtype,
        "steps": steps,
        "batch_size": batch,
        "fit_s_with_compile": fit_s,
        "train_examples_per_s": steady_rate(clock.times, batch),
        "final_loss": float(losses[-1]),
        "scale_range": [float(scale.min()), float(scale.max())],
        "statistics_records": records,
        "checks": checks,
    }
    return classifier, result


def section_finetune(bundle, args, save):
    """Mixed-float16 fine-tuning with IsoBN, then dev accuracy."""
    import keras

    steps = len(bundle.labels("train")) // args.batch_size
    classifier, result = train_and_check(
        bundle, args, "mixed_float16", steps
    )
    logits = np.asarray(keras.Model.predict(
        classifier, bundle.inputs("dev"), batch_size=args.batch_size, verbose=0
    ), dtype="float32")
    labels = bundle.labels("dev")
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == labels))
    result["dev_accuracy"] = accuracy
    result["dev_majority_rate"] = float(
        np.max(np.bincount(labels)) / len(labels)
    )
    if args.min_accuracy > 0:  # A few small steps learn nothing: unchecked.
        result["checks"]["dev_accuracy"] = accuracy >= args.min_accuracy
    return result


def section_bfloat16(bundle, args, save):
    """Shorter fine-tuning under mixed_bfloat16, with the same checks."""
    _, result = train_and_check(
        bundle, args, "mixed_bfloat16", args.bfloat16_steps
    )
    return result


def section_throughput(bundle, args, save):
    """Train examples/s of the four classifiers, in fit blocks and steps."""
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
    for classifier in classifiers.values():  # Compile.
        keras.Model.fit(classifier, x, y, batch_size=batch, epochs=1,
                        shuffle=False, verbose=0)
    blocks = {name: [] for name in classifiers}
    for _ in range(args.fit_rounds):
        for name, classifier in classifiers.items():
            start = time.perf_counter()
            keras.Model.fit(classifier, x, y, batch_size=batch, epochs=1,
                            shuffle=False, verbose=0)
            blocks[name].append(time.perf_counter() - start)
    fit = block_rates(blocks, block, batch)
    batches = [
        (bundle.inputs("train", slice(i, i + batch)),
         bundle.labels("train", slice(i, i + batch)))
        for i in range(0, 2 * batch, batch)
    ]
    steps = end_to_end.time_steps(classifiers, batches, args.timing_steps)
    for timing in steps.values():
        timing["examples_per_s"] = batch / timing["median_s"]
    compiled = None
    if keras.backend.backend() == "jax":
        compiled = compiled_step_blocks(
            classifiers, batches[0], block, args.fit_rounds
        )

    def ratios(numerator, denominator):
        ratio = {
            "fit_blocks": fit[numerator]["median_s"]
            / fit[denominator]["median_s"],
            "train_on_batch": end_to_end.paired_ratio(
                steps[numerator], steps[denominator]
            ),
        }
        if compiled:
            ratio["compiled_step_blocks"] = (
                compiled[numerator]["median_s"]
                / compiled[denominator]["median_s"]
            )
        return ratio

    result = {
        "policy": "mixed_float16",
        "batch_size": batch,
        "fit": fit,
        "train_on_batch": steps,
        "ratios": {
            "isobn_over_none": ratios("isobn", "none"),
            "isobn_frozen_over_none": ratios("isobn_frozen", "none"),
            "batchnorm_over_none": ratios("batchnorm", "none"),
            "fine_tuning_adamw_over_keras_adamw":
                ratios("none", "none_keras_adamw"),
        },
    }
    if compiled:
        result["compiled_step_blocks"] = compiled
    return result


def compiled_step_blocks(classifiers, data, block, rounds):
    """Seconds of `block` compiled train steps per classifier (JAX).

    Each classifier's `train_step` is compiled by `jax.jit` with its state
    donated, as `fit` does, and called `block` times on one batch in a row
    before waiting for the result: what the device takes per step, without
    the host's work of Keras's loop (iterator, callbacks, state
    bookkeeping) between steps. The classifiers alternate, block by block;
    their variables are left untouched (the steps run on copies).

    Returns:
        Dict of name to `common.summarize()` of the block seconds, with
        `"steps_per_block"` and `"examples_per_s"`.
    """
    import jax
    import jax.numpy as jnp

    inputs, labels = data
    inputs = {k: np.asarray(v) for k, v in inputs.items()}
    # int32, as `preprocess_samples` makes it in `fit`'s data pipeline.
    inputs["padding_mask"] = inputs["padding_mask"].astype("int32")
    data = jax.device_put((inputs, np.asarray(labels)))
    batch = len(labels)

    def runner(classifier):
        state = tuple(
            [jnp.copy(v.value) for v in variables]
            for variables in (
                classifier.trainable_variables,
                classifier.non_trainable_variables,
                classifier.optimizer.variables,
                classifier.metrics_variables,
            )
        )
        step = jax.jit(classifier.train_step, donate_argnums=0)
        carried = {"state": state}

        def run(index):
            state = carried["state"]
            for _ in range(block):
                logs, state = step(state, data)
            jax.block_until_ready((logs, state))
            carried["state"] = state

        return run

    timed = common.alternate(
        {name: runner(c) for name, c in classifiers.items()}, rounds
    )
    return block_rates(
        {name: t["times"] for name, t in timed.items()}, block, batch
    )


def block_rates(blocks, steps, batch):
    """`common.summarize()` of each name's block seconds, with the rate.

    Args:
        blocks: Dict of name to the seconds of its blocks.
        steps: Train steps per block.
        batch: Examples per step.

    Returns:
        Dict of name to the summary, with `"steps_per_block"` and
        `"examples_per_s"` (at the median block).
    """
    return {
        name: dict(common.summarize(times), steps_per_block=steps,
                   examples_per_s=steps * batch / float(np.median(times)))
        for name, times in blocks.items()
    }


def section_layer(bundle, args, save):
    """The layer alone: train and inference steps, IsoBN against BN."""
    import keras

    from benchmarks import layer_cost

    keras.mixed_precision.set_global_policy("float32")
    jit = keras.backend.backend() != "torch"
    steps = layer_cost.steps_for(
        args.layer_dim, "float16", args.layer_batch,
        ("isobn", "batchnorm"), jit,
    )
    timings = common.time_interleaved(steps, args.layer_repeats)
    return {
        "dim": args.layer_dim,
        "batch_size": args.layer_batch,
        "dtype": "float16 (mixed_float16)",
        "compiled": jit,
        "median_ms": {
            f"{mode}/{method}": t["median_s"] * 1e3
            for (mode, method), t in timings.items()
        },
        "train_isobn_over_batchnorm": timings["train", "isobn"]["median_s"]
        / timings["train", "batchnorm"]["median_s"],
    }


def reference_statistics(x, epsilon=1e-3, beta=0.5):
    """Batch covariance, std and IsoBN scale of `x`, in float64 NumPy."""
    y = x.astype("float64") - x.astype("float64").mean(axis=0)
    covariance = y.T @ y / len(y)
    std = np.sqrt(np.mean(y**2, axis=0))
    rho = np.clip(covariance / np.outer(std, std), -1.0, 1.0)
    a = (np.mean(rho**2, axis=1) * std + epsilon) ** -beta
    variance = np.diag(covariance)
    m = np.sqrt(variance.sum() / (np.sum(variance * a**2) + epsilon))
    return covariance, std, m * a


def section_numerics(bundle, args, save):
    """The layer's batch statistics on this device against float64 NumPy.

    One training call with `momentum=1` (the moving statistics are the
    batch's) on correlated features with spread scales and large means,
    like [CLS] embeddings, under "float32" and "mixed_float16" (the input
    rounded to float16 first, for both). A float32 accumulation is within
    1e-5 of float64; a matrix product in TF32 (10-bit mantissa) is not:
    XLA's default for float32 products on NVIDIA GPUs, which JAX leaves on
    (`jax_default_matmul_precision`). On JAX the call is made at the
    default precision (reported) and at `"highest"` (checked).
    """
    import contextlib

    import keras

    from keras_isobn import IsoBatchNormalization

    rng = np.random.default_rng(args.seed)
    n, d = args.layer_batch, args.layer_dim
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    scales = np.exp(rng.uniform(-2.0, 1.0, size=d))
    x = (rng.normal(size=(n, d)) @ mix) * scales + rng.normal(0, 3.0, size=d)
    x = x.astype("float16")
    covariance, std, scale = reference_statistics(x)
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
            result[f"{policy}/{precision}_matmul_precision"] = {
                "max_relative_error": errors
            }
            if precision == list(precisions)[-1]:
                result["checks"][f"{policy}_statistics_match_float64"] = (
                    max(errors.values()) <= 1e-4
                )
    return result


def section_jit(bundle, args, save):
    """`jit_compile=True`: a few train steps, or the error, per classifier.

    The IsoBN classifier with `fine_tuning_adamw`, and the plain one with
    `keras.optimizers.AdamW`: where only the first fails, the blocker is in
    this package.
    """
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    batch = args.batch_size
    x = bundle.inputs("train", slice(0, batch))
    y = bundle.labels("train", slice(0, batch))
    result = {}
    for name in ("isobn", "none_keras_adamw"):
        norm, optimizer = VARIANTS[name]
        start = time.perf_counter()
        try:
            classifier = make_classifier(
                bundle, norm, optimizer, 1000, args, jit_compile=True
            )
            losses = [float(classifier.train_on_batch(
                x, y, return_dict=True)["loss"])]
            compile_s = time.perf_counter() - start
            times = []
            for _ in range(args.jit_steps):
                step = time.perf_counter()
                losses.append(float(classifier.train_on_batch(
                    x, y, return_dict=True)["loss"]))
                times.append(time.perf_counter() - step)
            result[name] = {
                "ok": bool(np.all(np.isfinite(losses))),
                "first_step_s": compile_s,
                "step_ms_median": float(np.median(times)) * 1e3,
                "examples_per_s": batch / float(np.median(times)),
                "losses": losses,
            }
        except Exception as e:  # Recorded: the point is to see it.
            result[name] = {"ok": False, "error": error_record(e),
                            "seconds": time.perf_counter() - start}
        save(result)
    return result


def error_record(error):
    """The type, message and innermost frames of an exception."""
    frames = traceback.extract_tb(error.__traceback__)
    return {
        "type": type(error).__name__,
        "message": str(error)[:2000],
        "frames": [f"{f.filename}:{f.lineno} {f.name}" for f in frames[-8:]],
    }


def run(args):
    """Runs the sections on the loaded backend; returns the part's path."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        raise SystemExit(
            "The GPU check runs on JAX or PyTorch (a bare GPU host has no "
            "TensorFlow): set KERAS_BACKEND=jax or KERAS_BACKEND=torch."
        )
    bundle = Bundle(args.bundle)
    name = "part_" + backend + ("_" + args.part if args.part else "")
    path = os.path.join(args.output, name + ".json")
    payload = {
        "part": backend,
        "environment": common.environment(),
        "bundle": {k: v for k, v in bundle.manifest.items() if k != "files"},
        "settings": {k: v for k, v in vars(args).items() if k != "command"},
        "sections": {},
    }
    for section in args.sections:
        start = time.perf_counter()
        print(f"gpu_check: {backend} {section} ...", file=sys.stderr,
              flush=True)

        def save(partial, section=section):
            # What a process killed at its time limit leaves behind.
            payload["sections"][section] = dict(partial, unfinished=True)
            common.write_json(path, payload)

        save({})
        try:
            result = globals()[f"section_{section}"](bundle, args, save)
        except Exception as e:  # One broken section must not hide others.
            traceback.print_exc()
            result = {"error": error_record(e)}
        result["seconds"] = time.perf_counter() - start
        payload["sections"][section] = result
        common.write_json(path, payload)
        print(f"gpu_check: {backend} {section} done in "
              f"{result['seconds']:.1f} s", file=sys.stderr, flush=True)
    return path


def run_hf(args):
    """Hugging Face Trainer on the same token ids; returns the part's path."""
    import torch
    import transformers

    bundle = Bundle(args.bundle)
    batch = args.batch_size
    steps = len(bundle.labels("train")) // batch
    gpu = torch.cuda.is_available()

    class Examples(torch.utils.data.Dataset):
        def __init__(self, split):
            x = bundle.inputs(split)
            self.rows = {
                "input_ids": torch.as_tensor(x["token_ids"]).long(),
                "token_type_ids": torch.as_tensor(x["segment_ids"]).long(),
                "attention_mask": torch.as_tensor(
                    x["padding_mask"].astype("int64")
                ),
                "labels": torch.as_tensor(bundle.labels(split)).long(),
            }

        def __len__(self):
            return len(self.rows["labels"])

        def __getitem__(self, i):
            return {k: v[i] for k, v in self.rows.items()}

    class Clock(transformers.TrainerCallback):
        times = []

        def on_step_end(self, *unused_args, **unused_kwargs):
            if gpu:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter())

    torch.manual_seed(args.seed)
    model = transformers.BertForSequenceClassification.from_pretrained(
        bundle.checkpoint, num_labels=bundle.manifest["num_classes"],
        torch_dtype=torch.float32,
    )
    clock = Clock()
    with tempfile.TemporaryDirectory() as folder:
        training = transformers.TrainingArguments(
            output_dir=folder,
            per_device_train_batch_size=batch,
            per_device_eval_batch_size=batch,
            max_steps=steps,
            learning_rate=args.learning_rate,
            warmup_steps=int(0.06 * steps),
            lr_scheduler_type="linear",
            weight_decay=0.0,
            adam_epsilon=1e-6,
            fp16=gpu,
            use_cpu=not gpu,
            save_strategy="no",
            eval_strategy="no",
            logging_strategy="no",
            report_to="none",
            seed=args.seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = transformers.Trainer(
            model=model, args=training, train_dataset=Examples("train"),
            callbacks=[clock],
        )
        start = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - start
        logits = trainer.predict(Examples("dev")).predictions
    accuracy = float(np.mean(
        np.argmax(logits, axis=-1) == bundle.labels("dev")
    ))
    payload = {
        "part": "hf",
        "environment": common.environment(backend=False),
        "settings": {k: v for k, v in vars(args).items() if k != "command"},
        "sections": {
            "hf_trainer": {
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name(0) if gpu else "cpu",
                "fp16": gpu,
                "steps": steps,
                "batch_size": batch,
                "train_s_with_start": train_s,
                "train_examples_per_s": steady_rate(clock.times, batch),
                "dev_accuracy": accuracy,
            }
        },
    }
    return common.write_json(os.path.join(args.output, "part_hf.json"),
                             payload)


def collect_checks(parts):
    """`{"<part>/<section>/<check>": bool}` of every part, errors False."""
    checks = {}
    for part, payload in parts.items():
        for section, result in payload["sections"].items():
            key = f"{part}/{section}"
            failed = "error" in result or result.get("unfinished")
            if failed and section != "jit":
                checks[f"{key}/ran"] = False
            for check, passed in result.get("checks", {}).items():
                checks[f"{key}/{check}"] = bool(passed)
    return checks


def summary_rows(parts):
    """Lines of the summary: the issue's table, per backend."""
    rows = []
    for part, payload in sorted(parts.items()):
        sections = payload["sections"]
        fine = sections.get("finetune", {})
        if "dev_accuracy" in fine:
            rows.append(
                f"{part}: fine-tune {fine['steps']} steps: dev accuracy "
                f"{fine['dev_accuracy']:.3f} ({fine['fit_s_with_compile']:.1f}"
                f" s incl. compile, {fine['train_examples_per_s'] or 0:.0f} "
                "examples/s)"
            )
        throughput = sections.get("throughput", {})
        if "fit" in throughput:
            rates = " / ".join(
                f"{throughput['fit'][n]['examples_per_s']:.0f}"
                for n in ("isobn", "none", "batchnorm", "none_keras_adamw")
            )
            r = throughput["ratios"]
            rows.append(
                f"{part}: train examples/s IsoBN / none / BN / none+keras "
                f"AdamW: {rates}; IsoBN/none {r['isobn_over_none']['fit_blocks']:.3f}"
                f" (steps {r['isobn_over_none']['train_on_batch']['median']:.3f}),"
                f" BN/none {r['batchnorm_over_none']['fit_blocks']:.3f}, "
                "fine_tuning_adamw/AdamW "
                f"{r['fine_tuning_adamw_over_keras_adamw']['fit_blocks']:.3f}"
            )
            rows.append(
                f"{part}: IsoBN with frozen statistics / none: "
                f"{r['isobn_frozen_over_none']['fit_blocks']:.3f} in fit "
                "blocks"
            )
            if "compiled_step_blocks" in r["isobn_over_none"]:
                rows.append(
                    f"{part}: compiled train steps alone (no fit loop): "
                    "IsoBN / frozen IsoBN / BN over none "
                    + " / ".join(
                        f"{r[k]['compiled_step_blocks']:.3f}"
                        for k in ("isobn_over_none", "isobn_frozen_over_none",
                                  "batchnorm_over_none")
                    )
                )
        layer = sections.get("layer", {})
        if "median_ms" in layer:
            rows.append(
                f"{part}: layer train step ({layer['batch_size']}, "
                f"{layer['dim']}) float16: IsoBN "
                f"{layer['median_ms']['train/isobn']:.3f} ms, BN "
                f"{layer['median_ms']['train/batchnorm']:.3f} ms"
            )
        bf16 = sections.get("bfloat16", {})
        if "checks" in bf16:
            rows.append(
                f"{part}: mixed_bfloat16: checks "
                f"{'pass' if all(bf16['checks'].values()) else 'FAIL'}, "
                f"{bf16['train_examples_per_s'] or 0:.0f} examples/s"
            )
        jit = sections.get("jit", {})
        if jit.get("unfinished"):
            rows.append(f"{part}: jit_compile=True: the next classifier did "
                        "not finish within the time limit")
        for name, result in jit.items():
            if isinstance(result, dict) and "ok" in result:
                if result["ok"]:
                    text = (f"{result['examples_per_s']:.0f} examples/s, "
                            f"first step {result['first_step_s']:.0f} s")
                else:
                    error = result.get("error", {})
                    text = (f"fails: {error.get('type', 'non-finite loss')}"
                            f" {error.get('message', '')[:200]!r}")
                rows.append(f"{part}: jit_compile=True {name}: {text}")
        hf = sections.get("hf_trainer", {})
        if hf:
            rows.append(
                f"hf: Trainer ({hf['device']}, fp16={hf['fp16']}): "
                f"{hf['train_examples_per_s'] or 0:.0f} examples/s, dev "
                f"accuracy {hf['dev_accuracy']:.3f}"
            )
    return rows


def goals(parts):
    """The issue's speed goals, from the throughput sections."""
    measured = {}
    for part, payload in parts.items():
        ratios = payload["sections"].get("throughput", {}).get("ratios")
        if not ratios:
            continue
        if part == "jax":
            value = ratios["isobn_over_none"]["fit_blocks"]
            measured["isobn_over_none_jax"] = {
                "measured": value,
                "goal": GOALS["isobn_over_none_jax"],
                "met": value <= GOALS["isobn_over_none_jax"],
            }
        value = ratios["fine_tuning_adamw_over_keras_adamw"]["fit_blocks"]
        measured[f"fine_tuning_adamw_over_keras_adamw_{part}"] = {
            "measured": value,
            "goal": GOALS["fine_tuning_adamw_over_keras_adamw"],
            "met": value <= GOALS["fine_tuning_adamw_over_keras_adamw"],
        }
    return measured


def merge(folder):
    """Writes `gpu_check.json` from the parts; returns `(path, passed)`."""
    parts = {}
    for path in sorted(glob.glob(os.path.join(folder, "part_*.json"))):
        with open(path) as f:
            payload = json.load(f)
        name = os.path.basename(path)[len("part_"):-len(".json")]
        parts[name] = payload
    if not parts:
        raise SystemExit(f"gpu_check: no part_*.json in {folder!r}.")
    checks = collect_checks(parts)
    passed = bool(checks) and all(checks.values())
    keras_parts = [p for n, p in sorted(parts.items()) if n != "hf"]
    payload = {
        "benchmark": "gpu_check",
        # The machine and versions (each part holds its own too).
        "environment": (keras_parts or list(parts.values()))[0]["environment"],
        "settings": {"small": any(
            p["settings"].get("small") for p in parts.values()
        )},
        "passed": passed,
        "checks": checks,
        "goals": goals(parts),
        "summary": summary_rows(parts),
        "parts": parts,
    }
    path = common.write_json(os.path.join(folder, "gpu_check.json"), payload)
    for check, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {check}")
    for name, goal in payload["goals"].items():
        print(f"goal {name}: {goal['measured']:.3f} (<= {goal['goal']}) "
              f"{'met' if goal['met'] else 'MISSED'}")
    for row in payload["summary"]:
        print(row)
    return path, passed


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=__doc__.split("\n\n")[0],
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for command in ("run", "hf"):
        sub = commands.add_parser(command)
        sub.add_argument("bundle", help="Bundle folder (gpu_bundle.py).")
        sub.add_argument("--output", required=True,
                         help="Folder for part_<backend>.json.")
        sub.add_argument("--small", action="store_true",
                         help="Small timings, for a CPU.")
        sub.add_argument("--seed", type=int, default=0)
        for key, value in FULL.items():
            torch = f", {FULL_TORCH[key]} on torch" if key in FULL_TORCH else ""
            sub.add_argument("--" + key.replace("_", "-"), type=type(value),
                             help=f"Defaults to {value}{torch} "
                             f"({SMALL[key]} with --small).")
        if command == "run":
            sub.add_argument("--sections", nargs="+", choices=SECTIONS,
                             default=[s for s in SECTIONS if s != "jit"],
                             help="Sections to run. Defaults to all but "
                             "jit, which gpu_check.sh runs in a process of "
                             "its own.")
            sub.add_argument("--part", default="",
                             help="Suffix of the part's file name.")
    sub = commands.add_parser("merge")
    sub.add_argument("output", help="Folder holding the part_*.json.")
    args = parser.parse_args(argv)
    if args.command != "merge":
        sizes = SMALL if args.small else FULL
        if not args.small and os.environ.get("KERAS_BACKEND") == "torch":
            sizes = dict(sizes, **FULL_TORCH)
        for key, value in sizes.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
        os.makedirs(args.output, exist_ok=True)
    return args


def main(argv=None):
    """Runs a command; returns the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.command == "merge":
        return 0 if merge(args.output)[1] else 1
    path = run(args) if args.command == "run" else run_hf(args)
    print(path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
