"""`python -m benchmarks.harness --rewrite-markdown [--results DIR]`.

Rewrites the Markdown beside every benchmark JSON of the results folder
from the JSON alone, so the tables follow the code without a rerun.
"""

import argparse

from benchmarks.harness.results import RESULTS_DIR
from benchmarks.harness.results import rewrite_markdown

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--rewrite-markdown", action="store_true", required=True)
parser.add_argument("--results", default=RESULTS_DIR)
print("\n".join(rewrite_markdown(parser.parse_args().results)))
