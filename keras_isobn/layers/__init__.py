from keras_isobn.layers.iso_batch_normalization import IsoBatchNormalization

__all__ = ["IsoBatchNormalization"]
