"""The GLUE recipe with the anisotropic map fitted to the task's sentences.

Run as `python -m experiments.anisotropic_glue ... -- RECIPE_ARGS` from the
repository root; `--help` lists the options.
"""

import argparse
import json
import os
import sys

from benchmarks import harness
from experiments import anisotropic_glue
from experiments.anisotropic_glue.anisotropic_map import anisotropic_map
from experiments.anisotropic_glue.anisotropic_map import statistics
from experiments.anisotropic_glue.anisotropic_map import with_map
from keras_isobn import glue
from keras_isobn import models
from recipes import glue as recipe

__all__ = ["MAP_FILE", "pretrained_pooled", "main"]

MAP_FILE = "anisotropic_map_{task}.json"


def pretrained_pooled(recipe_args, task):
    """The pre-trained pooled outputs of the task's training sentences."""
    import keras

    data = recipe.load_data(task, recipe_args)
    classifier = recipe.build_classifier(recipe_args, task, "none")
    inputs = models.tokenize(classifier, data["train"].features)
    backbone = classifier.backbone
    probe = keras.Model(backbone.input, backbone.output["pooled_output"])
    return probe.predict(inputs, batch_size=64, verbose=0)


def main(argv=None):
    """Fits the map to the task, records it, and runs the recipe with it.

    Args:
        argv: List of strings: this command's options, then `--` and the
            recipe's (`sys.argv[1:]` if `None`).

    Returns:
        What `recipes.glue.main` returns: the results dict of each run.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" in argv:
        split = argv.index("--")
        argv, recipe_argv = argv[:split], argv[split + 1 :]
    else:
        recipe_argv = []
    parser = argparse.ArgumentParser(
        prog="python -m experiments.anisotropic_glue",
        description=anisotropic_glue.__doc__.split("\n\n")[0],
    )
    parser.add_argument("--glue-dir", required=True, help="GLUE TSV folder.")
    parser.add_argument(
        "--output-dir",
        required=True,
        help="The recipe's --output-dir; the map's record.",
    )
    parser.add_argument(
        "--target-ev",
        type=float,
        default=0.86,
        help="EV_3 of the mapped pooled outputs (the paper's BERT-base "
        "[CLS]: 0.86).",
    )
    parser.add_argument("--seed", type=int, default=0, help="The map's seed.")
    args = parser.parse_args(argv)

    recipe_argv += [
        "--preset",
        harness.minilm_checkpoint(),
        "--data-dir",
        args.glue_dir,
        "--output-dir",
        args.output_dir,
    ]
    recipe_args = recipe.parse_args(recipe_argv)
    if len(recipe_args.task) != 1:
        parser.error("Give one --task (the map is fitted per task).")
    task = glue.get_task(recipe_args.task[0])

    pooled = pretrained_pooled(recipe_args, task)
    matrix, p = anisotropic_map(pooled, args.target_ev, seed=args.seed)
    record = {
        "task": task.name,
        "target_ev3": args.target_ev,
        "seed": args.seed,
        "exponent_p": p,
        "examples": len(pooled),
        "pretrained": statistics(pooled),
        "mapped": statistics(pooled @ matrix),
    }
    os.makedirs(args.output_dir, exist_ok=True)
    path = os.path.join(args.output_dir, MAP_FILE.format(task=task.name))
    with open(path, "w") as file:
        json.dump(record, file, indent=2)
    print(f"[anisotropic] map fitted: {json.dumps(record)}", flush=True)

    def build_classifier(*arguments):
        return with_map(recipe.build_classifier(*arguments), matrix)

    return recipe.main(recipe_argv, build_classifier=build_classifier)
