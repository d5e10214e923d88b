"""Operations and time per train step of `fine_tuning_adamw` vs Keras's AdamW.

Issue 27: on a GPU with the PyTorch backend, a BERT train step is bound by
kernel launches, so every operation the optimizer adds costs time. For a
randomly initialised `keras_hub.models.BertTextClassifier` of MiniLM's
shape (6 layers, 384 wide, 12 heads, vocabulary 30522), compiled with
each optimizer of `OPTIMIZERS`:

- `keras_adamw`: `keras.optimizers.AdamW(1e-4)`;
- `fine_tuning_adamw`: `keras_isobn.optimizers.fine_tuning_adamw(1e-4,
  total_steps=1000)`;
- `fine_tuning_adamw_before`: the same optimizer as it was before issue 27
  (`LegacyFineTuningAdamW`: a plain subclass of `keras.optimizers.AdamW`,
  which PyTorch updates variable by variable),

it counts the operations of one train step and of one optimizer update,
and times both (medians, the optimizers in alternation):

- PyTorch: the ATen operations the profiler records (`top_level`: those
  Python dispatches; `compute`: the leaves that are not views, metadata
  or allocations, about the kernels a GPU would launch) and the host syncs
  (`aten::_local_scalar_dense`), split by where they happen: backbone
  forward, head forward, loss, backward (the backbone's share from a
  backbone-only backward), loss scaling, optimizer, the rest (metrics,
  bookkeeping). Beside it, the same counts for a Hugging Face
  `transformers.BertForSequenceClassification` of the same shape and batch
  trained as HF Trainer does (`torch.optim.AdamW(foreach=True)`, gradient
  clipping at 1, a linear schedule; float16 by autocast and a
  `GradScaler`).
- JAX: the instructions of the compiled (XLA) train step and optimizer
  update: all of them, those of the entry computation that do work (what a
  GPU launches: fusions, custom calls, copies), and the fusions.
- TensorFlow: the operations of the optimizer update's graph
  (`tf.function`); the train step runs under XLA, whose program Keras does
  not expose, so only its time is measured.

Float32 runs under the `"float32"` policy, float16 under
`"mixed_float16"` (Keras wraps the optimizer in a `LossScaleOptimizer`).

Usage:

```
python -m benchmarks.optimizer_cost                       # all backends
python -m benchmarks.optimizer_cost --backend torch --batch-size 8
python -m benchmarks.optimizer_cost --quick               # tiny model
```
"""

import argparse
import collections
import contextlib
import re
import sys

import keras

from benchmarks import common
from benchmarks.end_to_end import TINY
from benchmarks.end_to_end import random_batches
from benchmarks.layer_cost import DTYPES

OPTIMIZERS = ("keras_adamw", "fine_tuning_adamw", "fine_tuning_adamw_before")
MINILM = dict(
    vocabulary_size=30522,
    num_layers=6,
    num_heads=12,
    hidden_dim=384,
    intermediate_dim=1536,
    max_sequence_length=512,
)
# ATen operations that launch no kernel: views, metadata, allocations.
NO_KERNEL = frozenset(
    "aten::" + name
    for name in (
        "view", "reshape", "_reshape_alias", "_unsafe_view", "permute",
        "transpose", "t", "squeeze", "unsqueeze", "expand", "expand_as",
        "as_strided", "detach", "alias", "empty", "empty_strided",
        "empty_like", "lift_fresh", "slice", "select", "narrow", "unbind",
        "split", "chunk", "resolve_conj", "resolve_neg", "result_type",
        "to", "view_as", "contiguous", "set_", "is_nonzero", "item",
        "_local_scalar_dense", "size", "stride", "numpy_T", "flatten",
        "unflatten", "split_with_sizes", "movedim", "matrix_H", "mT",
    )
)
HOST_SYNC = "aten::_local_scalar_dense"
# A GPU runs a `_foreach_` operation as one kernel per chunk of tensors;
# the CPU, one operation per tensor. Counted as one compute operation.
FOREACH = "aten::_foreach_"
AUTOGRAD = "autograd::engine::evaluate_function"
# `[ROOT] name = type opcode(operands), attributes`, the opcode being the
# first lower-case word followed by a parenthesis.
HLO_INSTRUCTION = re.compile(r"(?:ROOT )?[%\w.-]+ = .*?(?<![\w.])([a-z][\w-]*)\(")


@keras.saving.register_keras_serializable(package="benchmarks")
class LegacyFineTuningAdamW(keras.optimizers.AdamW):
    """`FineTuningAdamW` before issue 27, to measure "before" beside "after".

    A subclass of the public `keras.optimizers.AdamW` class, which Keras's
    PyTorch backend updates variable by variable, and which decays the
    weights (by a factor of exactly 1) when the weight decay is 0.
    """

    def __init__(self, exclude_names=("bias", "gamma", "beta"), **kwargs):
        super().__init__(**kwargs)
        self.exclude_from_weight_decay(var_names=list(exclude_names))


def make_optimizer(name, learning_rate=1e-4, total_steps=1000):
    """The optimizer `name` of `OPTIMIZERS`."""
    from keras_isobn.optimizers import WarmupLinearDecay
    from keras_isobn.optimizers import fine_tuning_adamw

    if name == "keras_adamw":
        return keras.optimizers.AdamW(learning_rate)
    if name == "fine_tuning_adamw":
        return fine_tuning_adamw(learning_rate, total_steps=total_steps)
    if name == "fine_tuning_adamw_before":
        schedule = WarmupLinearDecay(
            learning_rate, total_steps, int(0.06 * total_steps)
        )
        return LegacyFineTuningAdamW(
            learning_rate=schedule, weight_decay=0.0, epsilon=1e-6
        )
    raise ValueError(f"Unknown optimizer {name!r}; choose from {OPTIMIZERS}.")


def make_classifier(shape, optimizer, seed=0):
    """A compiled `BertTextClassifier` of `shape`, weights from `seed`."""
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.BertBackbone(**shape)
    classifier = keras_hub.models.BertTextClassifier(
        backbone=backbone, num_classes=2, preprocessor=None
    )
    classifier.compile(
        optimizer=make_optimizer(optimizer),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=keras.backend.backend() != "torch",
    )
    return classifier


# --- PyTorch: profiler counts ---------------------------------------------


def torch_counts(events, regions=()):
    """ATen operation counts of profiler `events`, by innermost region.

    Args:
        events: `torch.profiler.profile().events()`.
        regions: Names of `record_function` ranges to split by; operations
            of the autograd engine go to `"backward"`, others outside
            every region to `"other"`.

    Returns:
        Dict of region (and `"total"`) to a dict of `top_level`, `compute`
        and `host_syncs` counts.
    """
    counts = collections.defaultdict(collections.Counter)
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        parent, region, nested = event.cpu_parent, None, False
        if parent is not None and parent.name.startswith("aten::"):
            nested = True
        in_foreach = False
        while parent is not None:
            in_foreach |= parent.name.startswith(FOREACH)
            if region is None and parent.name in regions:
                region = parent.name
            elif region is None and parent.name.startswith(AUTOGRAD):
                region = "backward"
            parent = parent.cpu_parent
        if in_foreach:
            continue  # Counted as the one `_foreach_` operation.
        region = region or "other"
        leaf = event.name.startswith(FOREACH) or not any(
            c.name.startswith("aten::") for c in event.cpu_children
        )
        for key in (region, "total"):
            counts[key]["top_level"] += not nested
            counts[key]["compute"] += leaf and event.name not in NO_KERNEL
            counts[key]["host_syncs"] += event.name == HOST_SYNC
    return {k: dict(v) for k, v in counts.items()}


def profile(function):
    """Runs `function()` under the PyTorch profiler; returns its events."""
    import torch

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU]
    ) as profiler:
        function()
    return profiler.events()


@contextlib.contextmanager
def regions(pieces):
    """Wraps methods in named `record_function` ranges, for the profiler.

    Args:
        pieces: Dict of region name to `(object, method name)`; the
            method is replaced on that object only, and put back after.
    """
    import torch

    def wrap(name, method):
        def wrapped(*args, **kwargs):
            with torch.profiler.record_function(name):
                return method(*args, **kwargs)

        return wrapped

    for name, (owner, method) in pieces.items():
        object.__setattr__(owner, method, wrap(name, getattr(owner, method)))
    try:
        yield
    finally:
        for owner, method in pieces.values():
            object.__delattr__(owner, method)


def torch_step_counts(classifier, batch):
    """Counts of one `train_on_batch` step, split by where they happen."""
    x, y = batch
    backbone, optimizer = classifier.backbone, classifier.optimizer
    pieces = {
        "forward": (classifier, "call"),
        "backbone_forward": (backbone, "call"),
        "loss": (classifier, "compute_loss"),
        "optimizer": (optimizer, "apply"),
    }
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        pieces["inner_optimizer"] = (inner, "apply")
    classifier.train_on_batch(x, y)
    with regions(pieces):
        step = torch_counts(
            profile(lambda: classifier.train_on_batch(x, y)), list(pieces)
        )

    def backbone_alone():
        classifier.zero_grad()
        outputs = backbone(x, training=True)
        loss = outputs["pooled_output"].float().sum()
        loss.backward()
        classifier.zero_grad()

    backbone_alone()
    alone = torch_counts(profile(backbone_alone))
    zero = {"top_level": 0, "compute": 0, "host_syncs": 0}
    get = lambda name: dict(zero, **step.get(name, {}))  # noqa: E731
    parts = {
        "backbone_forward": get("backbone_forward"),
        "head_forward": get("forward"),
        "loss": get("loss"),
        "backward": get("backward"),
        "backbone_backward_alone": dict(zero, **alone.get("backward", {})),
        "optimizer": get("inner_optimizer" if inner else "optimizer"),
        "loss_scaling": get("optimizer") if inner else dict(zero),
        "other": get("other"),
        "total": get("total"),
    }
    return parts


def torch_optimizer_counts(optimizer, variables):
    """Counts of one `optimizer.apply` with fixed gradients."""
    import torch

    grads = [torch.full_like(v.value, 1e-3) for v in variables]
    optimizer.apply(grads, variables)
    return torch_counts(profile(lambda: optimizer.apply(grads, variables)))[
        "total"
    ]


def hf_model(shape, seed=0):
    """A randomly initialised `BertForSequenceClassification` of `shape`."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=shape["vocabulary_size"],
        hidden_size=shape["hidden_dim"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"],
        intermediate_size=shape["intermediate_dim"],
        max_position_embeddings=shape["max_sequence_length"],
        num_labels=2,
    )
    return transformers.BertForSequenceClassification(config)


def hf_step(model, batch, float16, total_steps=1000):
    """A function running one train step as HF Trainer does."""
    import torch

    x, y = batch
    inputs = {
        "input_ids": torch.as_tensor(x["token_ids"], dtype=torch.long),
        "token_type_ids": torch.as_tensor(x["segment_ids"], dtype=torch.long),
        "attention_mask": torch.as_tensor(x["padding_mask"], dtype=torch.long),
        "labels": torch.as_tensor(y, dtype=torch.long),
    }
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.0, foreach=True
    )
    warmup = int(0.06 * total_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: s / max(warmup, 1) if s < warmup
        else max(0.0, (total_steps - s) / max(total_steps - warmup, 1)),
    )
    scaler = torch.amp.GradScaler("cpu", enabled=float16)
    model.train()

    def step():
        with torch.profiler.record_function("forward"):
            with torch.autocast("cpu", torch.float16, enabled=float16):
                loss = model(**inputs).loss
        scaled = scaler.scale(loss)
        scaled.backward()
        with torch.profiler.record_function("optimizer"):
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(
                model.parameters(), 1.0, foreach=True
            )
            scaler.step(optimizer)
            scaler.update()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def torch_hf(shape, batch, dtype, steps, warmup):
    """Counts and step time of the HF model; `None` if transformers lacks."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    model = hf_model(shape)
    step = hf_step(model, batch, float16=dtype == "float16")
    step()
    counts = torch_counts(profile(step), ["forward", "optimizer"])
    timed = common.alternate({"hf": lambda _: step()}, steps, warmup)["hf"]
    return {
        "counts": counts,
        "step": common.summarize(timed["times"]),
        "parameters": sum(p.numel() for p in model.parameters()),
        "transformers": transformers.__version__,
    }


# --- JAX: XLA program sizes -----------------------------------------------


def hlo_counts(compiled_text):
    """Instruction counts of a compiled XLA program's text.

    Returns:
        Dict of `instructions` (in all computations), `entry` (the entry
        computation's instructions that do work, about the kernels a GPU
        launches: not parameters, tuples, bitcasts or constants) and
        `fusions` (the entry's fusions).
    """
    idle = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant"}
    total = entry = fusions = 0
    in_entry = False
    for line in compiled_text.splitlines():
        text = line.strip()
        if text.startswith("ENTRY"):
            in_entry = True
            continue
        if text == "}":
            in_entry = False
            continue
        match = HLO_INSTRUCTION.match(text)
        if match is None:
            continue
        total += 1
        if in_entry:
            entry += match.group(1) not in idle
            fusions += match.group(1) == "fusion"
    return {"instructions": total, "entry": entry, "fusions": fusions}


def jax_train_step(classifier, batch):
    """The classifier's compiled JAX train step and its state."""
    import jax

    classifier.train_on_batch(*batch)  # Builds optimizer and metrics.
    state = tuple(
        [v.value for v in variables]
        for variables in (
            classifier.trainable_variables,
            classifier.non_trainable_variables,
            classifier.optimizer.variables,
            classifier.metrics_variables,
        )
    )
    compiled = jax.jit(classifier.train_step).lower(state, batch).compile()
    return compiled, state


def jax_optimizer_update(optimizer, variables):
    """The compiled `stateless_apply` of `optimizer` and its arguments."""
    import jax
    import jax.numpy as jnp

    values = [v.value for v in variables]
    grads = [jnp.full_like(v, 1e-3) for v in values]
    arguments = ([v.value for v in optimizer.variables], grads, values)
    compiled = jax.jit(optimizer.stateless_apply).lower(*arguments).compile()
    return compiled, arguments


# --- TensorFlow -------------------------------------------------------------


def tf_optimizer_update(optimizer, variables):
    """A `tf.function` applying fixed gradients, and its graph's op count."""
    import tensorflow as tf

    grads = [tf.fill(v.shape, tf.cast(1e-3, v.dtype)) for v in variables]
    function = tf.function(lambda: optimizer.apply(grads, variables))
    graph = function.get_concrete_function().graph
    # Without the branches of `cond`s (the loss scaling's).
    return function, {"graph_operations": len(graph.get_operations())}


# --- Measurement --------------------------------------------------------------


def measure_dtype(args, shape, dtype, batch):
    """Every optimizer's counts and times under one dtype policy."""
    backend = keras.backend.backend()
    keras.mixed_precision.set_global_policy(DTYPES[dtype])
    results, steps, updates = {}, {}, {}
    for name in args.optimizers:
        classifier = make_classifier(shape, name)
        result = {"optimizer": name, "dtype": dtype}
        optimizer = classifier.optimizer
        variables = classifier.trainable_variables
        if backend == "torch":
            import torch

            result["step_counts"] = torch_step_counts(classifier, batch)
            result["update_counts"] = torch_optimizer_counts(
                optimizer, variables
            )
            steps[name] = _train_on_batch(classifier, batch)
            grads = [torch.full_like(v.value, 1e-3) for v in variables]
            updates[name] = _apply(optimizer, grads, variables)
        elif backend == "jax":
            compiled, state = jax_train_step(classifier, batch)
            result["step_counts"] = hlo_counts(compiled.as_text())
            update, arguments = jax_optimizer_update(optimizer, variables)
            result["update_counts"] = hlo_counts(update.as_text())
            steps[name] = _jax_step(compiled, state, batch)
            updates[name] = _jax_update(update, arguments)
        else:
            classifier.train_on_batch(*batch)
            function, counts = tf_optimizer_update(optimizer, variables)
            result["update_counts"] = counts
            steps[name] = _train_on_batch(classifier, batch)
            updates[name] = lambda _, f=function: f()
        results[name] = result
    for kind, functions, rounds in (("step", steps, args.steps),
                                    ("update", updates, args.update_steps)):
        timed = common.alternate(functions, rounds, warmup=args.warmup)
        for name, t in timed.items():
            results[name][f"{kind}_time"] = dict(
                common.summarize(t["times"]), compile_s=t["compile_s"]
            )
    rows = list(results.values())
    base = results.get("keras_adamw")
    for row in rows:
        if base is None:
            break
        row["time_ratio_to_keras_adamw"] = {
            kind: row[f"{kind}_time"]["median_s"]
            / base[f"{kind}_time"]["median_s"]
            for kind in ("step", "update")
        }
    if backend == "torch" and args.hf:
        hf = torch_hf(shape, batch, dtype, args.steps, args.warmup)
        if hf is not None:
            rows.append(dict(hf, optimizer="hf_torch_adamw", dtype=dtype))
    keras.mixed_precision.set_global_policy("float32")
    return rows


def _train_on_batch(classifier, batch):
    return lambda _: classifier.train_on_batch(*batch)


def _apply(optimizer, grads, variables):
    return lambda _: optimizer.apply(grads, variables)


def _jax_step(compiled, state, batch):
    import jax

    holder = [state]

    def run(_):
        logs, holder[0] = compiled(holder[0], batch)
        jax.block_until_ready(holder[0])

    return run


def _jax_update(compiled, arguments):
    import jax

    return lambda _: jax.block_until_ready(compiled(*arguments))


def measure(args):
    """Runs every dtype on the loaded backend; returns the JSON path."""
    common.limit_threads(args.threads)
    shape = TINY if args.quick else MINILM
    (batch,) = random_batches(
        shape["vocabulary_size"], args.batch_size, args.sequence_length, 1
    )
    results = []
    for dtype in args.dtypes:
        results += measure_dtype(args, shape, dtype, batch)
    settings = dict(
        shape=shape, batch_size=args.batch_size,
        sequence_length=args.sequence_length, steps=args.steps,
        update_steps=args.update_steps, warmup=args.warmup,
        dtypes=args.dtypes, optimizers=args.optimizers,
        no_kernel_aten_operations=sorted(NO_KERNEL),
    )
    return common.write_results(args, "optimizer_cost", settings, results)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.optimizer_cost",
        description=__doc__.split("\n\n")[0],
        epilog="Writes optimizer_cost_<backend>.json to --output.",
    )
    common.add_common_arguments(parser)
    add = parser.add_argument
    add("--batch-size", type=int, default=32,
        help="Sentences per batch. Defaults to %(default)s.")
    add("--sequence-length", type=int, default=128,
        help="Tokens per sentence. Defaults to %(default)s.")
    add("--steps", type=int, default=8,
        help="Timed train steps per optimizer. Defaults to %(default)s.")
    add("--update-steps", type=int, default=30,
        help="Timed optimizer updates alone per optimizer. Defaults to "
        "%(default)s.")
    add("--warmup", type=int, default=2,
        help="Untimed steps first. Defaults to %(default)s.")
    add("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES),
        help="Dtype policies. Defaults to %(default)s.")
    add("--optimizers", nargs="+", choices=OPTIMIZERS,
        default=list(OPTIMIZERS), help="Defaults to all.")
    add("--no-hf", dest="hf", action="store_false",
        help="Leave out the Hugging Face model (PyTorch only).")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.sequence_length = 2, 8
        args.steps, args.update_steps, args.warmup = 2, 2, 1
    return args


def main(argv=None):
    """Runs the benchmark; returns the JSON paths written, one per backend."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return common.run_on_backends(
        "benchmarks.optimizer_cost", argv, args, measure
    )


if __name__ == "__main__":
    main()
