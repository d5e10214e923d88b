"""Smoke test of `benchmarks/layer_ops.py` at a tiny size (counts only)."""

import json

import keras

from benchmarks import layer_ops

BACKEND = keras.backend.backend()
SCOPES = {
    "jax": {"model", "layer"},
    "tensorflow": {"layer"},
    "torch": {"layer", "layer_forward"},
}


def test_layer_ops_counts_every_method_scope_and_dtype(tmp_path):
    (path,) = layer_ops.main(
        ["--quick", "--backend", BACKEND, "--output", str(tmp_path)]
    )
    assert path.endswith(f"layer_ops_{BACKEND}_quick.json")
    with open(path) as f:
        payload = json.load(f)
    assert payload["environment"]["backend"] == BACKEND
    assert payload["settings"]["quick"] is True
    results = {
        (r["scope"], r["method"], r["dtype"]): r for r in payload["results"]
    }
    assert set(results) == {
        (scope, method, dtype)
        for scope in SCOPES[BACKEND]
        for method in layer_ops.METHODS
        for dtype in layer_ops.DTYPES
    }
    for (scope, method, dtype), r in results.items():
        none = results[scope, "none", dtype]
        if BACKEND == "torch":
            assert r["aten_compute_ops"] <= r["aten_top_level"] <= r["aten_ops"]
            assert r["aten_ops"] >= none["aten_ops"]
            continue
        assert r["kernels"] >= r["fusions"] + (r["dots"] > 0)
        assert r["instructions"] > r["kernels"] > 0
        assert r["lowered_ops"] > none["lowered_ops"] or method == "none"
        # IsoBN's covariance product is one dot writing a (d, d) array,
        # and the updated moving covariance is another.
        if method == "isobn":
            assert r["dots"] >= 1 and r["square_outputs"] >= 2
        else:
            assert r["square_outputs"] == 0


def test_hlo_counts_parse_entry_and_control_flow():
    text = """HloModule jit_f, entry_computation_layout={(f32[2,2]{1,0})->f32[2,2]{1,0}}

%fused_computation (param_0: f32[2,2]) -> f32[2,2] {
  %param_0 = f32[2,2]{1,0} parameter(0)
  ROOT %neg = f32[2,2]{1,0} negate(%param_0)
}

%branch (p: (f32[2,2])) -> (f32[2,2]) {
  %p = (f32[2,2]{1,0}) parameter(0)
  %g = f32[2,2]{1,0} get-tuple-element(%p), index=0
  %e = f32[2,2]{1,0} exponential(%g)
  ROOT %t = (f32[2,2]{1,0}) tuple(%e)
}

ENTRY %main (x: f32[2,2], c: pred[]) -> (f32[2,2]) {
  %x = f32[2,2]{1,0} parameter(0)
  %c = pred[] parameter(1)
  %f = f32[2,2]{1,0} fusion(%x), kind=kLoop, calls=%fused_computation
  %d = f32[2,2]{1,0} dot(%f, %f), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %t = (f32[2,2]{1,0}) tuple(%d)
  ROOT %r = (f32[2,2]{1,0}) conditional(%c, %t, %t), branch_computations={%branch, %branch}
}
"""
    counts = layer_ops.hlo_counts(text, dim=2)
    assert counts["kernels"] == 3  # fusion, dot, and exponential in a branch
    assert counts["fusions"] == 1 and counts["dots"] == 1
    assert counts["square_outputs"] == 3
    assert counts["control_flow"] == 1
    assert counts["instructions"] == 12
    assert counts["kernel_opcodes"] == {"dot": 1, "exponential": 1, "fusion": 1}
