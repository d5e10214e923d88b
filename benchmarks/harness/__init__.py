"""The harness every benchmark runs on.

A module per concern: `command`, `timing`, `models` and `results`, each
described by its docstring. Importing it loads neither Keras nor a backend.
"""

from benchmarks.harness.command import BACKENDS
from benchmarks.harness.command import add_options
from benchmarks.harness.command import child_environment
from benchmarks.harness.command import command
from benchmarks.harness.command import limit_threads
from benchmarks.harness.command import parse
from benchmarks.harness.command import run
from benchmarks.harness.command import run_module
from benchmarks.harness.command import selected_backends
from benchmarks.harness.models import DTYPES
from benchmarks.harness.models import HF_INPUTS
from benchmarks.harness.models import SHAPES
from benchmarks.harness.models import bert_backbone
from benchmarks.harness.models import embed
from benchmarks.harness.models import hf_bert_config
from benchmarks.harness.models import hf_trainer
from benchmarks.harness.models import load_minilm
from benchmarks.harness.models import minilm_checkpoint
from benchmarks.harness.models import random_batches
from benchmarks.harness.results import REPO_ROOT
from benchmarks.harness.results import environment
from benchmarks.harness.results import goal
from benchmarks.harness.results import goals_table
from benchmarks.harness.results import machine_line
from benchmarks.harness.results import peak_rss_bytes
from benchmarks.harness.results import status
from benchmarks.harness.results import table
from benchmarks.harness.results import us
from benchmarks.harness.results import write_json
from benchmarks.harness.results import write_results
from benchmarks.harness.timing import Phases
from benchmarks.harness.timing import alternate
from benchmarks.harness.timing import jax_state
from benchmarks.harness.timing import paired_ratio
from benchmarks.harness.timing import rate
from benchmarks.harness.timing import steady_rate
from benchmarks.harness.timing import step_clock
from benchmarks.harness.timing import summarize
from benchmarks.harness.timing import time_keras_epochs

__all__ = [
    "BACKENDS", "DTYPES", "HF_INPUTS", "Phases", "REPO_ROOT", "SHAPES",
    "add_options", "alternate", "bert_backbone", "child_environment",
    "command", "embed", "environment", "goal", "goals_table", "hf_bert_config",
    "hf_trainer", "jax_state", "limit_threads", "load_minilm", "machine_line",
    "minilm_checkpoint", "paired_ratio", "parse", "peak_rss_bytes",
    "random_batches", "rate", "run", "run_module", "selected_backends",
    "status", "steady_rate", "step_clock", "summarize", "table",
    "time_keras_epochs", "us", "write_json", "write_results",
]
