"""The paper's isotropy measures of the lab's encoder, beside two others.

On each task's dev sentences: EV_1 and EV_3 of the pooled output and of
[CLS], the spread of the per-feature std, IsoBN's group size and the share
of features in highly correlated groups (`keras_isobn.isotropy`), for the
pretrained encoder, the same network untrained, and MiniLM-L6-H384 (near
isotropic, contrastively trained) when its package is installed.
"""

import csv
import os
import shutil

import keras

from benchmarks import harness
from keras_isobn import glue
from keras_isobn import isotropy

__all__ = [
    "EVAL_TASKS",
    "CORRELATED",
    "measure",
    "dev_features",
    "encoders",
    "anisotropy",
    "copy_pretraining_curve",
    "anisotropy_markdown",
]

EVAL_TASKS = ("stsb", "mrpc", "cola", "sst2")
CORRELATED = 0.5  # |rho| above which two features count as one group.


def measure(x):
    """The paper's isotropy measures of embeddings `x` (samples, features).

    `keras_isobn.isotropy.isotropy_summary`: EV_1 and EV_3, the per-feature
    std (min, median, max, 95th/5th percentile ratio), IsoBN's group size
    `n * gamma` and the share of features with `|rho| > 0.5` to another.

    Args:
        x: Array of shape `(samples, features)`.

    Returns:
        A dict of floats, by measure name.
    """
    summary = isotropy.isotropy_summary(x, k=(1, 3), threshold=CORRELATED)
    keys = (
        "ev1",
        "ev3",
        "std_min",
        "std_median",
        "std_max",
        "std_p95_p5",
        "group_size_median",
        "group_size_max",
        "correlated_share",
    )
    return {key: summary[key] for key in keys}


def dev_features(glue_dir, task):
    """A task's dev sentences: strings, or a tuple of two for pairs."""
    task = glue.get_task(task)
    return glue.load_split(task, "validation", data_dir=glue_dir).features


def encoders(preset, sequence_length, name="lab, pretrained"):
    """`name -> (backbone, preprocessor)`: the preset's (as `name`), the
    same network untrained, MiniLM."""
    import keras_hub

    preprocessor = keras_hub.models.BertTextClassifierPreprocessor.from_preset(
        preset, sequence_length=sequence_length
    )
    backbone = keras_hub.models.BertBackbone.from_preset(preset)
    keras.utils.set_random_seed(0)
    untrained = keras_hub.models.BertBackbone.from_config(backbone.get_config())
    found = {
        name: (backbone, preprocessor),
        "lab, untrained (same shape)": (untrained, preprocessor),
    }
    try:
        found["MiniLM-L6-H384"] = harness.load_minilm(sequence_length)
    except ImportError as error:
        print(f"[lab] MiniLM left out: {error}", flush=True)
    return found


def anisotropy(args):
    """Measures every encoder on every task's dev sentences; writes tables.

    Args:
        args: The parsed `anisotropy` command line (see `command_line.py`).

    Returns:
        The payload written to `anisotropy.json` in `args.output`.
    """
    from keras_isobn import plots

    os.makedirs(args.output, exist_ok=True)
    rows, embeddings = [], {}
    found = encoders(args.preset, args.sequence_length, args.name)
    for name, (backbone, preprocessor) in found.items():
        for task in args.task:
            features = dev_features(args.glue_dir, task)
            outputs = harness.embed(backbone, preprocessor, features, 128)
            embeddings[name, task] = outputs
            for side in ("pooled_output", "cls"):
                rows.append(
                    {
                        "encoder": name,
                        "task": task,
                        "embedding": side,
                        "examples": len(outputs[side]),
                        **measure(outputs[side]),
                    }
                )
                values = ", ".join(
                    f"{k} {v:.3g}"
                    for k, v in rows[-1].items()
                    if isinstance(v, float)
                )
                print(f"[lab] {name}, {task}, {side}: {values}", flush=True)
    task = args.task[0]
    for name, tag in ((args.name, "lab"), ("MiniLM-L6-H384", "minilm")):
        if (name, task) not in embeddings:
            continue
        cls = embeddings[name, task]["cls"]
        plots.plot_std_histogram(
            isotropy.feature_std(cls),
            title=f"[CLS] std, {name}, {task} dev",
            path=os.path.join(args.output, f"cls_std_{tag}.png"),
        )
        plots.plot_correlation_heatmap(
            isotropy.clustered_correlation(cls)[0],
            title=f"[CLS] correlation, {name}, {task} dev",
            path=os.path.join(args.output, f"cls_correlation_{tag}.png"),
        )
    copy_pretraining_curve(args.preset, args.output)
    payload = {
        "preset": args.preset,
        "sequence_length": args.sequence_length,
        "rows": rows,
        "environment": harness.environment(),
    }
    harness.write_json(os.path.join(args.output, "anisotropy.json"), payload)
    with open(os.path.join(args.output, "anisotropy.md"), "w") as file:
        file.write(anisotropy_markdown(rows))
    return payload


def copy_pretraining_curve(preset, output):
    """Copies `pretraining.{csv,json}` of the preset and plots the curve."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    path = os.path.join(preset, "pretraining.csv")
    if not os.path.exists(path):
        return
    for name in ("pretraining.csv", "pretraining.json"):
        shutil.copy(os.path.join(preset, name), output)
    with open(path) as file:
        rows = list(csv.DictReader(file))
    step = [int(r["step"]) for r in rows]
    sides = [side for side in ("cls", "pooled") if f"{side}_ev3" in rows[0]]
    panels = 3 if sides else 2  # Curves from before the EV columns: 2.
    figure, axes = pyplot.subplots(1, panels, figsize=(4.5 * panels, 3.2))
    # With the pair objective: "mlm_" and "pair_" columns beside the total.
    mlm = "mlm_" if "held_out_mlm_loss" in rows[0] else ""
    for axis, what in zip(axes, ("loss", "accuracy")):
        for split in ("train", "held_out"):
            values = [float(r[f"{split}_{mlm}{what}"]) for r in rows]
            axis.plot(step, values, label=split.replace("_", "-"))
        if mlm and what == "accuracy":
            values = [float(r["held_out_pair_accuracy"]) for r in rows]
            axis.plot(step, values, label="held-out pair objective")
        axis.set(xlabel="step", title=f"masked-LM {what}")
        axis.legend()
    for side in sides:
        values = [float(r[f"{side}_ev3"]) for r in rows]
        axes[2].plot(step, values, label=side)
        axes[2].set(xlabel="step", title="EV_3, held-out sentences")
        axes[2].legend()
    figure.tight_layout()
    figure.savefig(os.path.join(output, "pretraining.png"), dpi=100)
    pyplot.close(figure)


def anisotropy_markdown(rows):
    """The rows of `anisotropy` as a Markdown table."""
    header = [
        "encoder",
        "task (dev)",
        "embedding",
        "EV_1",
        "EV_3",
        "std min / median / max",
        "p95/p5",
        "n*gamma median / max",
        "share with a |rho|>0.5",
    ]
    cells = [
        [
            r["encoder"],
            r["task"],
            r["embedding"],
            f"{r['ev1']:.3f}",
            f"{r['ev3']:.3f}",
            f"{r['std_min']:.3g} / {r['std_median']:.3g} / {r['std_max']:.3g}",
            f"{r['std_p95_p5']:.3g}",
            f"{r['group_size_median']:.1f} / {r['group_size_max']:.1f}",
            f"{r['correlated_share']:.2f}",
        ]
        for r in rows
    ]
    return harness.table(header, cells) + "\n"
