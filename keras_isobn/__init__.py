"""keras-isobn: Isotropic Batch Normalization (IsoBN) for Keras 3.

`import keras_isobn` loads Keras and NumPy only. The submodules that need
more (`models` and `export`: KerasHub and TensorFlow; `glue`: TFDS, SciPy
and scikit-learn when used; `plots`: matplotlib) load on first access, e.g.
`keras_isobn.models` or `from keras_isobn import glue`.
"""

import importlib

from keras_isobn import runtime

runtime.quiet_startup()  # Before Keras is imported: see keras_isobn.runtime.

from keras_isobn import optimizers  # Registers the schedule saved models use.
from keras_isobn.callbacks import EVkCallback
from keras_isobn.layers import IsoBatchNormalization

__version__ = "0.1.0"

_SUBMODULES = (
    "batching",
    "callbacks",
    "distribution",
    "export",
    "files",
    "glue",
    "isotropy",
    "launch",
    "layers",
    "mixed_precision",
    "models",
    "optimizers",
    "plots",
    "run_directory",
    "runtime",
    "tokenization",
)
__all__ = ["EVkCallback", "IsoBatchNormalization", *_SUBMODULES]


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__ + ["__version__"])
