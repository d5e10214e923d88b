"""The lab's pretraining on a bare GPU host, from a bundle built here.

A GPU host has JAX but no TensorFlow (which KerasHub's tokenizers need),
Keras, KerasHub or network. `bundle` (on a CPU machine) therefore does all
that needs them: the WordPiece vocabulary, the packing and `--epochs`
epochs of seeded masks (`pretraining.epoch_examples`, with the pair
objective if asked), stored compactly (unpadded, 8- and 16-bit integers)
in `corpus.npz`, beside the tokenizer's half of a KerasHub preset, the
wheels the host lacks and `manifest.json` (<= `--max-mb`).
`pretrain-bundle` (on the host, `import tensorflow` never needed) trains
a new `BertBackbone` on those epochs (again from the first once all are
used), with the lab's curve, and writes the preset: the backbone's half
and the bundle's tokenizer.
"""

import itertools
import json
import os
import shutil
import time

import keras
import numpy as np

from experiments.anisotropy_lab import pretraining

__all__ = [
    "pack_epoch",
    "unpadded",
    "padded",
    "unpack_epoch",
    "bundle",
    "pretrain_bundle",
]


def pack_epoch(x, y, sample_weight):
    """One epoch's examples as compact arrays (`unpack_epoch` inverts it).

    Token and segment ids are kept for the unpadded positions only, ids as
    16-bit integers (vocabularies < 65,536 tokens), the rest as 8-bit.
    """
    pairs = isinstance(y, dict)
    labels, weights = (
        (y["mlm"], sample_weight["mlm"]) if pairs else (y, sample_weight)
    )
    packed = {
        **unpadded(x),
        "mask_positions": x["mask_positions"].astype("uint8"),
        "labels": labels.astype("uint16"),
        "weights": weights.astype("uint8"),
    }
    if pairs:
        packed["pair_labels"] = y["pair"].astype("uint8")
        packed["pair_weights"] = sample_weight["pair"].astype("uint8")
    return packed


def unpadded(x):
    """BERT inputs as `"lengths"` and the unpadded token and segment ids."""
    present = x["padding_mask"].astype(bool)
    return {
        "lengths": present.sum(axis=1).astype("uint8"),
        "token_ids": x["token_ids"][present].astype("uint16"),
        "segment_ids": x["segment_ids"][present].astype("uint8"),
    }


def padded(packed, sequence_length):
    """The packed rows (`"lengths"`, unpadded ids) as int32 BERT inputs;
    the inverse of `unpadded`."""
    present = np.arange(sequence_length) < packed["lengths"][:, None]
    x = {"padding_mask": present.astype("int32")}
    for key in ("token_ids", "segment_ids"):
        x[key] = np.zeros(present.shape, "int32")
        x[key][present] = packed[key]
    return x


def unpack_epoch(packed, sequence_length):
    """`(x, y, sample_weight)` of `pack_epoch`'s arrays, int32 and float32."""
    x = padded(packed, sequence_length)
    x["mask_positions"] = packed["mask_positions"].astype("int32")
    y = packed["labels"].astype("int32")
    weights = packed["weights"].astype("float32")
    if "pair_labels" in packed:
        y = {"mlm": y, "pair": packed["pair_labels"].astype("int32")}
        weights = {
            "mlm": weights,
            "pair": packed["pair_weights"].astype("float32"),
        }
    return x, y, weights


def bundle(args):
    """Builds the bundle of the parsed `bundle` command line.

    Returns:
        The manifest written to `manifest.json` in `args.output`.
    """
    import keras_hub

    from benchmarks import gpu_bundle

    gpu_bundle.new_folder(args.output)
    singles, pairs = pretraining.read_corpus(
        args.glue_dir, "train", args.corpus
    )
    vocabulary = pretraining.word_piece_vocabulary(
        singles, pairs, args.vocabulary_size
    )
    tokenizer = keras_hub.models.BertTokenizer(vocabulary, lowercase=True)
    preprocessor = keras_hub.models.BertMaskedLMPreprocessor(
        tokenizer,
        sequence_length=args.sequence_length,
        mask_selection_length=args.mask_length,
    )
    drawn = pairs if args.pair_objective else None
    tokens = pretraining.pack_corpus(
        preprocessor, singles, ([], []) if drawn else pairs
    )
    rng = np.random.default_rng(args.seed)
    arrays = {}
    for epoch in range(args.epochs):
        examples = pretraining.epoch_examples(tokens, preprocessor, rng, drawn)
        for key, value in pack_epoch(*examples).items():
            arrays[f"epoch{epoch}_{key}"] = value
    held_singles, held_pairs = pretraining.read_corpus(
        args.glue_dir, "validation", args.corpus
    )
    held_singles = held_singles[: args.held_out]
    held_pairs = [pair[: args.held_out // 4] for pair in held_pairs]
    held = pretraining.pack_corpus(preprocessor, held_singles, held_pairs)
    held_out = pretraining.epoch_examples(
        (
            pretraining.pack_corpus(preprocessor, held_singles, ([], []))
            if drawn
            else held
        ),
        preprocessor,
        np.random.default_rng(args.seed + 1),
        held_pairs if drawn else None,
    )
    for key, value in pack_epoch(*held_out).items():
        arrays[f"held_out_{key}"] = value
    for key, value in unpadded(held).items():
        arrays[f"held_tokens_{key}"] = value

    np.savez_compressed(os.path.join(args.output, "corpus.npz"), **arrays)
    tokenizer.save_to_preset(os.path.join(args.output, "tokenizer"))
    wheels = []
    if not args.no_wheels:
        folder = os.path.join(args.output, "wheels")
        wheels = gpu_bundle.download_wheels(folder, args.python_version)
    manifest = {
        "bundle": "keras-isobn anisotropy lab pretraining",
        "corpus": {
            "sentences": len(singles),
            "pairs": len(pairs[0]),
            "tasks": list(args.corpus),
            "split": "train",
            "rows": int(len(arrays["epoch0_lengths"])),
        },
        "held_out_rows": int(len(held["token_ids"])),
        "vocabulary_size": tokenizer.vocabulary_size(),
        "sequence_length": args.sequence_length,
        "mask_length": args.mask_length,
        "epochs": args.epochs,
        "pair_objective": args.pair_objective,
        "seed": args.seed,
        "wheels": wheels,
        "python_version": args.python_version,
    }
    gpu_bundle.write_manifest(
        args.output, manifest, args.max_mb, "fewer --epochs"
    )
    print(
        f"[lab] bundle {args.output}: {manifest['bytes'] / 1e6:.1f} MB, "
        f"{args.epochs} masked epochs of {manifest['corpus']['rows']} rows",
        flush=True,
    )
    return manifest


def pretrain_bundle(args):
    """Pretrains a new BERT on a bundle's epochs and writes the preset.

    Needs Keras, KerasHub and NumPy only (no TensorFlow).

    Returns:
        The summary written to `pretraining.json` in `args.output`.
    """
    start = time.time()
    path = os.path.join(args.bundle, "manifest.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{args.bundle!r} is not a lab bundle (no manifest.json). Build "
            "one on a CPU machine with `python -m experiments.anisotropy_lab "
            "bundle --glue-dir GLUE_DIR --output DIR`."
        )
    with open(path) as file:
        manifest = json.load(file)
    length = manifest["sequence_length"]
    with np.load(os.path.join(args.bundle, "corpus.npz")) as data:
        arrays = {key: data[key] for key in data.files}

    def part(prefix):
        names = [k for k in arrays if k.startswith(prefix)]
        return {k[len(prefix) :]: arrays[k] for k in names}

    held_out = unpack_epoch(part("held_out_"), length)
    held = padded(part("held_tokens_"), length)
    epochs = itertools.count()

    def next_epoch():
        stored = next(epochs) % manifest["epochs"]  # Again from the first.
        return unpack_epoch(part(f"epoch{stored}_"), length)

    os.makedirs(args.output, exist_ok=True)
    keras.utils.set_random_seed(args.seed)
    args.from_preset = None
    args.pair_objective = manifest["pair_objective"]
    args.vocabulary_size = manifest["vocabulary_size"]
    args.sequence_length = length
    model, backbone = pretraining.masked_language_model(
        args, manifest["vocabulary_size"]
    )
    curve, started = pretraining.train(
        model,
        backbone,
        next_epoch,
        (held_out, held),
        np.random.default_rng(args.seed),
        args,
        start,
    )
    tokenizer = os.path.join(args.bundle, "tokenizer")
    for name in os.listdir(tokenizer):
        source, target = (
            os.path.join(d, name) for d in (tokenizer, args.output)
        )
        if os.path.isdir(source):
            shutil.copytree(source, target, dirs_exist_ok=True)
        elif name != "metadata.json":  # The backbone's stays.
            shutil.copy(source, target)
    corpus = dict(manifest["corpus"], masked_epochs_stored=manifest["epochs"])
    return pretraining.write_preset(
        args,
        backbone,
        curve,
        start,
        corpus=corpus,
        held_out={"rows": manifest["held_out_rows"], "split": "validation"},
        epochs_started=started,
        bundle={k: manifest[k] for k in ("bytes", "seed", "wheels", "builder")},
    )
