"""The lab's command line: `pretrain`, `anisotropy`, `experiment`, `tables`.

Run as `python -m experiments.anisotropy_lab COMMAND ...` from the
repository root; `--help` lists each command's options.
"""

import argparse
import sys

from experiments import anisotropy_lab
from experiments.anisotropy_lab import anisotropy
from experiments.anisotropy_lab import fine_tuning
from experiments.anisotropy_lab import pretraining

__all__ = ["parse_args", "main"]


def _add_pretrain(commands):
    p = commands.add_parser("pretrain", help="Pretrain and write a preset.")
    p.add_argument("--glue-dir", required=True)
    p.add_argument("--output", required=True, help="The preset folder.")
    p.add_argument(
        "--corpus",
        nargs="+",
        default=list(pretraining.CORPUS_TASKS),
        help="Tasks whose training sentences make the corpus.",
    )
    p.add_argument(
        "--from-preset",
        help="Continue the masked-LM training of this BERT preset (e.g. "
        "MiniLM's folder), on its own vocabulary, with a fresh masked-LM "
        "head, instead of a new small BERT (--vocabulary-size, --layers, "
        "--heads and --width are then the preset's).",
    )
    p.add_argument("--vocabulary-size", type=int, default=8192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--sequence-length", type=int, default=64)
    p.add_argument(
        "--mask-length",
        type=int,
        default=10,
        help="At most this many masked tokens per sequence.",
    )
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument(
        "--held-out",
        type=int,
        default=1024,
        help="Held-out dev sentences (and a quarter as pairs).",
    )
    p.add_argument("--seed", type=int, default=0)


def _add_anisotropy(commands):
    a = commands.add_parser("anisotropy", help="Measure the embeddings.")
    a.add_argument("--preset", required=True)
    a.add_argument("--glue-dir", required=True)
    a.add_argument("--output", required=True)
    a.add_argument("--task", nargs="+", default=list(anisotropy.EVAL_TASKS))
    a.add_argument("--sequence-length", type=int, default=64)


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
        "anisotropy": anisotropy.anisotropy,
        "tables": fine_tuning.tables,
    }
    return commands[args.command](args)
