"""Experiments with IsoBN: questions answered once, with their results.

Each experiment is a package with its command (`python -m experiments.NAME`),
its README (what it asks, how it was run, what the numbers show) and its
`results/` folder. `experiments/README.md` lists them. Unlike `benchmarks/`,
nothing here is rerun to track a goal: a result is kept as measured.
"""
