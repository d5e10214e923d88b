"""Operations and kernels in IsoBN's train step, beside BatchNormalization's.

On a GPU, a small train step costs about one launch per kernel, whatever
the kernel does, so the number of kernels and of float32 round trips of
a step is what a CPU can measure of its GPU time. This script counts
them, without timing anything, for `isobn`
(`keras_isobn.IsoBatchNormalization`), `batchnorm`
(`keras.layers.BatchNormalization`) and `none` (no layer), at every size
and dtype policy asked for:

- JAX, `model`: the train step `fit` compiles (`model.train_step`, loss,
  gradients, optimizer and metrics included) of the classifier
  `Input(d) -> layer -> Dense(2)` (Adam, sparse cross-entropy from
  logits), lowered by `jax.jit` with the state donated, as `fit` does;
- JAX and TensorFlow, `layer`: the layer's own train step, the forward
  in training mode (statistics update) and the gradient of a scalar loss
  with respect to the input, compiled (`jax.jit` of `stateless_call`,
  the state donated; `tf.function(jit_compile=True)`, whose variables
  are updated in place);
- PyTorch, `layer` and `layer_forward`: the aten operations the profiler
  records for the same train step (eager) and for the forward alone.

Counts of a compiled step (XLA):

- `lowered_ops`: operations of the un-optimised program (StableHLO on
  JAX, HLO on TensorFlow): what the Python code issues;
- `kernels`: instructions of the optimised entry computation other than
  parameters, constants, tuples and bitcasts: each is one kernel (a
  fusion, a product, a copy...), as XLA's CPU compiler wraps even single
  operations in fusions; `fusions` and `dots` among them;
- `square_outputs`: kernels that write a float32 `(d, d)` array (a
  round trip of the covariance through memory);
- `instructions`: every instruction of the optimised module, fused
  computations included.

Counts of PyTorch: `aten_ops`, every aten operation recorded;
`aten_top_level`, those not called by another aten operation (what the
Python code and autograd issue); `aten_compute_ops`, those of them that
compute (each one kernel on a GPU): not views, allocations or the
conversions Keras makes that copy nothing (`aten::to` without a copy).

Usage:

```
python -m benchmarks.layer_ops                 # every backend
python -m benchmarks.layer_ops --backend jax --dims 384 1024
```
"""

import argparse
import collections
import re
import sys

import keras
import numpy as np
from keras import ops

import keras_isobn
from benchmarks import common
from benchmarks.layer_cost import DTYPES

METHODS = ("none", "batchnorm", "isobn")
# Entry instructions that are no kernel of their own.
FREE_OPCODES = frozenset(
    {"parameter", "constant", "tuple", "get-tuple-element", "bitcast",
     "opt-barrier"}
)
# One HLO instruction: `[ROOT ]name = shape opcode(operands), attributes`.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s+=\s+(.*)$")
# A computation's header: `[ENTRY ]%name (parameters) -> shape {`.
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
CONTROL_OPCODES = frozenset({"conditional", "while", "call"})
_CALLED = re.compile(
    r"(?:true_computation|false_computation|body|condition|to_apply)="
    r"%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
# Aten operations that compute nothing: views, allocations, bookkeeping.
NO_KERNEL_ATEN = frozenset(
    "aten::" + name for name in (
        "to", "lift_fresh", "empty", "empty_strided", "empty_like",
        "detach", "alias", "view", "reshape", "_reshape_alias",
        "_unsafe_view", "as_strided", "t", "transpose", "numpy_T",
        "unsqueeze", "squeeze", "select", "slice", "diagonal", "expand",
        "permute", "unbind", "result_type", "resolve_conj", "resolve_neg",
    )
)
_LOWERED_OP = re.compile(r'=\s*"?(?:stablehlo|chlo)\.\w+|=\s*call\s+@')


class Identity(keras.layers.Layer):
    """Returns its inputs: the `none` method."""

    def call(self, inputs, training=None):
        return inputs


def make_layer(method, policy):
    """The layer counted as `method`, under the dtype policy `policy`."""
    layers = {
        "none": Identity,
        "batchnorm": keras.layers.BatchNormalization,
        "isobn": keras_isobn.IsoBatchNormalization,
    }
    if method not in layers:
        raise ValueError(f"Unknown method {method!r}; choose from {METHODS}.")
    return layers[method](dtype=policy)


def hlo_counts(text, dim):
    """Kernels, fusions and instructions of an optimised HLO module.

    Kernels are counted in the entry computation and in the computations
    it runs through control flow (the branches of a `conditional`, e.g.
    the loss-scale optimizer's, the body of a `while`), not in fused
    computations or reducers.
    """
    computations, entry, instructions = {}, None, 0
    current = None
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if match and current is not None:
            instructions += 1
            current.append(_shape_and_opcode(match.group(1)) + (line,))
            continue
        header = _COMPUTATION.match(line)
        if header and not match:
            current = computations.setdefault(header.group(2), [])
            if header.group(1):
                entry = header.group(2)
    kernels, control, seen, todo = [], 0, set(), [entry]
    while todo:
        name = todo.pop()
        if name in seen or name not in computations:
            continue
        seen.add(name)
        for shape, opcode, line in computations[name]:
            if opcode in CONTROL_OPCODES:
                control += 1
                todo += _CALLED.findall(line)
                for group in _BRANCHES.findall(line):
                    todo += [n.strip().lstrip("%") for n in group.split(",")]
            elif opcode not in FREE_OPCODES:
                kernels.append((shape, opcode))
    opcodes = collections.Counter(op for _, op in kernels)
    square = f"f32[{dim},{dim}]"
    return {
        "kernels": len(kernels),
        "fusions": opcodes["fusion"],
        "dots": opcodes["dot"] + opcodes["custom-call"],
        "square_outputs": sum(square in s for s, _ in kernels),
        "control_flow": control,
        "instructions": instructions,
        "kernel_opcodes": dict(sorted(opcodes.items())),
    }


def _shape_and_opcode(rest):
    """`(shape, opcode)` of the text after `name = ` of an instruction."""
    if rest.startswith("("):  # A tuple shape: up to its closing bracket.
        depth = 0
        for i, char in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                break
        shape, rest = rest[: i + 1], rest[i + 1:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    return shape, rest.split("(", 1)[0]


def lowered_count(text):
    """Operations of an un-optimised StableHLO (MLIR) or HLO module."""
    if "stablehlo." in text:
        return sum(bool(_LOWERED_OP.search(line)) for line in text.splitlines())
    return sum(bool(_INSTRUCTION.match(line)) for line in text.splitlines())


def _inputs(dim, batch_size, policy, seed=0):
    rng = np.random.default_rng(seed)
    dtype = keras.DTypePolicy(policy).compute_dtype
    x = (rng.normal(size=(batch_size, dim)) * np.logspace(-2, 1, dim) + 3.0)
    cotangent = rng.normal(size=(batch_size, dim)).astype("float32")
    return x.astype(dtype), cotangent


def _fitted_layer(method, policy, x):
    """A built layer after two eager training calls."""
    layer = make_layer(method, policy)
    layer.build(x.shape)
    for _ in range(2):
        layer(x, training=True)
    return layer


def jax_model_counts(method, dim, batch_size, policy):
    """Counts of the compiled `fit` train step of the small classifier."""
    import jax

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        inputs = keras.Input(shape=(dim,))
        outputs = keras.layers.Dense(2)(make_layer(method, policy)(inputs))
        model = keras.Model(inputs, outputs)
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=True,
        )
    finally:
        keras.config.set_dtype_policy(previous)
    x, _ = _inputs(dim, batch_size, policy)
    y = np.arange(batch_size) % 2
    model.train_on_batch(x, y)  # Builds the optimizer and metrics.
    state = model._get_jax_state(
        trainable_variables=True,
        non_trainable_variables=True,
        optimizer_variables=True,
        metrics_variables=True,
    )
    # Donated, as `fit` does: the updated state is written in place.
    lowered = jax.jit(model.train_step, donate_argnums=0).lower(state, (x, y))
    return _compiled_counts(lowered.as_text(), lowered.compile().as_text(), dim)


def jax_layer_counts(method, dim, batch_size, policy):
    """Counts of the compiled train step of the layer alone."""
    import jax

    x, cotangent = _inputs(dim, batch_size, policy)
    layer = _fitted_layer(method, policy, x)
    trainable = [v.value for v in layer.trainable_variables]
    state = [v.value for v in layer.non_trainable_variables]

    def loss(x, state):
        y, state = layer.stateless_call(trainable, state, x, training=True)
        return ops.sum(ops.cast(y, "float32") * cotangent), (y, state)

    def step(state, x):
        (_, (y, state)), grad = jax.value_and_grad(loss, has_aux=True)(
            x, state
        )
        return y, grad, state

    lowered = jax.jit(step, donate_argnums=0).lower(state, x)
    return _compiled_counts(lowered.as_text(), lowered.compile().as_text(), dim)


def tensorflow_layer_counts(method, dim, batch_size, policy):
    """Counts of the XLA-compiled train step of the layer alone."""
    import tensorflow as tf

    x, cotangent = _inputs(dim, batch_size, policy)
    layer = _fitted_layer(method, policy, x)
    x = tf.constant(x)

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(tf.cast(y, "float32") * cotangent)
        return y, tape.gradient(loss, x)

    ir = step.experimental_get_compiler_ir(x)
    return _compiled_counts(ir(stage="hlo"), ir(stage="optimized_hlo"), dim)


def _compiled_counts(lowered, optimized, dim):
    counts = hlo_counts(optimized, dim)
    return dict(lowered_ops=lowered_count(lowered), **counts)


def torch_layer_counts(method, dim, batch_size, policy):
    """Aten operations of the layer's eager train step and forward."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile

    x, cotangent = _inputs(dim, batch_size, policy)
    layer = _fitted_layer(method, policy, x)
    x = torch.tensor(x)
    cotangent = torch.tensor(cotangent)

    def train():
        inputs = x.detach().requires_grad_(True)
        y = layer(inputs, training=True)
        (y.float() * cotangent).sum().backward()

    def forward():
        with torch.no_grad():
            layer(x, training=True)

    counts = {}
    for scope, run in (("layer", train), ("layer_forward", forward)):
        run()  # Warm up.
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        aten = [e for e in prof.events() if e.name.startswith("aten::")]
        top = [e for e in aten if not _aten_ancestor(e)]
        compute = [e for e in top if _computes(e)]
        counts[scope] = {
            "aten_ops": len(aten),
            "aten_top_level": len(top),
            "aten_compute_ops": len(compute),
            "top_level_names": dict(
                sorted(collections.Counter(e.name for e in top).items())
            ),
        }
    return counts


def _computes(event):
    """Whether an aten operation computes (or copies) anything."""
    if event.name == "aten::to":
        return any(c.name == "aten::_to_copy" for c in event.cpu_children)
    return event.name not in NO_KERNEL_ATEN


def _aten_ancestor(event):
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def measure(args):
    """Counts every method at every size on the loaded backend."""
    common.limit_threads(args.threads)
    backend = keras.backend.backend()
    results = []
    for dim in args.dims:
        for dtype in args.dtypes:
            policy = DTYPES[dtype]
            for method in args.methods:
                common_keys = dict(method=method, dim=dim, dtype=dtype,
                                   policy=policy, batch_size=args.batch_size)
                scopes = {}
                if backend == "jax":
                    scopes["model"] = jax_model_counts(
                        method, dim, args.batch_size, policy
                    )
                    scopes["layer"] = jax_layer_counts(
                        method, dim, args.batch_size, policy
                    )
                elif backend == "tensorflow":
                    scopes["layer"] = tensorflow_layer_counts(
                        method, dim, args.batch_size, policy
                    )
                else:
                    scopes.update(torch_layer_counts(
                        method, dim, args.batch_size, policy
                    ))
                for scope, counts in scopes.items():
                    results.append(dict(common_keys, scope=scope, **counts))
    for r in results:
        shown = ("lowered_ops", "kernels", "fusions", "dots",
                 "square_outputs", "aten_ops", "aten_top_level",
                 "aten_compute_ops")
        print(
            f"[layer_ops] {backend} {r['scope']} d={r['dim']} {r['dtype']} "
            f"{r['method']}: "
            + ", ".join(f"{k}={r[k]}" for k in shown if k in r),
            file=sys.stderr,
            flush=True,
        )
    settings = {
        "batch_size": args.batch_size,
        "dims": args.dims,
        "dtypes": {d: DTYPES[d] for d in args.dtypes},
        "methods": args.methods,
        "threads": args.threads,
    }
    return common.write_results(args, "layer_ops", settings, results)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.layer_ops",
        description=__doc__.split("\n\n")[0],
        epilog="Writes layer_ops_<backend>.json to --output.",
    )
    common.add_common_arguments(parser, default_threads=1)
    add = parser.add_argument
    add("--dims", type=int, nargs="+", default=[384, 1024],
        help="Feature sizes d. Defaults to %(default)s.")
    add("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES),
        help="Compute dtypes. Defaults to %(default)s.")
    add("--methods", nargs="+", choices=METHODS, default=list(METHODS),
        help="Layers to count. Defaults to %(default)s.")
    add("--batch-size", type=int, default=32,
        help="Rows of the input. Defaults to %(default)s.")
    args = parser.parse_args(argv)
    if args.quick:
        args.dims, args.batch_size, args.threads = [8], 4, 0
    return args


def main(argv=None):
    """Runs the benchmark; returns the JSON paths written, one per backend."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return common.run_on_backends("benchmarks.layer_ops", argv, args, measure)


if __name__ == "__main__":
    main()
