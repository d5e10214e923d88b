"""What the tests share: tiny models and data, references, worker scripts.

- `tiny_models`: tiny KerasHub backbones, preprocessors and sentences.
- `numpy_isobn`: `NumpyIsoBN`, IsoBN in float64 NumPy.
- `small_models`, `scored_training`, `probe_models`: small Keras models and
  the data and callbacks that several test modules train them with.
- `distribution_worker`, `kill_worker`: scripts that tests run in other
  processes, as `python -m tests.helpers.<name>` from the repository root.
"""
