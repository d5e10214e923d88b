"""Reproductions of engine behaviour that keras-isobn's design rests on.

Each script reproduces one behaviour of Keras, TensorFlow, JAX or PyTorch
that a choice of the library answers (an error it raises, a guard it adds),
with the output of a run beside it (`<name>.md`). Run them from the
repository root as `python -m experiments.reproductions.<name>`.
"""
