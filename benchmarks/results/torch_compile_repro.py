"""Issue 27: one `jit_compile=True` PyTorch train step of a tiny BERT classifier.

Usage (`DYNAMO_BACKEND=eager` traces with dynamo only, `inductor` is what
`jit_compile=True` really uses):

    KERAS_BACKEND=torch DYNAMO_BACKEND=eager python \
        benchmarks/results/torch_compile_repro.py plain|isobn \
        float32|mixed_float16 adamw|ft

Prints `OK ...` or `FAIL <error type> <message>` (the traceback goes to
`torch_compile_<case>.txt` in the working folder).
"""
import functools
import os
import sys
import time
import traceback

import keras, numpy as np, keras_hub, torch
BACKEND = os.environ.get("DYNAMO_BACKEND", "eager")
torch.compile = functools.partial(torch.compile, backend=BACKEND)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from keras_isobn.optimizers import fine_tuning_adamw
from tests.models import tiny

model, dtype, opt = sys.argv[1:4]
keras.mixed_precision.set_global_policy(dtype)
keras.utils.set_random_seed(0)
bb = tiny.bert_backbone()
if model == "isobn":
    from keras_isobn.models import IsoBNBertTextClassifier
    clf = IsoBNBertTextClassifier(backbone=bb, num_classes=2, preprocessor=None, normalization="isobn")
else:
    clf = keras_hub.models.BertTextClassifier(backbone=bb, num_classes=2, preprocessor=None)
optimizer = fine_tuning_adamw(1e-4, total_steps=1000) if opt == "ft" else (keras.optimizers.AdamW(1e-4) if opt == "adamw" else keras.optimizers.SGD(1e-2))
clf.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
rng = np.random.default_rng(0)
x = {"token_ids": rng.integers(0, 30, (4, 16)).astype("int32"), "segment_ids": np.zeros((4, 16), "int32"), "padding_mask": np.ones((4, 16), "int32")}
y = rng.integers(0, 2, (4,)).astype("int32")
t = time.time()
try:
    for _ in range(2):
        loss = clf.train_on_batch(x, y)
    print("OK", model, dtype, opt, f"{time.time()-t:.1f}s", loss)
except Exception as e:
    lines = traceback.format_exc().splitlines()
    print("FAIL", model, dtype, opt, type(e).__name__, str(e).splitlines()[0][:300])
    open(f"torch_compile_{model}_{dtype}_{opt}.txt", "w").write(traceback.format_exc())
