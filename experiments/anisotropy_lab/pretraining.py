"""Pretraining of the lab's encoder: a small BERT, masked LM, fixed seeds.

A WordPiece vocabulary is computed on the unlabelled sentences of the
*training* splits of CoLA, SST-2, MRPC and STS-B (both sentences of a pair,
packed as BERT packs a pair; no dev or test sentence), then a
`keras_hub.models.BertBackbone` is trained with `BertMaskedLM` on
`BertMaskedLMPreprocessor`'s usual 15% masking (no next-sentence
prediction). The masks of every epoch are drawn with NumPy from `--seed`,
so the same command gives the same weights. `pretrain` writes a KerasHub
preset (`save_to_preset`: backbone and tokenizer) that `python
recipes/glue.py --preset <dir>` fine-tunes like any other, and
`pretraining.csv`, the curve of the masked-LM loss and masked-token
accuracy on the training batches and on held-out sentences (dev sentences,
masked once, never trained on), beside the anisotropy of those sentences'
[CLS] and pooled output (`anisotropy.measure`), from step 0 on.

With `--from-preset`, a pretrained BERT (e.g. MiniLM-L6-H384, isotropic
from its contrastive training) continues masked-LM training on its own
vocabulary with a fresh `BertMaskedLM` head (word embeddings tied, as
KerasHub ties them), to see whether MLM brings the anisotropy back.

Masked-LM training never reaches the pooler (`pooled_dense` only feeds
the pooled output, which the masked-LM head does not read). With
`--pair-objective` the pooler is trained as BERT's is, on a
next-sentence-style task: each epoch, half of the corpus's sentence pairs
(redrawn from the seed) get the second sentence of another pair, and a
`Dense(2)` on the pooled output tells real pairs from drawn ones, beside
the masked-LM loss (single sentences carry the masked-LM loss only).
"""

import csv
import functools
import os
import time

import keras
import numpy as np

from benchmarks import harness
from keras_isobn import glue
from keras_isobn import models

__all__ = [
    "CORPUS_TASKS",
    "RESERVED_TOKENS",
    "read_corpus",
    "word_piece_vocabulary",
    "pack_corpus",
    "mask_tokens",
    "drawn_pairs",
    "epoch_examples",
    "length_batches",
    "masked_language_model",
    "freeze_below",
    "train",
    "pretrain",
    "write_preset",
]

CORPUS_TASKS = ("cola", "sst2", "mrpc", "stsb")
RESERVED_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


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
        pair = (np.asarray(pairs[0]), np.asarray(pairs[1]))
        parts.append(models.tokenize(packer, pair))
    keys = ("token_ids", "segment_ids", "padding_mask")
    if not parts:
        empty = np.zeros((0, packer.sequence_length), "int32")
        return {key: empty for key in keys}
    return {
        key: np.concatenate([part[key] for part in parts]).astype("int32")
        for key in keys
    }


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
    ordinary = (~special).sum(axis=1)
    count = np.clip(
        np.round(ordinary * preprocessor.mask_selection_rate), 1, selections
    )
    chosen = np.argsort(keys, axis=1, kind="stable")[:, :selections]
    chosen = np.where(np.arange(selections) < count[:, None], chosen, length)
    positions = np.sort(chosen, axis=1)
    weights = (positions < length).astype("float32")
    positions = np.where(positions < length, positions, 0).astype("int32")
    labels = np.take_along_axis(ids, positions, axis=1) * (weights > 0)
    draw = rng.random(positions.shape)
    random_ids = rng.integers(
        len(RESERVED_TOKENS), tokenizer.vocabulary_size(), positions.shape
    )
    mask_rate = preprocessor.mask_token_rate
    random_rate = mask_rate + preprocessor.random_token_rate
    kept_or_random = np.where(draw < random_rate, random_ids, labels)
    new = np.where(
        draw < mask_rate, tokenizer.token_to_id("[MASK]"), kept_or_random
    )
    masked = ids.copy()
    row, column = np.nonzero(weights)
    masked[row, positions[row, column]] = new[row, column]
    x = {**tokens, "token_ids": masked, "mask_positions": positions}
    return x, labels.astype("int32"), weights


def drawn_pairs(preprocessor, pairs, rng):
    """Sentence pairs for the pair objective, packed: `(tokens, labels)`.

    Half of the pairs (drawn from `rng`) keep their second sentence (label
    1); the others get the second sentence of another pair (label 0), as
    BERT's next-sentence prediction draws a random sentence.

    Args:
        preprocessor: A `BertMaskedLMPreprocessor` (its tokenizer and length).
        pairs: `(first, second)`, equally long lists of at least 2 sentences.
        rng: A NumPy `Generator`.
    """
    first, second = np.asarray(pairs[0]), np.asarray(pairs[1])
    rows = len(first)
    if rows < 2:
        raise ValueError(
            f"The pair objective needs at least 2 sentence pairs; the corpus "
            f"has {rows}. Add a sentence-pair task (mrpc, stsb) to --corpus, "
            f"or leave out --pair-objective."
        )
    swapped = rng.random(rows) < 0.5
    other = (np.arange(rows) + rng.integers(1, rows, rows)) % rows  # Not self.
    second = np.where(swapped, second[other], second)
    tokens = pack_corpus(preprocessor, [], (list(first), list(second)))
    return tokens, (~swapped).astype("int32")


def epoch_examples(tokens, preprocessor, rng, pairs=None):
    """One epoch's masked examples (`mask_tokens`), with the pair objective.

    Args:
        tokens: Packed rows (`pack_corpus`): the whole corpus, or with
            `pairs`, the single sentences only.
        preprocessor: The `BertMaskedLMPreprocessor`.
        rng: A NumPy `Generator`.
        pairs: `None`, or `(first, second)`: the sentence pairs, drawn anew
            (`drawn_pairs`) and put after `tokens`.

    Returns:
        `(x, y, sample_weight)` as `mask_tokens` returns them; with
        `pairs`, `y` and `sample_weight` are dicts `{"mlm": ..., "pair":
        ...}`, the pair weight 0 for single sentences.
    """
    if pairs is None:
        return mask_tokens(tokens, preprocessor, rng)
    pair_tokens, labels = drawn_pairs(preprocessor, pairs, rng)
    singles = len(tokens["token_ids"])
    tokens = {k: np.concatenate([v, pair_tokens[k]]) for k, v in tokens.items()}
    x, y, weights = mask_tokens(tokens, preprocessor, rng)
    pair_labels = np.concatenate([np.zeros(singles, "int32"), labels])
    pair_weights = np.repeat(np.float32([0, 1]), [singles, len(labels)])
    y = {"mlm": y, "pair": pair_labels}
    return x, y, {"mlm": weights, "pair": pair_weights}


def length_batches(x, y, sample_weight, batch_size, rng, multiple=16):
    """Batches of rows of similar length, cut to it, in a random order.

    Rows are grouped by their length rounded up to `multiple` (most of the
    corpus is short SST-2 phrases: cutting the padding makes a step 2-3x
    cheaper), shuffled within each group, cut into full batches (the rest
    of a group is left out of this epoch), and the batches shuffled.

    Yields:
        `(x, y, sample_weight)` of one batch (`y` and `sample_weight` arrays,
        or dicts of them).
    """
    lengths = -(-x["padding_mask"].sum(axis=1) // multiple) * multiple
    batches = []
    for length in np.unique(lengths):
        rows = rng.permutation(np.flatnonzero(lengths == length))
        for start in range(0, len(rows) - batch_size + 1, batch_size):
            batches.append((rows[start : start + batch_size], length))
    order = rng.permutation(len(batches))
    for index in order:
        rows, length = batches[index]
        cut = {
            k: v[rows] if k == "mask_positions" else v[rows, :length]
            for k, v in x.items()
        }
        yield cut, *keras.tree.map_structure(
            lambda v: v[rows], (y, sample_weight)
        )


def masked_language_model(args, vocabulary_size):
    """The lab's `BertMaskedLM`, compiled: AdamW, warmup, loss per token.

    On a new small BERT, or on the backbone of `args.from_preset`. With
    `args.pair_objective`, a functional model of the same backbone and
    masked-LM head with a second output, `"pair"`: a `Dense(2)` on the
    pooled output (outputs `{"mlm": ..., "pair": ...}`, losses summed).

    Returns:
        `(model, backbone)`.
    """
    import keras_hub

    from keras_isobn.optimizers import fine_tuning_adamw

    if args.from_preset:
        backbone = keras_hub.models.BertBackbone.from_preset(args.from_preset)
    else:
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=vocabulary_size,
            num_layers=args.layers,
            num_heads=args.heads,
            hidden_dim=args.width,
            intermediate_dim=4 * args.width,
            max_sequence_length=args.sequence_length,
        )
    if getattr(args, "train_top_layers", None) is not None:
        freeze_below(backbone, args.train_top_layers)
    masked_lm = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
    loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight"
    )  # Per masked token (per pair).
    metrics = [keras.metrics.SparseCategoricalAccuracy("accuracy")]
    if args.pair_objective:
        features = backbone(backbone.input)
        pair = keras.layers.Dense(
            2,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            name="pair_head",
        )(features["pooled_output"])
        mask_positions = masked_lm.input["mask_positions"]
        mlm = masked_lm.masked_lm_head(
            features["sequence_output"], mask_positions
        )
        inputs = {**backbone.input, "mask_positions": mask_positions}
        masked_lm = keras.Model(inputs, {"mlm": mlm, "pair": pair})
        loss = {"mlm": loss, "pair": loss}
        pair_accuracy = keras.metrics.SparseCategoricalAccuracy("accuracy")
        metrics = {"mlm": metrics, "pair": [pair_accuracy]}
    optimizer = fine_tuning_adamw(
        args.learning_rate,
        total_steps=args.steps,
        warmup_ratio=0.06,
        weight_decay=0.01,
        epsilon=1e-6,
    )
    masked_lm.compile(optimizer=optimizer, loss=loss, weighted_metrics=metrics)
    return masked_lm, backbone


def _check_top_layers(top_layers, num_layers):
    if not 0 <= top_layers <= num_layers:
        raise ValueError(
            f"--train-top-layers must be in [0, {num_layers}], the "
            f"backbone's transformer layers. Received: {top_layers}"
        )


def freeze_below(backbone, top_layers):
    """Freezes a BERT backbone but its top `top_layers` and its pooler.

    The embeddings (with them the masked-LM head's tied output projection)
    and the lower transformer layers keep their weights; the top
    `top_layers` transformer layers and `pooled_dense` train, as do the
    heads put on the backbone.

    Args:
        backbone: A `keras_hub.models.BertBackbone`.
        top_layers: Integer in `[0, num_layers]`.
    """
    num_layers = backbone.num_layers
    _check_top_layers(top_layers, num_layers)
    trained = {"pooled_dense"} | {
        f"transformer_layer_{i}"
        for i in range(num_layers - top_layers, num_layers)
    }
    for layer in backbone.layers:
        if layer.weights and layer.name not in trained:
            layer.trainable = False


def curve_point(model, backbone, held_out, held_tokens, start, logs, **values):
    """One row of the curve.

    `values`; the mean of each loss and metric over the training batches'
    `logs` since the last row (`train_<name>`, NaN at step 0; the pair
    objective's weighted by the batches' pairs, as most batches have none)
    and on the held-out rows (`held_out_<name>`, one batch, so that the
    pair loss is a mean over pairs); the anisotropy of the held-out
    sentences' [CLS] and pooled output (unmasked); the seconds elapsed since
    `start`.
    """
    from experiments.anisotropy_lab.anisotropy import measure

    held = model.evaluate(
        *held_out[:2],
        sample_weight=held_out[2],
        batch_size=len(held_out[0]["token_ids"]),
        verbose=0,
        return_dict=True,
    )
    outputs = backbone.predict(held_tokens, batch_size=256, verbose=0)
    sides = {
        "cls": outputs["sequence_output"][:, 0],
        "pooled": outputs["pooled_output"],
    }
    held = {k: held[k] for k in sorted(held, key=lambda k: (k != "loss", k))}
    row = dict(values)
    for key in held:
        weights = [log.get("pairs", 1) if "pair" in key else 1 for log in logs]
        row[f"train_{key}"] = (
            np.average([log[key] for log in logs], weights=weights)
            if sum(weights)
            else float("nan")
        )
    row.update({f"held_out_{key}": value for key, value in held.items()})
    for side, x in sides.items():
        m = measure(np.asarray(x, dtype="float64"))
        for key in ("ev1", "ev3", "std_p95_p5", "correlated_share"):
            row[f"{side}_{key}"] = m[key]
    row["elapsed_s"] = time.time() - start
    return row


def train(model, backbone, next_epoch, held, rng, args, start):
    """`args.steps` steps, freshly masked each epoch; the learning curve.

    Args:
        next_epoch: Callable returning the next epoch's `(x, y,
            sample_weight)`, as `epoch_examples` does.
        held: `(held_out, held_tokens)`: the held-out examples and their
            unmasked rows.
        args: With `steps`, `batch_size`, `log_every` and optionally
            `minutes`: training stops early, at a curve point, once that
            much time has passed since `start`.

    Returns:
        `(curve, epochs_started)`: the rows of `curve_point` at step 0 and
        every `args.log_every` steps.
    """
    point = functools.partial(curve_point, model, backbone, *held, start)
    curve = [point([], step=0, epoch=0)]
    logs, step, epoch, late = [], 0, 0, False
    minutes = getattr(args, "minutes", None)
    while step < args.steps and not late:
        x, y, weights = next_epoch()
        for batch in length_batches(x, y, weights, args.batch_size, rng):
            log = model.train_on_batch(
                batch[0], batch[1], sample_weight=batch[2], return_dict=True
            )
            if isinstance(batch[2], dict):
                log["pairs"] = np.sum(batch[2]["pair"])
            logs.append(log)
            step += 1
            late = bool(minutes) and time.time() - start > 60 * minutes
            if step % args.log_every and step < args.steps and not late:
                continue
            curve.append(point(logs, step=step, epoch=epoch))
            logs = []
            values = ", ".join(f"{k} {v:.4g}" for k, v in curve[-1].items())
            print(f"[lab] {values}", flush=True)
            if step == args.steps or late:
                break
        epoch += 1
    return curve, epoch


def pretrain(args):
    """Builds the vocabulary, pretrains the masked LM, writes the preset.

    Args:
        args: The parsed `pretrain` command line (see `command_line.py`).

    Returns:
        The summary written to `pretraining.json` in `args.output`.
    """
    import keras_hub

    start = time.time()
    if args.train_top_layers is not None:  # Refused before the corpus is read.
        num_layers = args.layers
        if args.from_preset:
            num_layers = keras_hub.models.BertBackbone.from_preset(
                args.from_preset, load_weights=False
            ).num_layers
        _check_top_layers(args.train_top_layers, num_layers)
    os.makedirs(args.output, exist_ok=True)
    singles, pairs = read_corpus(args.glue_dir, "train", args.corpus)
    print(
        f"[lab] corpus: {len(singles)} sentences, {len(pairs[0])} pairs "
        f"(train splits of {', '.join(args.corpus)})",
        flush=True,
    )
    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    if args.from_preset:
        tokenizer = keras_hub.models.BertTokenizer.from_preset(args.from_preset)
    else:
        vocabulary = word_piece_vocabulary(singles, pairs, args.vocabulary_size)
        tokenizer = keras_hub.models.BertTokenizer(vocabulary, lowercase=True)
    preprocessor = keras_hub.models.BertMaskedLMPreprocessor(
        tokenizer,
        sequence_length=args.sequence_length,
        mask_selection_rate=0.15,
        mask_selection_length=args.mask_length,
    )
    # With the pair objective, pairs are drawn and packed anew each epoch.
    drawn = pairs if args.pair_objective else None
    tokens = pack_corpus(preprocessor, singles, ([], []) if drawn else pairs)
    held_singles, held_pairs = read_corpus(
        args.glue_dir, "validation", args.corpus
    )
    held_singles = held_singles[: args.held_out]
    held_pairs = [pair[: args.held_out // 4] for pair in held_pairs]
    held_tokens = pack_corpus(preprocessor, held_singles, held_pairs)
    held_out = epoch_examples(
        (
            pack_corpus(preprocessor, held_singles, ([], []))
            if drawn
            else held_tokens
        ),
        preprocessor,
        np.random.default_rng(args.seed + 1),
        held_pairs if drawn else None,
    )
    print(
        f"[lab] vocabulary {tokenizer.vocabulary_size()} tokens; "
        f"{args.steps} steps of {args.batch_size} "
        f"({time.time() - start:.0f} s so far)",
        flush=True,
    )

    model, backbone = masked_language_model(args, tokenizer.vocabulary_size())
    curve, epochs = train(
        model,
        backbone,
        lambda: epoch_examples(tokens, preprocessor, rng, drawn),
        (held_out, held_tokens),
        rng,
        args,
        start,
    )
    tokenizer.save_to_preset(args.output)
    corpus_tokens = tokens["padding_mask"].sum()
    if drawn:
        pair_tokens = pack_corpus(preprocessor, [], pairs)
        corpus_tokens += pair_tokens["padding_mask"].sum()
    corpus = {
        "sentences": len(singles),
        "pairs": len(pairs[0]),
        "tasks": list(args.corpus),
        "split": "train",
        "tokens": int(corpus_tokens),
    }
    held = {"rows": len(held_tokens["token_ids"]), "split": "validation"}
    return write_preset(
        args,
        backbone,
        curve,
        start,
        corpus=corpus,
        held_out=held,
        epochs_started=epochs,
    )


def write_preset(args, backbone, curve, start, **summary):
    """Saves the backbone in `args.output` with the curve and summary.

    Writes the backbone's part of the KerasHub preset (`save_to_preset`; the
    caller adds the tokenizer's), `pretraining.csv` (the `curve` rows) and
    `pretraining.json`: `summary`, the settings (`args` but paths; the
    shape options only if the backbone was built from them), the
    backbone's shape, the last curve row, the wall time since `start` and
    the environment.

    Returns:
        The summary written.
    """
    backbone.save_to_preset(args.output)
    with open(os.path.join(args.output, "pretraining.csv"), "w") as file:
        writer = csv.DictWriter(file, fieldnames=list(curve[0]))
        writer.writeheader()
        writer.writerows(curve)
    skipped = ("command", "glue_dir", "output", "bundle")
    if getattr(args, "from_preset", None):  # The shape is the preset's.
        skipped += ("vocabulary_size", "layers", "heads", "width")
    shape = ("num_layers", "num_heads", "hidden_dim", "intermediate_dim")
    config = backbone.get_config()
    summary = {
        **summary,
        "vocabulary_size": config["vocabulary_size"],
        "settings": {k: v for k, v in vars(args).items() if k not in skipped},
        "backbone": {k: config[k] for k in shape},
        "parameters": backbone.count_params(),
        "final": curve[-1],
        "wall_time_s": time.time() - start,
        "environment": harness.environment(),
    }
    harness.write_json(os.path.join(args.output, "pretraining.json"), summary)
    print(
        f"[lab] wrote the preset {args.output} "
        f"({summary['wall_time_s'] / 60:.1f} min)",
        flush=True,
    )
    return summary
