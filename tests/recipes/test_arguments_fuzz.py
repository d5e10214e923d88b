"""Random command lines: `parse_args` parses them or exits as argparse
does (status 2, one message), never with another exception."""

import contextlib
import io

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from recipes import glue as recipe

OPTIONS = [
    *("--task", "--preset", "--data-dir", "--norm", "--momentum"),
    *("--epsilon", "--beta", "--bias-correction", "--dropout"),
    *("--max-sequence-length", "--epochs", "--batch-size"),
    *("--learning-rate", "--warmup-ratio", "--weight-decay"),
    *("--adam-epsilon", "--patience", "--seeds", "--train-limit"),
    *("--output-dir", "--mixed-precision", "--no-mixed-precision"),
    *("--jit-compile", "--distribution", "--restart", "--no-report"),
    *("--verbose", "--tfds-data-dir", "--help", "--"),
]
VALUES = [
    *("sst2", "stsb", "rte", "mnli", "nope", "isobn", "none", "batchnorm"),
    *("0", "1", "-1", "3", "1e-3", "nan", "inf", "-inf", "1.5", "", " "),
    *("data_parallel", "multi_worker", "x", "--", "-", "=", "é", "\x00"),
]
TOKENS = st.one_of(
    st.sampled_from(OPTIONS),
    st.sampled_from(VALUES),
    st.builds(
        lambda option, value: f"{option}={value}",
        st.sampled_from(OPTIONS),
        st.sampled_from(VALUES),
    ),
    st.text(max_size=8),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(TOKENS, max_size=8))
def test_parse_args_parses_or_exits_with_a_message(argv):
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            args = recipe.parse_args(argv)
    except SystemExit as exit:
        if exit.code == 0:  # --help
            assert "usage:" in out.getvalue()
        else:
            assert exit.code == 2
            assert "error:" in err.getvalue(), argv
        return
    assert args.task and args.norm and args.seeds
    assert all(name in recipe.NORMS for name in args.norm)
    assert args.epochs >= 1 and args.batch_size >= 1
