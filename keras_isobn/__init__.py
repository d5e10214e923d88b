"""keras-isobn: Isotropic Batch Normalization (IsoBN) for Keras 3."""

from keras_isobn import isotropy
from keras_isobn import models
from keras_isobn import plots
from keras_isobn.callbacks import EVkCallback
from keras_isobn.isotropy import clustered_correlation
from keras_isobn.isotropy import explained_variance
from keras_isobn.isotropy import feature_std
from keras_isobn.isotropy import logit_variance_share
from keras_isobn.isotropy import optimal_logit_variance_share
from keras_isobn.layers import IsoBatchNormalization

__version__ = "0.1.0"
