"""Issue 27: a `jit_compile=True` PyTorch train step of a tiny BERT classifier.

Usage, from the repository root (`DYNAMO_BACKEND=eager` traces with dynamo
only, `inductor` is what `jit_compile=True` really uses):

    KERAS_BACKEND=torch DYNAMO_BACKEND=eager python -m \\
        experiments.reproductions.torch_compile_repro plain|isobn \\
        float32|mixed_float16 adamw|ft|sgd

Prints `OK ...` or `FAIL <error type> <message>` (the traceback goes to
`torch_compile_<case>.txt` in the working folder).
"""

import functools
import os
import sys
import time
import traceback

import keras
import keras_hub
import numpy as np
import torch

from keras_isobn.models import IsoBNBertTextClassifier
from keras_isobn.optimizers import fine_tuning_adamw
from tests.helpers import tiny_models

__all__ = ["classifier", "optimizer", "main"]


def classifier(model):
    """A tiny BERT classifier, with IsoBN (`"isobn"`) or without."""
    backbone = tiny_models.bert_backbone()
    if model == "isobn":
        return IsoBNBertTextClassifier(
            backbone=backbone,
            num_classes=2,
            preprocessor=None,
            normalization="isobn",
        )
    return keras_hub.models.BertTextClassifier(
        backbone=backbone, num_classes=2, preprocessor=None
    )


def optimizer(name):
    """`"ft"`: keras-isobn's fine-tuning AdamW; `"adamw"`: Keras's; SGD."""
    if name == "ft":
        return fine_tuning_adamw(1e-4, total_steps=1000)
    if name == "adamw":
        return keras.optimizers.AdamW(1e-4)
    return keras.optimizers.SGD(1e-2)


def main(model, dtype, opt):
    backend = os.environ.get("DYNAMO_BACKEND", "eager")
    torch.compile = functools.partial(torch.compile, backend=backend)
    keras.mixed_precision.set_global_policy(dtype)
    keras.utils.set_random_seed(0)
    clf = classifier(model)
    clf.compile(
        optimizer=optimizer(opt),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(0, 30, (4, 16)).astype("int32"),
        "segment_ids": np.zeros((4, 16), "int32"),
        "padding_mask": np.ones((4, 16), "int32"),
    }
    y = rng.integers(0, 2, (4,)).astype("int32")
    start = time.time()
    try:
        for _ in range(2):
            loss = clf.train_on_batch(x, y)
        print("OK", model, dtype, opt, f"{time.time() - start:.1f}s", loss)
    except Exception as error:
        message = str(error).splitlines()[0][:300]
        print("FAIL", model, dtype, opt, type(error).__name__, message)
        path = f"torch_compile_{model}_{dtype}_{opt}.txt"
        with open(path, "w") as file:
            file.write(traceback.format_exc())


if __name__ == "__main__":
    main(*sys.argv[1:4])
