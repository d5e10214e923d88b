"""Operations and kernels in IsoBN's train step, beside BatchNormalization's.

On a GPU a small train step costs about one launch per kernel, so the
number of kernels and of float32 round trips of a step is what a CPU can
measure of its GPU time. Counted, not timed, for `isobn`, `batchnorm` and
`none` (no layer), at every size and dtype policy:

- JAX `model`: the train step `fit` compiles for `Input(d) -> layer ->
  Dense(2)` (Adam, cross-entropy), lowered by `jax.jit`, state donated;
- JAX and TensorFlow `layer`: the layer's compiled train step (forward in
  training mode and the input gradient of a scalar loss);
- PyTorch `layer` and `layer_forward`: the aten operations the profiler
  records for that step (eager) and for the forward alone.

XLA: `lowered_ops` (the un-optimised program), `kernels` (the optimised
entry computation's instructions that do work, control flow followed),
`fusions`, `dots`, `square_outputs` (kernels writing a float32 `(d, d)`
array) and `instructions`. PyTorch: `aten_ops`, `aten_top_level` and
`aten_compute_ops` (top-level ones that compute).

Usage: `python -m benchmarks.layer_ops [--backend jax] [--dims 384 1024]`.
"""

import collections
import re
import sys

import keras
import numpy as np

from benchmarks import harness
from benchmarks.harness import DTYPES
from benchmarks.layer_cost import fit_statistics
from benchmarks.layer_cost import make_layer
from benchmarks.steps import LayerStep

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
# Aten operations that launch no kernel: views, metadata, allocations.
NO_KERNEL_ATEN = frozenset(
    "aten::" + name for name in (
        "to", "lift_fresh", "empty", "empty_strided", "empty_like",
        "detach", "alias", "view", "reshape", "_reshape_alias",
        "_unsafe_view", "as_strided", "t", "transpose", "numpy_T",
        "unsqueeze", "squeeze", "select", "slice", "diagonal", "expand",
        "permute", "unbind", "result_type", "resolve_conj", "resolve_neg",
        "expand_as", "narrow", "split", "chunk", "view_as", "contiguous",
        "set_", "is_nonzero", "item", "_local_scalar_dense", "size",
        "stride", "flatten", "unflatten", "split_with_sizes", "movedim",
        "matrix_H", "mT",
    )
)
_LOWERED_OP = re.compile(r'=\s*"?(?:stablehlo|chlo)\.\w+|=\s*call\s+@')


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
    return x.astype(dtype)


def _fitted_layer(method, policy, x):
    """A built layer after a few eager training calls."""
    layer = make_layer(method, policy)
    layer.build(x.shape)
    fit_statistics(layer, x)
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
    x = _inputs(dim, batch_size, policy)
    y = np.arange(batch_size) % 2
    model.train_on_batch(x, y)  # Builds the optimizer and metrics.
    state = harness.jax_state(model)
    # Donated, as `fit` does: the updated state is written in place.
    lowered = jax.jit(model.train_step, donate_argnums=0).lower(state, (x, y))
    return _compiled_counts(lowered.as_text(), lowered.compile().as_text(), dim)


def layer_counts(method, dim, batch_size, policy):
    """Counts of the compiled train step of the layer alone (JAX, TF)."""
    x = _inputs(dim, batch_size, policy)
    step = LayerStep(_fitted_layer(method, policy, x), x, "train")
    if keras.backend.backend() == "jax":
        lowered = step.compiled.lower(step._state, step.x)
        return _compiled_counts(lowered.as_text(),
                                lowered.compile().as_text(), dim)
    ir = step.compiled.experimental_get_compiler_ir(step.x)
    return _compiled_counts(ir(stage="hlo"), ir(stage="optimized_hlo"), dim)


def _compiled_counts(lowered, optimized, dim):
    counts = hlo_counts(optimized, dim)
    return dict(lowered_ops=lowered_count(lowered), **counts)


def torch_events(function):
    """Runs `function()` under the PyTorch profiler; returns its events."""
    import torch

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU]
    ) as profiler:
        function()
    return profiler.events()


def torch_layer_counts(method, dim, batch_size, policy):
    """Aten operations of the layer's eager train step and forward."""
    x = _inputs(dim, batch_size, policy)
    layer = _fitted_layer(method, policy, x)
    counts = {}
    for scope, mode in (("layer", "train"), ("layer_forward", "forward_train")):
        step = LayerStep(layer, x, mode, jit=False)
        step()  # Warm up.
        aten = [e for e in torch_events(step) if e.name.startswith("aten::")]
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
    backend = keras.backend.backend()
    counters = {"jax": {"model": jax_model_counts, "layer": layer_counts},
                "tensorflow": {"layer": layer_counts},
                "torch": {None: torch_layer_counts}}[backend]
    results = []
    for dim in args.dims:
        for dtype in args.dtypes:
            policy = DTYPES[dtype]
            for method in METHODS:
                keys = dict(method=method, dim=dim, dtype=dtype,
                            policy=policy, batch_size=args.batch_size)
                scopes = {}
                for scope, counter in counters.items():
                    counts = counter(method, dim, args.batch_size, policy)
                    scopes.update({scope: counts} if scope else counts)
                for scope, counts in scopes.items():
                    results.append(dict(keys, scope=scope, **counts))
    shown = ("lowered_ops", "kernels", "fusions", "dots", "square_outputs",
             "aten_ops", "aten_top_level", "aten_compute_ops")
    for r in results:
        print(f"[layer_ops] {backend} {r['scope']} d={r['dim']} {r['dtype']} "
              f"{r['method']}: "
              + ", ".join(f"{k}={r[k]}" for k in shown if k in r),
              file=sys.stderr, flush=True)
    settings = dict(batch_size=args.batch_size, dims=args.dims,
                    dtypes={d: DTYPES[d] for d in args.dtypes},
                    methods=list(METHODS), threads=args.threads)
    return harness.write_results(args, "layer_ops", settings, results)


OPTIONS = {
    "dims": ([384, 1024], "Feature sizes d."),
    "dtypes": (list(DTYPES), "Compute dtypes.", tuple(DTYPES)),
    "batch_size": (32, "Rows of the input."),
}


def main(argv=None):
    """Runs the benchmark; returns the JSON paths written, one per backend."""
    parser = harness.command(__name__, OPTIONS, threads=1)
    quick = dict(dims=[8], batch_size=4, threads=0)
    return harness.run(__name__, argv, parser, measure, quick)


if __name__ == "__main__":
    main()
