"""The lab's command line: `pretrain`, `anisotropy`, `experiment`, `tables`.

Run as `python -m experiments.anisotropy_lab COMMAND ...` from the
repository root; `--help` lists each command's options.
"""

import argparse
import sys

from experiments import anisotropy_lab
from experiments.anisotropy_lab import anisotropy
from experiments.anisotropy_lab import fine_tuning
from experiments.anisotropy_lab import gpu_pretraining
from experiments.anisotropy_lab import pretraining

__all__ = ["parse_args", "main"]


def _add_corpus_options(parser, sequence_length, mask_length):
    """The corpus and masking options of `pretrain` and `bundle`."""
    parser.add_argument("--glue-dir", required=True)
    parser.add_argument(
        "--corpus",
        nargs="+",
        default=list(pretraining.CORPUS_TASKS),
        help="Tasks whose training sentences make the corpus.",
    )
    parser.add_argument(
        "--pair-objective",
        action="store_true",
        help="Also train the pooler, as BERT's next-sentence prediction "
        "does: real sentence pairs against pairs with a drawn second "
        "sentence, from the pooled output.",
    )
    parser.add_argument("--vocabulary-size", type=int, default=8192)
    parser.add_argument("--sequence-length", type=int, default=sequence_length)
    parser.add_argument(
        "--mask-length",
        type=int,
        default=mask_length,
        help="At most this many masked tokens per sequence.",
    )
    parser.add_argument(
        "--held-out",
        type=int,
        default=1024,
        help="Held-out dev sentences (and a quarter as pairs).",
    )
    parser.add_argument("--seed", type=int, default=0)


def _add_training_options(parser, shape, batch_size, steps, rate, log_every):
    """The model and training options of `pretrain` and `pretrain-bundle`."""
    for name, default in zip(("layers", "heads", "width"), shape):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--learning-rate", type=float, default=rate)
    parser.add_argument("--log-every", type=int, default=log_every)


def _add_pretrain(commands):
    p = commands.add_parser("pretrain", help="Pretrain and write a preset.")
    p.add_argument("--output", required=True, help="The preset folder.")
    p.add_argument(
        "--from-preset",
        help="Continue the masked-LM training of this BERT preset (e.g. "
        "MiniLM's folder), on its own vocabulary, with a fresh masked-LM "
        "head, instead of a new small BERT (--vocabulary-size, --layers, "
        "--heads and --width are then the preset's).",
    )
    p.add_argument(
        "--train-top-layers",
        type=int,
        help="Train only this many top transformer layers, with the pooler "
        "and the heads; the embeddings and the layers below keep their "
        "weights (default: train all).",
    )
    _add_corpus_options(p, sequence_length=64, mask_length=10)
    _add_training_options(p, (4, 4, 256), 128, 2000, 1e-3, 100)


def _add_bundle(commands):
    b = commands.add_parser(
        "bundle",
        help="Build the bundle that pretrain-bundle runs from on a GPU host.",
    )
    b.add_argument("--output", required=True, help="A new folder.")
    _add_corpus_options(b, sequence_length=128, mask_length=20)
    b.add_argument(
        "--epochs", type=int, default=16, help="Epochs of masks drawn."
    )
    b.add_argument(
        "--no-wheels",
        action="store_true",
        help="No wheels (the host has keras and keras-hub).",
    )
    b.add_argument(
        "--python-version", default="3.12", help="The GPU host's Python."
    )
    b.add_argument("--max-mb", type=float, default=60.0)


def _add_pretrain_bundle(commands):
    g = commands.add_parser(
        "pretrain-bundle",
        help="Pretrain a new BERT on a bundle (no TensorFlow needed).",
    )
    g.add_argument("bundle", help="The folder `bundle` wrote.")
    g.add_argument("--output", required=True, help="The preset folder.")
    _add_training_options(g, (6, 6, 384), 256, 6000, 5e-4, 500)
    g.add_argument(
        "--minutes",
        type=float,
        default=7.0,
        help="Stop (at a curve point) once this much time has passed.",
    )
    g.add_argument("--seed", type=int, default=0)


def _add_anisotropy(commands):
    a = commands.add_parser("anisotropy", help="Measure the embeddings.")
    a.add_argument("--preset", required=True)
    a.add_argument("--glue-dir", required=True)
    a.add_argument("--output", required=True)
    a.add_argument("--task", nargs="+", default=list(anisotropy.EVAL_TASKS))
    a.add_argument("--sequence-length", type=int, default=64)
    a.add_argument(
        "--name", default="lab, pretrained", help="The preset's name in tables."
    )


def _add_fine_tuning(commands, name):
    help_text = {
        "experiment": "Fine-tune tasks x norms x seeds, then the tables "
        "(arguments after -- go to recipes/glue.py).",
        "tables": "Only the tables, of the runs there are.",
    }[name]
    e = commands.add_parser(name, help=help_text)
    e.add_argument(
        "--runs",
        required=True,
        help="The recipe's --output-dir (or, for tables, a runs.jsonl).",
    )
    e.add_argument("--output", required=True, help="Tables go here.")
    if name == "experiment":
        e.add_argument("--preset", required=True)
        e.add_argument("--glue-dir", required=True)
        e.add_argument("--task", nargs="+", default=list(anisotropy.EVAL_TASKS))
        e.add_argument("--norm", nargs="+", default=list(fine_tuning.NORMS))
        e.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])


def parse_args(argv=None):
    """Parses a lab command line.

    Args:
        argv: List of strings; `sys.argv[1:]` if `None`.

    Returns:
        `(args, recipe_args)`: the parsed arguments before `--`, and the
        list of strings after it (for the recipe).
    """
    parser = argparse.ArgumentParser(
        prog="python -m experiments.anisotropy_lab",
        description=anisotropy_lab.__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _add_pretrain(commands)
    _add_bundle(commands)
    _add_pretrain_bundle(commands)
    _add_anisotropy(commands)
    for name in ("experiment", "tables"):
        _add_fine_tuning(commands, name)
    argv = sys.argv[1:] if argv is None else list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def main(argv=None):
    """Runs one lab command.

    Args:
        argv: List of strings, as on the command line.

    Returns:
        What the command returns: the pretraining summary, the anisotropy
        payload, or the tables and paired comparison.
    """
    args, recipe_args = parse_args(argv)
    if args.command == "experiment":
        return fine_tuning.experiment(args, recipe_args)
    commands = {
        "pretrain": pretraining.pretrain,
        "bundle": gpu_pretraining.bundle,
        "pretrain-bundle": gpu_pretraining.pretrain_bundle,
        "anisotropy": anisotropy.anisotropy,
        "tables": fine_tuning.tables,
    }
    return commands[args.command](args)
