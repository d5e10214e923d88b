"""keras-isobn: Isotropic Batch Normalization (IsoBN) for Keras 3."""

from keras_isobn.layers import IsoBatchNormalization

__version__ = "0.1.0"
