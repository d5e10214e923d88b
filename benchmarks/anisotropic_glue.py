"""The GLUE recipe on a simulated anisotropic encoder: MiniLM + a fixed map.

IsoBN's premise is an anisotropic [CLS] embedding: the paper measures EV_3
(the share of the variance on the top 3 principal components) of about
0.86 for BERT-base, per-feature stds spread over orders of magnitude and
clusters of highly correlated features. The MiniLM checkpoint we can load
offline is close to isotropic (EV_3 about 0.12 on GLUE sentences), and no
BERT-base weights or GPU are reachable here. So this benchmark *simulates*
an anisotropic encoder: MiniLM whose pooled output passes through a fixed,
frozen linear map

```
M = R1 @ diag(s) @ R2 @ diag(t)
```

with `R1`, `R2` random rotations, `s_i = (i + 1) ** -p` a steep spectrum
(a few directions dominate, and `R2` spreads them over every feature, so
features form correlated groups), `t` per-feature scales log-uniform over
two orders of magnitude, `p` fitted by bisection so that EV_3 of the mapped
pooled outputs of the task's training sentences is `--target-ev`, and `M`
scaled so their total variance is the pre-trained one. The encoder is
fine-tuned as usual; the map stays fixed, so every normalization (none,
BatchNormalization, IsoBN, unit-variance IsoBN) sees features shaped like
the paper's. `recipes/glue.py` runs unchanged but for its classifier,
whose backbone is wrapped with the map; it measures EV_3 of the mapped
features before and after fine-tuning (its Table 2).

Usage:

```
python -m benchmarks.anisotropic_glue --glue-dir ../shared/glue \\
    --output-dir /tmp/anisotropic/runs -- --task stsb --norm none isobn \\
    --seeds 1 2 3 --train-limit 1000 --max-sequence-length 64 \\
    --learning-rate 1e-4 --epochs 4
```

Everything after `--` goes to `recipes/glue.py` (`--preset`, `--data-dir`
and `--output-dir` are set here). Writes `anisotropic_map_<task>.json` (the fit:
`p`, EV_3, per-feature stds and correlations before and after the map) to
`--output-dir`.
"""

import argparse
import json
import os
import sys

import numpy as np

if __package__ in (None, ""):  # `python benchmarks/anisotropic_glue.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402

MAP_FILE = "anisotropic_map_{task}.json"


def random_rotation(rng, dim):
    """A random orthogonal matrix (QR of a Gaussian, signs fixed)."""
    q, r = np.linalg.qr(rng.normal(size=(dim, dim)))
    return q * np.sign(np.diag(r))


def anisotropic_map(pooled, target_ev=0.86, k=3, seed=0):
    """Fits the fixed map `M` to the pre-trained pooled outputs.

    Args:
        pooled: `(examples, features)` pre-trained pooled outputs.
        target_ev: EV_k of `pooled @ M` to reach.
        k: The number of principal components of EV_k.
        seed: Seed of the rotations and the per-feature scales.

    Returns:
        `(M, p)`: the `(features, features)` float64 map and the spectrum's
        exponent.
    """
    from keras_isobn.isotropy import explained_variance

    pooled = np.asarray(pooled, np.float64)
    dim = pooled.shape[1]
    rng = np.random.default_rng(seed)
    r1, r2 = random_rotation(rng, dim), random_rotation(rng, dim)
    t = 10.0 ** rng.uniform(-2.0, 0.0, size=dim)
    total = np.sum(np.var(pooled, axis=0))

    def build(p):
        m = r1 @ np.diag((np.arange(dim) + 1.0) ** -p) @ r2 @ np.diag(t)
        scale = np.sqrt(total / np.sum(np.var(pooled @ m, axis=0)))
        return m * scale

    def ev(p):
        return float(explained_variance(pooled @ build(p), [k])[0])

    low, high = 0.0, 8.0
    if not ev(low) < target_ev < ev(high):
        raise ValueError(
            f"EV_{k} = {target_ev} is out of reach: {ev(low):.3f} with a "
            f"flat spectrum, {ev(high):.3f} with the steepest tried."
        )
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if ev(middle) < target_ev else (low, middle)
    p = (low + high) / 2
    return build(p), p


def statistics(x, k=3):
    """EV_k, std spread and mean squared correlation (IsoBN's gamma)."""
    from keras_isobn.isotropy import isotropy_summary

    summary = isotropy_summary(x, k=[k])
    keys = (f"ev{k}", "std_min", "std_median", "std_max", "gamma_median",
            "gamma_max")
    return {key: summary[key] for key in keys}


def wrap_backbone(backbone, matrix):
    """`backbone` whose `"pooled_output"` is multiplied by a frozen matrix."""
    import keras

    inputs = backbone.input
    outputs = dict(backbone(inputs))
    fixed = keras.layers.Dense(
        matrix.shape[1], use_bias=False, trainable=False,
        dtype=backbone.dtype_policy, name="anisotropic_map",
    )  # fmt: skip
    outputs["pooled_output"] = fixed(outputs["pooled_output"])
    fixed.set_weights([matrix.astype("float32")])
    return keras.Model(inputs, outputs, name="anisotropic_backbone")


def with_map(classifier, matrix):
    """A classifier like `classifier` on the wrapped backbone."""
    config = classifier.get_config()
    config.update(
        backbone=wrap_backbone(classifier.backbone, matrix),
        preprocessor=classifier.preprocessor,
        normalization=config.get("normalization"),
    )
    return type(classifier)(**config)


def pretrained_pooled(recipe, recipe_args, task):
    """The pre-trained pooled outputs of the task's training sentences."""
    import keras

    data = recipe.load_data(task, recipe_args)
    classifier = recipe.build_classifier(recipe_args, task, "none")
    inputs = recipe.models.tokenize(classifier, data["train"].features)
    backbone = classifier.backbone
    probe = keras.Model(backbone.input, backbone.output["pooled_output"])
    return probe.predict(inputs, batch_size=64, verbose=0)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" in argv:
        split = argv.index("--")
        argv, recipe_argv = argv[:split], argv[split + 1 :]
    else:
        recipe_argv = []
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.anisotropic_glue",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--glue-dir", required=True, help="GLUE TSV folder.")
    parser.add_argument("--output-dir", required=True,
                        help="The recipe's --output-dir; the map's record.")
    parser.add_argument("--target-ev", type=float, default=0.86,
                        help="EV_3 of the mapped pooled outputs (the "
                        "paper's BERT-base [CLS]: 0.86).")
    parser.add_argument("--seed", type=int, default=0, help="The map's seed.")
    args = parser.parse_args(argv)

    sys.path.insert(0, os.path.join(common.REPO_ROOT, "recipes"))
    import glue as recipe

    recipe_argv += ["--preset", common.minilm_checkpoint(),
                    "--data-dir", args.glue_dir,
                    "--output-dir", args.output_dir]
    recipe_args = recipe.parse_args(recipe_argv)
    if len(recipe_args.task) != 1:
        parser.error("Give one --task (the map is fitted per task).")
    task = recipe.glue.get_task(recipe_args.task[0])

    pooled = pretrained_pooled(recipe, recipe_args, task)
    matrix, p = anisotropic_map(pooled, args.target_ev, seed=args.seed)
    record = {
        "task": task.name, "target_ev3": args.target_ev, "seed": args.seed,
        "exponent_p": p, "examples": len(pooled),
        "pretrained": statistics(pooled),
        "mapped": statistics(pooled @ matrix),
    }  # fmt: skip
    os.makedirs(args.output_dir, exist_ok=True)
    path = os.path.join(args.output_dir, MAP_FILE.format(task=task.name))
    with open(path, "w") as file:
        json.dump(record, file, indent=2)
    print(f"[anisotropic] map fitted: {json.dumps(record)}", flush=True)

    build = recipe.build_classifier
    recipe.build_classifier = lambda *a: with_map(build(*a), matrix)
    return recipe.main(recipe_argv)


if __name__ == "__main__":
    main()
