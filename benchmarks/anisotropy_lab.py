"""The anisotropy lab: a small BERT pretrained here, and IsoBN tested on it.

IsoBN exists for the anisotropic [CLS] embeddings of MLM-pretrained encoders.
No such checkpoint is reachable offline (MiniLM, the one at hand, is trained
contrastively and is near isotropic), so the lab builds one and tests the
paper's two claims on it:

1. `pretrain`: a WordPiece vocabulary computed on the unlabelled sentences
   of the *training* splits of CoLA, SST-2, MRPC and STS-B (both sentences
   of a pair, packed as BERT packs a pair; no dev or test sentence), then a
   `keras_hub.models.BertBackbone` trained with `BertMaskedLM` on
   `BertMaskedLMPreprocessor`'s usual 15% masking (no next-sentence
   prediction), with fixed seeds: the masks of every epoch are drawn with
   NumPy from `--seed` before training, so the same command gives the same
   weights. Writes a KerasHub preset (`save_to_preset`: backbone and
   tokenizer) that `python recipes/glue.py --preset <dir>` fine-tunes like
   any other, and `pretraining.csv`, the curve of the masked-LM loss and
   masked-token accuracy on the training batches and on held-out sentences
   (the dev sentences, masked once, never trained on).
2. `anisotropy`: the paper's measures on each task's dev sentences: EV_1 and
   EV_3 of the pooled output and of [CLS], the spread of the per-feature
   std, and the share of features in highly correlated groups
   (`keras_isobn.isotropy`), beside the same for the untrained backbone.
3. `experiment`: `recipes/glue.py` over tasks x norms x seeds on the
   preset, then `recipes/report.py`'s tables and, for each norm against
   none, a paired comparison over seeds with a Student-t interval
   (`tables`, also a command of its own). Arguments after `--` go to the
   recipe, the same for every norm.

Usage, from the repository root (the full lab, as committed in
`benchmarks/results/anisotropy_lab/`: about 2.5 hours on 2 cores):

```
python -m benchmarks.anisotropy_lab pretrain --glue-dir ../shared/glue \\
    --output /tmp/lab/preset
python -m benchmarks.anisotropy_lab anisotropy --preset /tmp/lab/preset \\
    --glue-dir ../shared/glue --output benchmarks/results/anisotropy_lab
python -m benchmarks.anisotropy_lab experiment --preset /tmp/lab/preset \\
    --glue-dir ../shared/glue --runs /tmp/lab/runs \\
    --output benchmarks/results/anisotropy_lab -- --train-limit 1000 \\
    --max-sequence-length 64 --batch-size 32 --epochs 3 --learning-rate 5e-4
```
"""

import argparse
import csv
import os
import subprocess
import sys
import time

if __package__ in (None, ""):  # `python benchmarks/anisotropy_lab.py`
    sys.path.insert(
        0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from keras_isobn import glue  # noqa: E402
from keras_isobn import isotropy  # noqa: E402
from keras_isobn import models  # noqa: E402

CORPUS_TASKS = ("cola", "sst2", "mrpc", "stsb")
RESERVED_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
HERE = os.path.dirname(os.path.abspath(__file__))
RECIPES = os.path.join(os.path.dirname(HERE), "recipes")


# --------------------------------------------------------------------------
# The corpus and the vocabulary.


def read_corpus(glue_dir, split="train", tasks=CORPUS_TASKS):
    """Sentences of GLUE-format TSV files: `(singles, pairs)`.

    Args:
        glue_dir: Folder with `CoLA/`, `SST-2/`, `MRPC/`, `STS-B/`.
        split: `"train"` for the pretraining corpus, `"validation"` for held-out
            sentences.
        tasks: GLUE task names to read.

    Returns:
        A list of sentences (single-sentence tasks) and a tuple
        `(first, second)` of equally long lists (sentence-pair tasks).
    """
    singles, first, second = [], [], []
    for name in tasks:
        data = glue.load_split(glue.get_task(name), split, data_dir=glue_dir)
        if isinstance(data.features, tuple):
            first += list(data.features[0])
            second += list(data.features[1])
        else:
            singles += list(data.features)
    return singles, (first, second)


def word_piece_vocabulary(singles, pairs, size):
    """A lowercase WordPiece vocabulary of the corpus (KerasHub's trainer)."""
    import tensorflow as tf

    from keras_hub.tokenizers import compute_word_piece_vocabulary

    text = tf.data.Dataset.from_tensor_slices(singles + pairs[0] + pairs[1])
    return compute_word_piece_vocabulary(
        text.batch(1000),
        size,
        lowercase=True,
        strip_accents=True,
        reserved_tokens=RESERVED_TOKENS,
    )


# --------------------------------------------------------------------------
# Pretraining.


def pack_corpus(preprocessor, singles, pairs):
    """Token ids of the corpus, packed by KerasHub's BERT preprocessing.

    A pair is packed as `[CLS] a [SEP] b [SEP]` with segment ids, as BERT
    packs one.

    Returns:
        A dict of int32 NumPy arrays `"token_ids"`, `"segment_ids"`,
        `"padding_mask"`, one row per sentence or pair.
    """
    import keras_hub

    packer = keras_hub.models.BertTextClassifierPreprocessor(
        preprocessor.tokenizer, sequence_length=preprocessor.sequence_length
    )
    parts = [models.tokenize(packer, np.asarray(singles))] if singles else []
    if pairs[0]:
        parts.append(
            models.tokenize(packer, (np.asarray(pairs[0]), np.asarray(pairs[1])))
        )
    return {key: np.concatenate([part[key] for part in parts]).astype("int32")
            for key in ("token_ids", "segment_ids", "padding_mask")}  # fmt: skip


def mask_tokens(tokens, preprocessor, rng):
    """BERT's masking of packed token ids, drawn from a NumPy generator.

    `BertMaskedLMPreprocessor`'s own masking draws from TensorFlow's
    unseeded random ops (two runs differ), so its settings are applied here
    instead: of the non-special tokens of each row, `round(15%)` (at least
    one, at most `mask_selection_length`) are selected, as in BERT's
    `create_pretraining_data.py`; of those 80% become `[MASK]`, 10% a random
    token and 10% stay.

    Returns:
        `(x, y, sample_weight)`: `x` with the masked `"token_ids"` and the
        `"mask_positions"`, `y` the original ids there, `sample_weight` 1
        for a selected position and 0 for padding of the selections.
    """
    tokenizer = preprocessor.tokenizer
    ids = tokens["token_ids"]
    rows, length = ids.shape
    selections = preprocessor.mask_selection_length
    special = np.isin(ids, tokenizer.special_token_ids)
    # Random keys, special tokens last; each row's smallest keys are chosen.
    keys = np.where(special, np.inf, rng.random(ids.shape))
    count = np.clip(np.round((~special).sum(axis=1)
                             * preprocessor.mask_selection_rate), 1, selections)
    chosen = np.argsort(keys, axis=1, kind="stable")[:, :selections]
    chosen = np.where(np.arange(selections) < count[:, None], chosen, length)
    positions = np.sort(chosen, axis=1)
    weights = (positions < length).astype("float32")
    positions = np.where(positions < length, positions, 0).astype("int32")
    labels = np.take_along_axis(ids, positions, axis=1) * (weights > 0)
    draw = rng.random(positions.shape)
    random_ids = rng.integers(len(RESERVED_TOKENS),
                              tokenizer.vocabulary_size(), positions.shape)
    mask_rate = preprocessor.mask_token_rate
    random_rate = mask_rate + preprocessor.random_token_rate
    new = np.where(draw < mask_rate, tokenizer.token_to_id("[MASK]"),
                   np.where(draw < random_rate, random_ids, labels))  # fmt: skip
    masked = ids.copy()
    row, column = np.nonzero(weights)
    masked[row, positions[row, column]] = new[row, column]
    x = {**tokens, "token_ids": masked, "mask_positions": positions}
    return x, labels.astype("int32"), weights


def length_batches(x, y, sample_weight, batch_size, rng, multiple=16):
    """Batches of rows of similar length, cut to it, in a random order.

    Rows are grouped by their length rounded up to `multiple` (most of the
    corpus is short SST-2 phrases: cutting the padding makes a step 2-3x
    cheaper), shuffled within each group, cut into full batches (the rest
    of a group is left out of this epoch), and the batches shuffled.
    """
    lengths = -(-x["padding_mask"].sum(axis=1) // multiple) * multiple
    batches = []
    for length in np.unique(lengths):
        rows = rng.permutation(np.flatnonzero(lengths == length))
        for start in range(0, len(rows) - batch_size + 1, batch_size):
            batches.append((rows[start:start + batch_size], length))
    order = rng.permutation(len(batches))
    for index in order:
        rows, length = batches[index]
        cut = {k: v[rows] if k == "mask_positions" else v[rows, :length]
               for k, v in x.items()}  # fmt: skip
        yield cut, y[rows], sample_weight[rows]


def pretrain(args):
    """Builds the vocabulary, pretrains the masked LM, writes the preset."""
    import keras_hub

    from keras_isobn.optimizers import fine_tuning_adamw

    start = time.time()
    os.makedirs(args.output, exist_ok=True)
    singles, pairs = read_corpus(args.glue_dir, "train", args.corpus)
    print(f"[lab] corpus: {len(singles)} sentences, {len(pairs[0])} pairs "
          f"(train splits of {', '.join(args.corpus)})", flush=True)
    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    vocabulary = word_piece_vocabulary(singles, pairs, args.vocabulary_size)
    tokenizer = keras_hub.models.BertTokenizer(vocabulary, lowercase=True)
    preprocessor = keras_hub.models.BertMaskedLMPreprocessor(
        tokenizer, sequence_length=args.sequence_length,
        mask_selection_rate=0.15, mask_selection_length=args.mask_length,
    )  # fmt: skip
    tokens = pack_corpus(preprocessor, singles, pairs)
    held_singles, held_pairs = read_corpus(args.glue_dir, "validation",
                                           args.corpus)
    held_out = mask_tokens(pack_corpus(
        preprocessor, held_singles[: args.held_out],
        [pair[: args.held_out // 4] for pair in held_pairs],
    ), preprocessor, np.random.default_rng(args.seed + 1))  # fmt: skip
    print(f"[lab] vocabulary {tokenizer.vocabulary_size()} tokens; "
          f"{args.steps} steps of {args.batch_size} "
          f"({time.time() - start:.0f} s so far)", flush=True)

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=args.layers, num_heads=args.heads,
        hidden_dim=args.width, intermediate_dim=4 * args.width,
        max_sequence_length=args.sequence_length,
    )  # fmt: skip
    masked_lm = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
    masked_lm.compile(
        optimizer=fine_tuning_adamw(
            args.learning_rate, total_steps=args.steps, warmup_ratio=0.06,
            weight_decay=0.01, epsilon=1e-6,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight"
        ),  # Per masked token.
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy("accuracy")],
    )  # fmt: skip
    curve, logs, step, epoch = [], [], 0, 0
    while step < args.steps:
        batches = length_batches(*mask_tokens(tokens, preprocessor, rng),
                                 args.batch_size, rng)  # fmt: skip
        for x, y, weights in batches:
            logs.append(masked_lm.train_on_batch(
                x, y, sample_weight=weights, return_dict=True))
            step += 1
            if step % args.log_every and step < args.steps:
                continue
            held = masked_lm.evaluate(
                *held_out[:2], sample_weight=held_out[2], batch_size=256,
                verbose=0, return_dict=True,
            )  # fmt: skip
            curve.append({
                "step": step, "epoch": epoch,
                "train_loss": np.mean([log["loss"] for log in logs]),
                "train_accuracy": np.mean([log["accuracy"] for log in logs]),
                "held_out_loss": held["loss"],
                "held_out_accuracy": held["accuracy"],
                "elapsed_s": time.time() - start,
            })  # fmt: skip
            logs = []
            print("[lab] " + ", ".join(f"{k} {v:.4g}" for k, v in
                                       curve[-1].items()), flush=True)  # fmt: skip
            if step == args.steps:
                break
        epoch += 1
    backbone.save_to_preset(args.output)
    tokenizer.save_to_preset(args.output)
    with open(os.path.join(args.output, "pretraining.csv"), "w") as file:
        writer = csv.DictWriter(file, fieldnames=list(curve[0]))
        writer.writeheader()
        writer.writerows(curve)
    summary = {
        "corpus": {"sentences": len(singles), "pairs": len(pairs[0]),
                   "tasks": list(args.corpus), "split": "train",
                   "tokens": int(tokens["padding_mask"].sum())},
        "held_out": {"rows": len(held_out[1]), "split": "validation"},
        "vocabulary_size": tokenizer.vocabulary_size(),
        "settings": {k: v for k, v in vars(args).items()
                     if k not in ("command", "glue_dir", "output")},
        "parameters": backbone.count_params(),
        "epochs_started": epoch + 1,
        "final": curve[-1],
        "wall_time_s": time.time() - start,
        "environment": common.environment(),
    }  # fmt: skip
    common.write_json(os.path.join(args.output, "pretraining.json"), summary)
    print(f"[lab] wrote the preset {args.output} "
          f"({summary['wall_time_s'] / 60:.1f} min)", flush=True)
    return summary


# --------------------------------------------------------------------------
# Anisotropy of the embeddings.

EVAL_TASKS = ("stsb", "mrpc", "cola", "sst2")
NORMS = ("none", "batchnorm", "isobn", "isobn-unit")
CORRELATED = 0.5  # |rho| above which two features count as one group.


def measure(x):
    """The paper's isotropy measures of embeddings `x` (samples, features).

    `keras_isobn.isotropy.isotropy_summary`: EV_1 and EV_3, the per-feature
    std (min, median, max, 95th/5th percentile ratio), IsoBN's group size
    `n * gamma` and the share of features with `|rho| > 0.5` to another.
    """
    summary = isotropy.isotropy_summary(x, k=(1, 3), threshold=CORRELATED)
    keys = ("ev1", "ev3", "std_min", "std_median", "std_max", "std_p95_p5",
            "group_size_median", "group_size_max", "correlated_share")
    return {key: summary[key] for key in keys}


def dev_features(glue_dir, task):
    """A task's dev sentences: strings, or a tuple of two for pairs."""
    split = glue.load_split(glue.get_task(task), "validation", data_dir=glue_dir)
    return split.features


def encoders(preset, sequence_length):
    """`name -> (backbone, preprocessor)`: the lab's, untrained, MiniLM."""
    import keras_hub

    preprocessor = keras_hub.models.BertTextClassifierPreprocessor.from_preset(
        preset, sequence_length=sequence_length
    )
    backbone = keras_hub.models.BertBackbone.from_preset(preset)
    keras.utils.set_random_seed(0)
    untrained = keras_hub.models.BertBackbone.from_config(backbone.get_config())
    found = {"lab, pretrained": (backbone, preprocessor),
             "lab, untrained (same shape)": (untrained, preprocessor)}
    try:
        found["MiniLM-L6-H384"] = common.load_minilm(sequence_length)
    except ImportError as error:
        print(f"[lab] MiniLM left out: {error}", flush=True)
    return found


def anisotropy(args):
    """Measures every encoder on every task's dev sentences; writes tables."""
    from keras_isobn import plots

    os.makedirs(args.output, exist_ok=True)
    rows, embeddings = [], {}
    for name, (backbone, preprocessor) in encoders(
        args.preset, args.sequence_length
    ).items():
        for task in args.task:
            outputs = common.embed(backbone, preprocessor,
                                   dev_features(args.glue_dir, task), 128)
            embeddings[name, task] = outputs
            for side in ("pooled_output", "cls"):
                rows.append({"encoder": name, "task": task, "embedding": side,
                             "examples": len(outputs[side]),
                             **measure(outputs[side])})  # fmt: skip
                print(f"[lab] {name}, {task}, {side}: " + ", ".join(
                    f"{k} {v:.3g}" for k, v in rows[-1].items()
                    if isinstance(v, float)), flush=True)  # fmt: skip
    task = args.task[0]
    for name, tag in (("lab, pretrained", "lab"), ("MiniLM-L6-H384", "minilm")):
        if (name, task) not in embeddings:
            continue
        cls = embeddings[name, task]["cls"]
        plots.plot_std_histogram(
            isotropy.feature_std(cls), title=f"[CLS] std, {name}, {task} dev",
            path=os.path.join(args.output, f"cls_std_{tag}.png"))
        plots.plot_correlation_heatmap(
            isotropy.clustered_correlation(cls)[0],
            title=f"[CLS] correlation, {name}, {task} dev",
            path=os.path.join(args.output, f"cls_correlation_{tag}.png"))
    copy_pretraining_curve(args.preset, args.output)
    payload = {"preset": args.preset, "sequence_length": args.sequence_length,
               "rows": rows, "environment": common.environment()}
    common.write_json(os.path.join(args.output, "anisotropy.json"), payload)
    with open(os.path.join(args.output, "anisotropy.md"), "w") as file:
        file.write(anisotropy_markdown(rows))
    return payload


def copy_pretraining_curve(preset, output):
    """Copies `pretraining.{csv,json}` of the preset and plots the curve."""
    import shutil

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
    figure, axes = pyplot.subplots(1, 2, figsize=(9, 3.2))
    for axis, what in zip(axes, ("loss", "accuracy")):
        for split in ("train", "held_out"):
            axis.plot(step, [float(r[f"{split}_{what}"]) for r in rows],
                      label=split.replace("_", "-"))  # fmt: skip
        axis.set(xlabel="step", title=f"masked-LM {what}")
        axis.legend()
    figure.tight_layout()
    figure.savefig(os.path.join(output, "pretraining.png"), dpi=100)
    pyplot.close(figure)


def anisotropy_markdown(rows):
    lines = [
        "| encoder | task (dev) | embedding | EV_1 | EV_3 | std min / median "
        "/ max | p95/p5 | n*gamma median / max | share with a |rho|>0.5 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['encoder']} | {r['task']} | {r['embedding']} | "
            f"{r['ev1']:.3f} | {r['ev3']:.3f} | {r['std_min']:.3g} / "
            f"{r['std_median']:.3g} / {r['std_max']:.3g} | "
            f"{r['std_p95_p5']:.3g} | {r['group_size_median']:.1f} / "
            f"{r['group_size_max']:.1f} | {r['correlated_share']:.2f} |"
        )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# The experiment: the recipe over tasks x norms x seeds, and the tables.


def experiment(args, recipe_args):
    """Runs `recipes/glue.py` once per task (all norms and seeds), then tables.

    A run already finished is skipped by the recipe, so the same command
    resumes an interrupted experiment.
    """
    for task in args.task:
        command = [
            sys.executable, os.path.join(RECIPES, "glue.py"),
            "--preset", args.preset, "--task", task,
            "--data-dir", args.glue_dir, "--norm", *args.norm,
            "--seeds", *map(str, args.seeds), "--output-dir", args.runs,
            "--no-report", "--verbose", "0", *recipe_args,
        ]  # fmt: skip
        print("[lab] " + " ".join(command), flush=True)
        subprocess.run(command, check=True)
    return tables(args)


def paired_comparison(results, confidence=0.95):
    """Each norm against none, paired by (task, seed): mean and t-intervals.

    Args:
        results: `results.json` dicts of one preset.
        confidence: Of the two-sided Student-t interval over the seeds.

    Returns:
        Rows `task, norm, seeds, differences, mean_difference, low, high,
        claim, adjusted_low, adjusted_high, adjusted_claim`, in points
        (x100) of the task's primary metric. `claim` is `"better"` or
        `"worse"` when the interval excludes zero, else `"no claim"`; the
        `adjusted_` ones are the same at the Bonferroni level for all the
        rows together (confidence `1 - (1 - confidence) / rows`), so that
        the chance of any false claim among them stays under
        `1 - confidence`.
    """
    from scipy import stats

    score = {(r["task"], r["norm"], r["seed"]):
             100 * r["dev_metrics"][r["primary_metric"]] for r in results}
    pairs = []
    for task in dict.fromkeys(r["task"] for r in results):
        for norm in NORMS[1:]:
            seeds = sorted(s for t, n, s in score if t == task and n == norm
                           and (task, "none", s) in score)  # fmt: skip
            if len(seeds) >= 2:
                pairs.append((task, norm, np.array(
                    [score[task, norm, s] - score[task, "none", s]
                     for s in seeds])))  # fmt: skip

    def interval(d, level):
        half = stats.t.ppf((1 + level) / 2, len(d) - 1) * (
            d.std(ddof=1) / np.sqrt(len(d)))
        low, high = d.mean() - half, d.mean() + half
        claim = "better" if low > 0 else "worse" if high < 0 else "no claim"
        return float(low), float(high), claim

    adjusted = 1 - (1 - confidence) / max(len(pairs), 1)
    rows = []
    for task, norm, d in pairs:
        low, high, claim = interval(d, confidence)
        a_low, a_high, a_claim = interval(d, adjusted)
        rows.append({"task": task, "norm": norm, "seeds": len(d),
                     "differences": d.round(2).tolist(),
                     "mean_difference": float(d.mean()),
                     "low": low, "high": high, "claim": claim,
                     "adjusted_confidence": adjusted,
                     "adjusted_low": a_low, "adjusted_high": a_high,
                     "adjusted_claim": a_claim})  # fmt: skip
    return rows


def tables(args):
    """The report's Table 1 and 2 and the paired comparison, of `--runs`."""
    sys.path.insert(0, RECIPES)
    import report

    paths = report.main([args.runs, "--output", args.output])
    results = report.load_results(args.runs)
    rows = paired_comparison(results)
    level = rows[0]["adjusted_confidence"] if rows else 0.95
    lines = [
        "| task | norm vs none | seeds | differences (points) | mean | "
        f"95% interval | claim | {100 * level:.2f}% interval "
        f"(Bonferroni, {len(rows)} comparisons) | claim |",
        "|---|---|---|---|---|---|---|---|---|",
    ] + [
        f"| {r['task']} | {r['norm']} | {r['seeds']} | "
        f"{' / '.join(f'{v:+.1f}' for v in r['differences'])} | "
        f"{r['mean_difference']:+.2f} | [{r['low']:+.2f}, {r['high']:+.2f}] | "
        f"{r['claim']} | [{r['adjusted_low']:+.2f}, "
        f"{r['adjusted_high']:+.2f}] | {r['adjusted_claim']} |"
        for r in rows
    ]  # fmt: skip
    with open(os.path.join(args.output, "paired.md"), "w") as file:
        file.write("\n".join(lines) + "\n")
    common.write_json(os.path.join(args.output, "paired.json"), rows)
    print("\n".join(lines), flush=True)
    return {"tables": paths, "paired": rows}


# --------------------------------------------------------------------------
# The command line.


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.anisotropy_lab",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("pretrain", help="Pretrain and write a preset.")
    p.add_argument("--glue-dir", required=True)
    p.add_argument("--output", required=True, help="The preset folder.")
    p.add_argument("--corpus", nargs="+", default=list(CORPUS_TASKS),
                   help="Tasks whose training sentences make the corpus.")
    p.add_argument("--vocabulary-size", type=int, default=8192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--sequence-length", type=int, default=64)
    p.add_argument("--mask-length", type=int, default=10,
                   help="At most this many masked tokens per sequence.")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--held-out", type=int, default=1024,
                   help="Held-out dev sentences (and a quarter as pairs).")
    p.add_argument("--seed", type=int, default=0)
    a = commands.add_parser("anisotropy", help="Measure the embeddings.")
    a.add_argument("--preset", required=True)
    a.add_argument("--glue-dir", required=True)
    a.add_argument("--output", required=True)
    a.add_argument("--task", nargs="+", default=list(EVAL_TASKS))
    a.add_argument("--sequence-length", type=int, default=64)
    for name in ("experiment", "tables"):
        e = commands.add_parser(name, help={
            "experiment": "Fine-tune tasks x norms x seeds, then the tables "
            "(arguments after -- go to recipes/glue.py).",
            "tables": "Only the tables, of the runs there are."}[name])
        e.add_argument("--runs", required=True, help="The recipe's "
                       "--output-dir.")
        e.add_argument("--output", required=True, help="Tables go here.")
        if name == "experiment":
            e.add_argument("--preset", required=True)
            e.add_argument("--glue-dir", required=True)
            e.add_argument("--task", nargs="+", default=list(EVAL_TASKS))
            e.add_argument("--norm", nargs="+", default=list(NORMS))
            e.add_argument("--seeds", nargs="+", type=int,
                           default=[1, 2, 3, 4, 5])
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:split]), argv[split + 1:]


def main(argv=None):
    args, recipe_args = parse_args(argv)
    if args.command == "experiment":
        return experiment(args, recipe_args)
    return {"pretrain": pretrain, "anisotropy": anisotropy,
            "tables": tables}[args.command](args)


if __name__ == "__main__":
    main()
