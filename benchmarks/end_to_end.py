"""Train-step time and peak memory of a text classifier with vs without IsoBN.

Per backbone of `--models` (`minilm`: the MiniLM-L6-H384 checkpoint;
`bert_base`: random, BERT-base-sized), `IsoBNBertTextClassifier`s from the
same weights, with IsoBN, without, and a control without (the noise),
alternate `train_on_batch` steps on the same random batches, then
`predict_on_batch` calls beside the IsoBN one with its scale folded into
the logits kernel. Peak memory: a fresh process per classifier.
"""

import argparse
import json
import os
import sys

import keras
import numpy as np

from benchmarks import harness
from benchmarks.steps import on_gpu

MODELS = ("minilm", "bert_base", "tiny")


def make_backbone(name, seed=0):
    """The backbone `name` of `MODELS`: MiniLM's weights, or random ones."""
    if name not in MODELS:
        raise ValueError(f"Unknown backbone {name!r}; choose from {MODELS}.")
    return harness.bert_backbone("minilm_weights" if name == "minilm" else name,
                                 seed)


def make_classifier(backbone, normalization, num_classes=2, optimizer=None,
                    jit_compile=None):
    """An `IsoBNBertTextClassifier` on `backbone`, compiled for fine-tuning.

    `optimizer` defaults to `AdamW(2e-5)`; `jit_compile=None` means XLA on
    JAX and TensorFlow, eager on PyTorch.
    """
    from keras_isobn.models import IsoBNBertTextClassifier

    classifier = IsoBNBertTextClassifier(
        backbone=backbone, num_classes=num_classes, normalization=normalization
    )
    if jit_compile is None:
        jit_compile = keras.backend.backend() != "torch"
    classifier.compile(
        optimizer=optimizer or keras.optimizers.AdamW(2e-5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["sparse_categorical_accuracy"], jit_compile=jit_compile,
    )
    return classifier


def time_steps(classifiers, batches, steps, warmup=1, train=True):
    """Times `train_on_batch` (or `predict_on_batch`) of classifiers in turn.

    `batches` (`(inputs, labels)`) are cycled through. Returns a dict of
    name to `harness.summarize()` of its step seconds, with `"compile_s"`,
    `"steps"` (the seconds in order, to pair them) and, in training,
    `"losses"`.
    """

    def step(classifier):
        def run(index):
            inputs, labels = batches[index % len(batches)]
            if not train:
                classifier.predict_on_batch(inputs)
                return None
            logs = classifier.train_on_batch(inputs, labels, return_dict=True)
            return float(logs["loss"])

        return run

    timed = harness.alternate({n: step(c) for n, c in classifiers.items()},
                              steps, warmup=max(warmup, 1))
    results = {}
    for name, t in timed.items():
        results[name] = dict(harness.summarize(t["times"]),
                             compile_s=t["compile_s"], steps=t["times"])
        if train:
            results[name]["losses"] = t["outputs"]
    return results


def analytic_share(backbone, batch_size, sequence_length):
    """IsoBN's own train-step flops as a share of the classifier's.

    IsoBN: `2 n d^2 + 10 d^2`; the classifier: 3 forward passes of `2 N`
    flops per token (`N` non-embedding weights) plus `4 L s d` attention.
    """
    d, layers = backbone.hidden_dim, backbone.num_layers
    tokens = batch_size * sequence_length
    embedding = sum(int(np.prod(w.shape)) for layer in backbone.layers
                    if "embedding" in layer.name for w in layer.weights)
    weights = backbone.count_params() - embedding
    forward = 2 * weights * tokens + 4 * layers * sequence_length * d * tokens
    isobn = 2 * batch_size * d * d + 10 * d * d
    return {"isobn_flops": isobn, "classifier_train_step_flops": 3 * forward,
            "share": isobn / (3 * forward)}


def measure_memory(args, model, normalization):
    """Peak memory of one classifier's train steps, in a fresh process."""
    argv = ["--memory-probe", f"{model}:{normalization}",
            "--batch-size", str(args.batch_size),
            "--sequence-length", str(args.sequence_length),
            "--threads", str(args.threads)]
    argv += ["--eager"] if args.eager else []
    stdout = harness.run_module("benchmarks.end_to_end", argv,
                                keras.backend.backend(), args.threads)
    return json.loads(stdout.strip().splitlines()[-1])


def memory_probe(args):
    """Builds one classifier, trains 2 steps, prints its memory as JSON."""
    model, normalization = args.memory_probe.split(":")
    backbone = make_backbone(model)
    classifier = make_classifier(
        backbone, None if normalization == "none" else normalization,
        jit_compile=False if args.eager else None,
    )
    batches = harness.random_batches(backbone.vocabulary_size,
                                     args.batch_size, args.sequence_length, 1)
    reset_device_peak()
    before = current_rss_bytes()
    for _ in range(2):  # The first compiles, the second reuses.
        classifier.train_on_batch(*batches[0])
    print(json.dumps({"rss_before_steps_bytes": before,
                      "peak_rss_bytes": harness.peak_rss_bytes(),
                      "device_peak_bytes": device_peak_bytes()}), flush=True)


def current_rss_bytes():
    """Resident memory of this process now (Linux), or `None`."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def reset_device_peak():
    """Resets the GPU's peak-memory counter where the backend has one."""
    backend = keras.backend.backend() if on_gpu() else None
    if backend == "torch":
        import torch
        torch.cuda.reset_peak_memory_stats()
    elif backend == "tensorflow":
        import tensorflow as tf
        tf.config.experimental.reset_memory_stats("GPU:0")


def device_peak_bytes():
    """Peak GPU memory in use (bytes), or `None` on the CPU."""
    if not on_gpu():
        return None
    backend = keras.backend.backend()
    if backend == "torch":
        import torch
        return int(torch.cuda.max_memory_allocated())
    if backend == "tensorflow":
        import tensorflow as tf
        return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    import jax
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def measure_model(args, model):
    """Times one backbone's classifiers with and without IsoBN."""
    from keras_isobn.export import fold_normalization

    normalizations = {"none": None, "isobn": "isobn"}
    if not args.no_control:
        normalizations["none_control"] = None
    jit_compile = False if args.eager else None
    classifiers = {
        name: make_classifier(make_backbone(model), normalization,
                              jit_compile=jit_compile)
        for name, normalization in normalizations.items()
    }
    backbone = classifiers["isobn"].backbone
    batches = harness.random_batches(backbone.vocabulary_size,
                                     args.batch_size, args.sequence_length, 2)
    train = time_steps(classifiers, batches, args.steps, args.warmup)
    folded = fold_normalization(classifiers["isobn"])
    inference = time_steps(dict(classifiers, isobn_folded=folded), batches,
                           args.inference_steps, args.warmup, train=False)
    logits, folded_logits = (
        keras.ops.convert_to_numpy(m.predict_on_batch(batches[0][0]))
        for m in (classifiers["isobn"], folded)
    )
    difference = np.abs(logits.astype("float64") - folded_logits)

    def ratio(timings, name):  # To the first classifier without IsoBN.
        return (harness.paired_ratio(timings[name], timings["none"])
                if name in timings else None)

    isobn_state = classifiers["isobn"].normalization.non_trainable_variables
    result = {
        "model": model, "hidden_dim": backbone.hidden_dim,
        "num_layers": backbone.num_layers,
        "params": classifiers["isobn"].count_params(),
        "train": train, "inference": inference,
        "train_ratio_isobn_to_none": ratio(train, "isobn"),
        "train_ratio_control_to_none": ratio(train, "none_control"),
        "inference_ratio_isobn_to_none": ratio(inference, "isobn"),
        "inference_ratio_folded_to_none": ratio(inference, "isobn_folded"),
        "inference_ratio_control_to_none": ratio(inference, "none_control"),
        "folded": {
            "has_normalization": folded.normalization is not None,
            "layers": [layer.__class__.__name__ for layer in folded.layers],
            "layers_without_isobn": [layer.__class__.__name__
                                     for layer in classifiers["none"].layers],
            "max_abs_logit_difference": float(np.max(difference)),
        },
        "analytic": analytic_share(backbone, args.batch_size,
                                   args.sequence_length),
        "isobn_state_bytes": sum(int(np.prod(v.shape)) * 4
                                 for v in isobn_state),
    }
    if not args.no_memory:
        # The control's probe is the one without IsoBN again: how much two
        # identical processes differ.
        result["memory"] = {
            name: measure_memory(args, model, normalization or "none")
            for name, normalization in normalizations.items()
        }
    return result


def measure(args):
    """Runs every backbone of `--models` on the loaded backend."""
    backend = keras.backend.backend()
    results = []
    for model in args.models:
        result = measure_model(args, model)
        results.append(result)
        times = {f"{mode} {name}": f"{t['median_s']:.3f}s"
                 for mode in ("train", "inference")
                 for name, t in result[mode].items()}
        print(f"[end_to_end] {backend} {model}: {times}; paired ratio "
              f"{result['train_ratio_isobn_to_none']['median']:.4f}",
              file=sys.stderr, flush=True)
    names = ("models", "batch_size", "sequence_length", "steps",
             "inference_steps", "warmup", "threads")
    settings = {name: getattr(args, name) for name in names}
    eager = backend == "torch" or args.eager
    settings["compiled"] = "eager" if eager else "jit_compile=True"
    return harness.write_results(args, "end_to_end", settings, results,
                                 markdown=markdown, goals=goals)


def percent(ratio):
    """A ratio as a signed overhead, e.g. `+1.20%`."""
    return f"{100 * (ratio - 1):+.2f}%"


def overhead_status(ratio, control, target):
    """Met, missed, or not resolved by a measurement as noisy as this."""
    # How far two identical classifiers differ, and how much both ratios
    # spread from step to step.
    noise = (ratio["q3"] - ratio["q1"]) / 2
    if control:
        noise = max(noise, abs(control["median"] - 1),
                    (control["q3"] - control["q1"]) / 2)
    if ratio["median"] - 1 <= target:
        return "met"
    return "not resolved" if ratio["median"] - 1 <= noise else "missed"


def classifier_goal(payload, layer_payload, mode, target, models=None):
    """The cells `(measured, status)` of a classifier-overhead goal.

    A paired timing within its noise defers to the layer's own time over
    the classifier's step.

    Args:
        payload: An end-to-end run.
        layer_payload: The layer-cost run of the same backend, or `None`.
        mode: `"train"` or `"inference"`.
        target: The largest overhead that meets the goal, e.g. `0.01`.
        models: The backbones counted (default: all).
    """
    from benchmarks import layer_cost

    backend = payload["environment"]["backend"]
    layer = layer_cost.index(layer_payload) if layer_payload else {}
    measured, statuses, over = [], [], []
    for r in payload["results"]:
        if models and r["model"] not in models:
            continue
        ratio = r[f"{mode}_ratio_isobn_to_none"]
        control = r.get(f"{mode}_ratio_control_to_none")
        statuses.append(overhead_status(ratio, control, target))
        alone = layer.get((mode, "isobn", r["hidden_dim"], "float32"))
        share = alone and alone / r[mode]["none"]["median_s"]
        cell = f"{backend} {r['model']}: {percent(ratio['median'])}"
        if control:
            cell += f" (control {percent(control['median'])})"
        if share:
            cell += f", layer alone {100 * share:.3f}%"
        measured.append(cell)
        if share and share > target:
            over.append(f"{backend} {r['model']} ({100 * share:.3f}%)")
    if not measured:
        return "not run", "-"
    if "missed" in statuses:
        return "; ".join(measured), "**missed**"
    if "not resolved" in statuses:
        return "; ".join(measured), "not resolved by the paired timing; " + (
            "**missed** by the layer alone on " + ", ".join(over)
            if over else "met by the layer alone"
        )
    return "; ".join(measured), "met"


def goals(payload, path):
    """The overheads of IsoBN in a classifier, and of its folded export."""
    # The layer's own time, if the layer-cost run of this backend is there.
    folder, name = os.path.split(path)
    layer_path = os.path.join(folder, name.replace("end_to_end", "layer_cost"))
    layer_payload = None
    if os.path.exists(layer_path):
        with open(layer_path) as f:
            layer_payload = json.load(f)
    result = []
    for name, target, mode, limit, models in (
        ("IsoBN train-step overhead, BERT-base classifier", "<= 1%",
         "train", 0.01, ("bert_base",)),
        ("IsoBN inference overhead, whole classifier", "< 0.1%",
         "inference", 0.001, None),
    ):
        measured, status = classifier_goal(payload, layer_payload, mode,
                                           limit, models)
        result.append({"name": name, "target": target, "measured": measured,
                       "status": status})
    measured, same_everywhere = [], True
    for r in payload["results"]:
        folded = r["folded"]
        same = (folded["layers"] == folded["layers_without_isobn"]
                and not folded["has_normalization"])
        same_everywhere &= same
        layers = ("the same layers as without IsoBN" if same
                  else "a normalization is left")
        difference = folded["max_abs_logit_difference"]
        timed = percent(r["inference_ratio_folded_to_none"]["median"])
        measured.append(f"{r['model']}: {layers}, logits within "
                        f"{difference:.0e}, timed {timed}")
    result.append({"name": "Same, export with the scale folded into the "
                   "kernel", "target": "0", "measured": "; ".join(measured),
                   "status": harness.status(same_everywhere)})
    return result


def ratio_cell(r):
    return f"{r['median']:.3f} [{r['q1']:.3f}, {r['q3']:.3f}]" if r else "-"


def memory_cell(result):
    if not result.get("memory"):
        return "-"
    peak = {k: (v.get("device_peak_bytes") or v["peak_rss_bytes"]) / 2**20
            for k, v in result["memory"].items()}
    names = [n for n in ("none", "isobn", "none_control") if n in peak]
    cell = " / ".join(f"{peak[n]:.0f}" for n in names) + " MiB"
    if "isobn_state_bytes" in result:
        state = result["isobn_state_bytes"] / 2**20
        cell += f" (IsoBN's statistics: {state:.1f} MiB)"
    return cell


def markdown(payload, path):
    """The goals and a row per backbone: times, paired ratios, memory."""
    s = payload["settings"]
    us = harness.us
    rows = []
    for r in payload["results"]:
        train, inference = r["train"], r["inference"]
        rows.append([
            f"{r['model']} (d={r['hidden_dim']}, {r['num_layers']} layers), "
            f"{s['batch_size']}x{s['sequence_length']}, "
            f"{len(train['none']['steps'])} steps",
            f"{us(train['none']['median_s'])} / "
            f"{us(train['isobn']['median_s'])}",
            ratio_cell(r["train_ratio_isobn_to_none"]),
            ratio_cell(r.get("train_ratio_control_to_none")),
            f"{r['analytic']['share'] * 100:.4f}%",
            " / ".join(us(inference[n]["median_s"])
                       for n in ("none", "isobn", "isobn_folded")),
            " / ".join(ratio_cell(r.get(f"inference_ratio_{x}_to_none"))
                       for x in ("isobn", "folded", "control")),
            memory_cell(r),
        ])
    header = ["classifier, batch, timed steps",
              "train step without / with IsoBN",
              "paired ratio IsoBN / without, median [quartiles]",
              "same, control / without", "IsoBN's flops share",
              "predict without / with / folded",
              "predict ratios IsoBN / folded / control",
              "peak memory without / with / control"]
    return "\n".join([
        f"# End to end, {payload['environment']['backend']}", "",
        "Paired ratios: medians of the step-by-step ratios to the first "
        "classifier without IsoBN; the control is a second one without "
        f"IsoBN. Compiled: {s.get('compiled', '-')}.", "",
        harness.machine_line(payload["environment"]), "",
        harness.goals_table(goals(payload, path)), "",
        "## Classifiers", "",
        harness.table(header, rows),
    ]) + "\n"


OPTIONS = {
    "models": (["minilm", "bert_base"], "Backbones.", MODELS),
    "batch_size": (32, "Sentences per batch."),
    "sequence_length": (128, "Tokens per sentence."),
    "steps": (6, "Timed train steps per classifier."),
    "inference_steps": (6, "Timed predict batches per classifier."),
    "warmup": (1, "Untimed steps first (compilation)."),
    "no_memory": (False, "Skip the peak-memory processes."),
    "no_control": (False, "Leave out the second classifier without IsoBN, "
                   "whose difference to the first measures the noise."),
    "eager": (False, "Run the steps eagerly, without XLA."),
    "memory_probe": (None, argparse.SUPPRESS),
}


def main(argv=None):
    """Runs the benchmark; returns the JSON paths written, one per backend."""
    parser = harness.command(__name__, OPTIONS)
    # Eager steps start faster, except on JAX (one compile per op).
    quick = dict(models=["tiny"], batch_size=4, sequence_length=8, steps=2,
                 inference_steps=2, no_memory=True, no_control=True,
                 eager=keras.backend.backend() != "jax")
    args = harness.parse(parser, argv, quick)
    return (memory_probe(args) if args.memory_probe
            else harness.run(__name__, argv, parser, measure, quick))


if __name__ == "__main__":
    main()
