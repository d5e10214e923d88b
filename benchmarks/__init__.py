"""Benchmarks of keras-isobn: layer cost, end to end, imports, GPU.

Run the whole suite with `python -m benchmarks` (see `--help`); each
script also runs alone, e.g. `python -m benchmarks.layer_cost --help`.
Results land in `benchmarks/results/`, summarised in its `README.md`.
"""
