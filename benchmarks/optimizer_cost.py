"""Operations and time per train step of `fine_tuning_adamw` vs Keras's AdamW.

On a GPU with PyTorch a BERT train step is bound by kernel launches, so
every operation the optimizer adds costs time. A random MiniLM-shaped
`keras_hub.models.BertTextClassifier` is compiled with each optimizer;
the operations of one train step and one update are counted and both are
timed (medians, in alternation). PyTorch: the profiler's ATen operations
(`top_level`, `compute`: leaves that launch a kernel, `host_syncs`) by
where they happen, beside HF's `BertForSequenceClassification` trained as
HF Trainer does; JAX: the compiled programs' instructions; TensorFlow:
the update graph's operations. Float16 runs under `"mixed_float16"`.

Usage: `python -m benchmarks.optimizer_cost [--backend torch] [--quick]`.
"""

import collections
import contextlib

import keras

from benchmarks import harness
from benchmarks import layer_ops
from benchmarks.harness import DTYPES
from benchmarks.harness import SHAPES
from benchmarks.layer_ops import NO_KERNEL_ATEN
from benchmarks.layer_ops import torch_events

OPTIMIZERS = ("keras_adamw", "fine_tuning_adamw")
HOST_SYNC = "aten::_local_scalar_dense"
# A GPU runs a `_foreach_` operation as one kernel per chunk of tensors;
# the CPU, one operation per tensor. Counted as one compute operation.
FOREACH = "aten::_foreach_"
AUTOGRAD = "autograd::engine::evaluate_function"


def make_optimizer(name, learning_rate=1e-4, total_steps=1000):
    """The optimizer `name` of `OPTIMIZERS`."""
    from keras_isobn.optimizers import fine_tuning_adamw

    if name == "keras_adamw":
        return keras.optimizers.AdamW(learning_rate)
    return fine_tuning_adamw(learning_rate, total_steps=total_steps)


def make_classifier(shape, optimizer, seed=0):
    """A compiled `BertTextClassifier` of `shape`, weights from `seed`."""
    import keras_hub

    backbone = harness.bert_backbone(shape, seed)
    classifier = keras_hub.models.BertTextClassifier(
        backbone=backbone, num_classes=2, preprocessor=None
    )
    classifier.compile(
        optimizer=make_optimizer(optimizer),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=keras.backend.backend() != "torch",
    )
    return classifier


def torch_counts(events, regions=()):
    """`{region: {top_level, compute, host_syncs}}` of profiler `events`.

    `regions` are `record_function` ranges to split by (innermost wins);
    the autograd engine's operations go to `"backward"`, others to
    `"other"`; `"total"` counts all.
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
            counts[key]["compute"] += leaf and event.name not in NO_KERNEL_ATEN
            counts[key]["host_syncs"] += event.name == HOST_SYNC
    return {k: dict(v) for k, v in counts.items()}


@contextlib.contextmanager
def regions(pieces):
    """Wraps `{region: (object, method name)}` in `record_function`s."""
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
            torch_events(lambda: classifier.train_on_batch(x, y)), list(pieces)
        )

    def backbone_alone():
        classifier.zero_grad()
        outputs = backbone(x, training=True)
        loss = outputs["pooled_output"].float().sum()
        loss.backward()
        classifier.zero_grad()

    backbone_alone()
    alone = torch_counts(torch_events(backbone_alone))
    zero = {"top_level": 0, "compute": 0, "host_syncs": 0}

    def get(name):
        return dict(zero, **step.get(name, {}))

    return {
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


def torch_optimizer_counts(optimizer, variables):
    """Counts of one `optimizer.apply` with fixed gradients."""
    import torch

    grads = [torch.full_like(v.value, 1e-3) for v in variables]
    optimizer.apply(grads, variables)
    counts = torch_counts(torch_events(lambda: optimizer.apply(grads, variables)))
    return counts["total"]


def hf_model(shape, seed=0):
    """A randomly initialised `BertForSequenceClassification` of `shape`."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = harness.hf_bert_config(shape, num_labels=2)
    return transformers.BertForSequenceClassification(config)


def hf_step(model, batch, float16, total_steps=1000):
    """A function running one train step as HF Trainer does."""
    import torch

    x, y = batch
    inputs = {k: torch.as_tensor(x[v], dtype=torch.long)
              for k, v in harness.HF_INPUTS.items()}
    inputs["labels"] = torch.as_tensor(y, dtype=torch.long)
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
        scaler.scale(loss).backward()
        with torch.profiler.record_function("optimizer"):
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0,
                                           foreach=True)
            scaler.step(optimizer)
            scaler.update()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def torch_hf(shape, batch, dtype, steps, warmup):
    """Counts and step time of the HF model; `None` if transformers lacks."""
    try:
        import transformers
    except ImportError:
        return None
    model = hf_model(shape)
    step = hf_step(model, batch, float16=dtype == "float16")
    step()
    counts = torch_counts(torch_events(step), ["forward", "optimizer"])
    timed = harness.alternate({"hf": lambda _: step()}, steps, warmup)["hf"]
    return {"counts": counts, "step": harness.summarize(timed["times"]),
            "parameters": sum(p.numel() for p in model.parameters()),
            "transformers": transformers.__version__}


def hlo_counts(compiled_text):
    """Instruction counts of a compiled XLA program's text.

    `instructions` (in all computations), `entry` (the kernels a GPU
    launches: `layer_ops.hlo_counts()`'s `kernels`) and `fusions`.
    """
    counts = layer_ops.hlo_counts(compiled_text, dim=0)
    return {"instructions": counts["instructions"],
            "entry": counts["kernels"], "fusions": counts["fusions"]}


def jax_train_step(classifier, batch):
    """The classifier's compiled JAX train step and its state."""
    import jax

    classifier.train_on_batch(*batch)  # Builds optimizer and metrics.
    state = harness.jax_state(classifier)
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


def tf_optimizer_update(optimizer, variables):
    """A `tf.function` applying fixed gradients, and its graph's op count."""
    import tensorflow as tf

    grads = [tf.fill(v.shape, tf.cast(1e-3, v.dtype)) for v in variables]
    function = tf.function(lambda: optimizer.apply(grads, variables))
    graph = function.get_concrete_function().graph
    # Without the branches of `cond`s (the loss scaling's).
    return function, {"graph_operations": len(graph.get_operations())}


def measure_dtype(args, shape, dtype, batch):
    """Every optimizer's counts and times under one dtype policy."""
    backend = keras.backend.backend()
    keras.mixed_precision.set_global_policy(DTYPES[dtype])
    results, steps, updates = {}, {}, {}
    for name in OPTIMIZERS:
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
            updates[name] = (lambda _, o=optimizer, g=grads, v=variables:
                             o.apply(g, v))
        elif backend == "jax":
            import jax

            compiled, state = jax_train_step(classifier, batch)
            result["step_counts"] = hlo_counts(compiled.as_text())
            update, arguments = jax_optimizer_update(optimizer, variables)
            result["update_counts"] = hlo_counts(update.as_text())
            steps[name] = _jax_step(compiled, state, batch)
            updates[name] = (lambda _, f=update, a=arguments:
                             jax.block_until_ready(f(*a)))
        else:
            classifier.train_on_batch(*batch)
            function, counts = tf_optimizer_update(optimizer, variables)
            result["update_counts"] = counts
            steps[name] = _train_on_batch(classifier, batch)
            updates[name] = lambda _, f=function: f()
        results[name] = result
    for kind, functions, rounds in (("step", steps, args.steps),
                                    ("update", updates, args.update_steps)):
        timed = harness.alternate(functions, rounds, warmup=args.warmup)
        for name, t in timed.items():
            results[name][f"{kind}_time"] = dict(
                harness.summarize(t["times"]), compile_s=t["compile_s"]
            )
    rows = list(results.values())
    base = results.get("keras_adamw")
    for row in rows if base else []:
        row["time_ratio_to_keras_adamw"] = {
            kind: row[f"{kind}_time"]["median_s"]
            / base[f"{kind}_time"]["median_s"]
            for kind in ("step", "update")
        }
    if backend == "torch" and not args.no_hf:
        hf = torch_hf(shape, batch, dtype, args.steps, args.warmup)
        if hf is not None:
            rows.append(dict(hf, optimizer="hf_torch_adamw", dtype=dtype))
    keras.mixed_precision.set_global_policy("float32")
    return rows


def _train_on_batch(classifier, batch):
    return lambda _: classifier.train_on_batch(*batch)


def _jax_step(compiled, state, batch):
    import jax

    holder = [state]

    def run(_):
        logs, holder[0] = compiled(holder[0], batch)
        jax.block_until_ready(holder[0])

    return run


def measure(args):
    """Runs every dtype on the loaded backend; returns the JSON path."""
    shape = SHAPES["tiny" if args.quick else "minilm"]
    (batch,) = harness.random_batches(
        shape["vocabulary_size"], args.batch_size, args.sequence_length, 1
    )
    results = []
    for dtype in args.dtypes:
        results += measure_dtype(args, shape, dtype, batch)
    settings = dict(
        shape=shape, batch_size=args.batch_size,
        sequence_length=args.sequence_length, steps=args.steps,
        update_steps=args.update_steps, warmup=args.warmup,
        dtypes=args.dtypes, optimizers=list(OPTIMIZERS),
        no_kernel_aten_operations=sorted(NO_KERNEL_ATEN),
    )
    return harness.write_results(args, "optimizer_cost", settings, results)


OPTIONS = {
    "batch_size": (32, "Sentences per batch."),
    "sequence_length": (128, "Tokens per sentence."),
    "steps": (8, "Timed train steps per optimizer."),
    "update_steps": (30, "Timed optimizer updates alone per optimizer."),
    "warmup": (2, "Untimed steps first."),
    "dtypes": (list(DTYPES), "Dtype policies.", tuple(DTYPES)),
    "no_hf": (False, "Leave out the Hugging Face model (PyTorch only)."),
}


def main(argv=None):
    """Runs the benchmark; returns the JSON paths written, one per backend."""
    parser = harness.command(__name__, OPTIONS)
    quick = dict(batch_size=2, sequence_length=8, steps=2, update_steps=2,
                 warmup=1)
    return harness.run(__name__, argv, parser, measure, quick)


if __name__ == "__main__":
    main()
