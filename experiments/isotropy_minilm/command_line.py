"""The command line of `python -m experiments.isotropy_minilm`.

`--help` lists the options; `--quick` checks that it runs, in seconds.
"""

import argparse
import json
import os
import time

import keras
import numpy as np

import keras_isobn
from benchmarks import harness
from experiments import isotropy_minilm
from experiments.isotropy_minilm import measurement

__all__ = ["RESULTS_DIR", "parse_args", "main"]

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")


def parse_args(argv=None):
    """Parses the command line (`sys.argv[1:]` if `argv` is `None`)."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.isotropy_minilm",
        description=isotropy_minilm.__doc__.split("\n")[0],
    )
    add = parser.add_argument
    add(
        "--data-dir",
        default="../shared/glue",
        help="GLUE-format folder. Defaults to %(default)s.",
    )
    add(
        "--output-dir",
        default=RESULTS_DIR,
        help="Folder for the JSON and Markdown results.",
    )
    add(
        "--image-dir",
        default=os.path.join(harness.REPO_ROOT, "docs", "images"),
        help="Folder for the README picture.",
    )
    add("--sequence-length", type=int, default=128)
    add("--batch-size", type=int, default=32)
    add(
        "--passes",
        type=int,
        default=10,
        help="Passes of the normalisation layers over the embeddings.",
    )
    add(
        "--max-examples",
        type=int,
        default=None,
        help="Use only the first N examples of each set (for a quick run).",
    )
    add("--seed", type=int, default=0)
    add(
        "--quick",
        action="store_true",
        help="32 examples, 16 tokens, 2 passes: checks that the script runs "
        "(e.g. on `keras_isobn.glue.sample_data_dir()`).",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.max_examples, args.sequence_length, args.passes = 32, 16, 2
        args.batch_size = 8
    return args


def measure_dataset(backbone, preprocessor, x, args, rng):
    """The measures of one data set: raw, after BatchNorm, after IsoBN.

    Returns:
        `(result, normalised_cls)`: the measures by embedding and layer,
        and the [CLS] embeddings raw and after IsoBN (for the picture).
    """
    embeddings = harness.embed(backbone, preprocessor, x, args.batch_size)
    result = {"examples": len(embeddings["cls"])}
    cls = {}
    for name, values in embeddings.items():
        layers = {
            "batchnorm": keras.layers.BatchNormalization(
                momentum=1.0 - measurement.MOMENTUM
            ),
            "isobn": keras_isobn.IsoBatchNormalization(
                momentum=measurement.MOMENTUM
            ),
        }
        normalised = {
            key: measurement.normalise(
                layer, values, args.passes, args.batch_size, rng
            )
            for key, layer in layers.items()
        }
        result[name] = {"raw": measurement.measure(values)}
        for key, value in normalised.items():
            result[name][key] = measurement.measure(value)
        if name == "cls":
            cls = {"raw": values, "isobn": normalised["isobn"]}
    return result, cls


def main(argv=None):
    """Measures, writes the JSON, the Markdown and the picture.

    Args:
        argv: List of strings, as on the command line.

    Returns:
        The path of the JSON file.
    """
    args = parse_args(argv)
    started = time.time()
    rng = np.random.default_rng(args.seed)
    keras.utils.set_random_seed(args.seed)
    backbone, preprocessor = harness.load_minilm(args.sequence_length)
    results, cls = {}, {}
    data = measurement.load_glue(args.data_dir, args.max_examples)
    for dataset, x in data.items():
        results[dataset], dataset_cls = measure_dataset(
            backbone, preprocessor, x, args, rng
        )
        if dataset == "SST-2":
            cls = dataset_cls
        print(dataset, json.dumps(results[dataset], indent=1))

    skipped = ("output_dir", "image_dir", "data_dir")
    report = {
        "benchmark": "isotropy_minilm",
        "environment": harness.environment(),
        "settings": {k: v for k, v in vars(args).items() if k not in skipped},
        "results": results,
        "seconds": time.time() - started,
    }
    name = "isotropy_minilm_quick" if args.quick else "isotropy_minilm"
    stem = os.path.join(args.output_dir, name)
    harness.write_json(stem + ".json", report)
    with open(stem + ".md", "w") as file:
        file.write(measurement.markdown(report))
    image = os.path.join(args.image_dir, "minilm_cls_std.png")
    measurement.plot_cls_std(cls["raw"], cls["isobn"], image)
    print(f"Wrote {stem}.json, {stem}.md and {image}")
    return stem + ".json"
