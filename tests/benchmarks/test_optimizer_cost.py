"""Smoke test of `benchmarks.optimizer_cost` on a tiny model (no timings)."""

import json

import keras

from benchmarks import optimizer_cost

BACKEND = keras.backend.backend()


def test_quick_run_counts_every_optimizer(tmp_path):
    (path,) = optimizer_cost.main(
        ["--quick", "--backend", BACKEND, "--output", str(tmp_path),
         "--dtypes", "float32"]
    )
    with open(path) as f:
        payload = json.load(f)
    assert payload["environment"]["backend"] == BACKEND
    assert payload["settings"]["quick"] is True
    rows = {r["optimizer"]: r for r in payload["results"]}
    assert set(optimizer_cost.OPTIMIZERS) <= set(rows)
    for name in optimizer_cost.OPTIMIZERS:
        row = rows[name]
        assert row["step_time"]["median_s"] > 0
        assert row["update_time"]["median_s"] > 0
        assert row["time_ratio_to_keras_adamw"]["step"] > 0
    update = {
        name: rows[name]["update_counts"] for name in optimizer_cost.OPTIMIZERS
    }
    if BACKEND == "torch":
        step = rows["fine_tuning_adamw"]["step_counts"]
        parts = ("backbone_forward", "head_forward", "loss", "backward",
                 "optimizer", "loss_scaling", "other")
        assert sum(step[p]["top_level"] for p in parts) == (
            step["total"]["top_level"]
        )
        ours = update["fine_tuning_adamw"]["top_level"]
        # Keras evaluates the schedule twice per step (update and weight
        # decay), about 17 operations each; not one update per variable.
        assert ours <= update["keras_adamw"]["top_level"] + 40
        if "hf_torch_adamw" in rows:
            assert rows["hf_torch_adamw"]["counts"]["total"]["top_level"] > 0
    elif BACKEND == "jax":
        for name in optimizer_cost.OPTIMIZERS:
            assert rows[name]["step_counts"]["fusions"] > 0
            assert update[name]["instructions"] > 0
    else:
        for name in optimizer_cost.OPTIMIZERS:
            assert update[name]["graph_operations"] > 0


def test_hlo_counts_reads_entry_instructions():
    text = "\n".join([
        "HloModule m",
        "%fused (p: f32[2]) -> f32[2] {",
        "  %p = f32[2]{0} parameter(0)",
        "  ROOT %n = f32[2]{0} negate(f32[2]{0} %p)",
        "}",
        "ENTRY %main (a: f32[2]) -> (f32[2], f32[2]) {",
        "  %a = f32[2]{0} parameter(0)",
        "  %f = f32[2]{0} fusion(f32[2]{0} %a), kind=kLoop, calls=%fused",
        "  %c = f32[2]{0} copy(f32[2]{0} %f)",
        "  ROOT %t = (f32[2]{0}, f32[2]{0}) tuple(%f, %c)",
        "}",
    ])
    assert optimizer_cost.hlo_counts(text) == {
        "instructions": 6, "entry": 2, "fusions": 1,
    }
