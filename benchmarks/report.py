"""Writes the Markdown summary of the benchmark results.

Reads every `layer_cost_*.json`, `stability_*.json`, `end_to_end_*.json`
and `gpu_check_*.json` of the results folder and writes `README.md`
there: how to rerun, the machines, the goals with their measured ratios,
and one table per benchmark.

Usage:

```
python -m benchmarks.report                      # benchmarks/results/README.md
python -m benchmarks.report --results /tmp/b --include-quick
```
"""

import argparse
import glob
import json
import os
import sys

from benchmarks import common

NAMES = {
    "isobn": "IsoBN",
    "batchnorm": "BatchNormalization",
    "zca": "ZCA whitening (eigh)",
    "iternorm": "IterNorm (5 Newton its.)",
}
GOALS = {
    "step": "IsoBN train-step overhead, BERT-base classifier",
    "layer": "IsoBN layer, train mode / its covariance product alone",
    "zca": "ZCA whitening / IsoBN, train mode, d=1024",
    "inference": "IsoBN inference overhead, whole classifier",
    "folded": "Same, export with the scale folded into the kernel",
    "nan": "Trials with NaN/Inf: IsoBN where whitening fails",
}


def load_results(folder, quick=False):
    """`{benchmark: [payload, ...]}` of the JSON files of `folder`."""
    results = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            try:
                payload = json.load(f)
            except json.JSONDecodeError:
                continue
        if not isinstance(payload, dict) or "benchmark" not in payload:
            continue
        if bool(payload.get("settings", {}).get("quick")) != quick:
            continue
        payload["file"] = os.path.basename(path)
        results.setdefault(payload["benchmark"], []).append(payload)
    return results


def us(seconds):
    """Seconds as a short string in us, ms or s."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _index(payload):
    return {
        (r["mode"], r["method"], r["dim"], r["dtype"]): r["median_s"]
        for r in payload["results"]
    }


def layer_goals(layer_runs):
    """Per backend: IsoBN train / covariance and ZCA / IsoBN ratios."""
    rows = []
    for payload in layer_runs:
        index = _index(payload)
        backend = payload["environment"]["backend"]
        for dim in payload["settings"]["dims"]:
            for dtype in payload["settings"]["dtypes"]:

                def get(mode, method, dim=dim, dtype=dtype):
                    return index.get((mode, method, dim, dtype))

                isobn, cov = get("train", "isobn"), get("train", "covariance")
                noop = get("train", "noop")
                if isobn is None or cov is None:
                    continue
                rows.append(
                    {
                        "backend": backend,
                        "dim": dim,
                        "dtype": dtype,
                        "isobn": isobn,
                        "covariance": cov,
                        "noop": noop,
                        "update": get("train", "isobn_update"),
                        "scale": get("train", "isobn_scale"),
                        "zca": get("train", "zca"),
                        "iternorm": get("train", "iternorm"),
                        "batchnorm": get("train", "batchnorm"),
                        "ratio": isobn / cov,
                        "ratio_net": (isobn - noop) / max(cov - noop, 1e-9)
                        if noop is not None
                        else None,
                        "zca_ratio": get("train", "zca") / isobn
                        if get("train", "zca")
                        else None,
                    }
                )
    return rows


def section_machines(results):
    rows = []
    for name in ("layer_cost", "stability", "end_to_end", "gpu_check"):
        for payload in results.get(name, []):
            env = payload["environment"]
            versions = env.get("versions", {})
            backend = env["backend"]
            library = {"jax": "jax", "torch": "torch"}.get(backend, "tensorflow")
            rows.append(
                [
                    f"`{payload['file']}`",
                    env["date"][:16].replace("T", " "),
                    f"{env.get('cpu_model')} x{env.get('cpu_count')}",
                    ", ".join(env.get("devices", [])[:2]),
                    " / ".join(f"{x:.1f}" for x in env.get("load_average", [])),
                    f"keras {versions.get('keras')}, {library} "
                    f"{versions.get(library)}",
                    payload["settings"].get("compiled", "-"),
                    payload["settings"].get("threads", "-"),
                ]
            )
    return table(
        ["file", "date (UTC)", "CPU", "devices", "load 1/5/15 min",
         "versions", "compiled", "threads"],
        rows,
    )


def section_layer_cost(layer_runs):
    parts = []
    for mode in ("train", "inference"):
        header = ["backend", "method"]
        columns = []
        rows = []
        for payload in layer_runs:
            index = _index(payload)
            backend = payload["environment"]["backend"]
            settings = payload["settings"]
            if not columns:
                columns = [(d, t) for d in settings["dims"] for t in settings["dtypes"]]
                header += [f"d={d} {t}" for d, t in columns]
            for method in NAMES:
                cells = []
                for dim, dtype in columns:
                    value = index.get((mode, method, dim, dtype))
                    bn = index.get((mode, "batchnorm", dim, dtype))
                    if value is None:
                        cells.append("-")
                    elif method == "batchnorm" or not bn:
                        cells.append(us(value))
                    else:
                        cells.append(f"{us(value)} ({value / bn:.1f}x)")
                if any(c != "-" for c in cells):
                    rows.append([backend, NAMES[method]] + cells)
        title = (
            "Train mode: forward in training mode (statistics update), plus "
            "the gradient of a scalar loss with respect to the input."
            if mode == "train"
            else "Inference mode: forward with the moving statistics."
        )
        parts.append(
            f"**{title}** Median time per call, and in brackets the ratio "
            "to `keras.layers.BatchNormalization` on the same backend, size "
            "and dtype.\n\n" + table(header, rows)
        )
    return "\n\n".join(parts)


def section_breakdown(rows):
    body = table(
        ["backend", "d", "dtype", "empty step", "covariance `Y^T Y / n`",
         "statistics update", "scale", "IsoBN train", "IsoBN / covariance",
         "same, net of the empty step"],
        [
            [
                r["backend"], r["dim"], r["dtype"], us(r["noop"]),
                us(r["covariance"]), us(r["update"]), us(r["scale"]),
                us(r["isobn"]), f"{r['ratio']:.2f}",
                "-" if r["ratio_net"] is None else f"{r['ratio_net']:.2f}",
            ]
            for r in rows
        ],
    )
    return body


STAGES = {
    "train_outputs": "out",
    "train_gradient": "grad",
    "statistics": "stats",
    "inference_outputs": "infer",
    "error": "error",
}


def section_stability(runs):
    columns = []
    rows = []
    errors = []
    for payload in runs:
        backend = payload["environment"]["backend"]
        cells = {}
        for r in payload["results"]:
            column = (r["family"], r["dtype"])
            if column not in columns:
                columns.append(column)
            stages = ", ".join(
                STAGES[k] for k, v in r["failures_by_stage"].items() if v
            )
            cells[r["method"], column] = f"{r['failed_trials']}/{r['trials']}" + (
                f" ({stages})" if stages else ""
            )
            if r["first_error"]:
                errors.append(
                    f"{backend}, {NAMES[r['method']]}, {r['family']} "
                    f"{r['dtype']}: `{r['first_error'].splitlines()[-1][:120]}`"
                )
        for method in NAMES:
            if any((method, c) in cells for c in columns):
                rows.append(
                    [backend, NAMES[method]]
                    + [cells.get((method, c), "-") for c in columns]
                )
    ranges = []
    for r in runs[0]["results"] if runs else []:
        if r["method"] == "isobn":
            ranges.append(
                f"{r['family']} {r['dtype']}: feature stds "
                f"{r['input_min_std']:.1e} to {r['input_max_std']:.1e}, up to "
                f"{r['input_zero_std_features']} of {r['dim']} exactly 0"
            )
    text = (
        "Failed trials / trials, and in brackets where the NaN/Inf appeared "
        "(out: train-step outputs, grad: input gradient, stats: moving "
        "statistics, infer: inference outputs, error: the step raised).\n\n"
        + table(
            ["backend", "method"] + [f"{f} {d}" for f, d in columns], rows
        )
        + "\n\nInputs (" + runs[0]["environment"]["backend"] + " run): "
        + "; ".join(ranges) + "."
    )
    gradients = {}
    for payload in runs:
        backend = payload["environment"]["backend"]
        for r in payload["results"]:
            if "max_abs_finite_gradient" in r:
                key = (backend, r["method"])
                gradients[key] = max(
                    gradients.get(key, 0.0), r["max_abs_finite_gradient"]
                )
    if gradients:
        backends = list(dict.fromkeys(b for b, _ in gradients))
        text += (
            "\n\nLargest finite input gradient over all trials (loss "
            "`sum(y * v)`, `v` standard normal):\n\n"
            + table(
                ["backend"] + list(NAMES.values()),
                [
                    [b] + [
                        f"{gradients[b, m]:.3g}" if (b, m) in gradients else "-"
                        for m in NAMES
                    ]
                    for b in backends
                ],
            )
        )
    if errors:
        text += "\n\nErrors raised:\n\n" + "\n".join(f"- {e}" for e in errors)
    return text


def _ratio_cell(ratio):
    if not ratio:
        return "-"
    return f"{ratio['median']:.3f} [{ratio['q1']:.3f}, {ratio['q3']:.3f}]"


def section_end_to_end(runs):
    rows = []
    for payload in runs:
        backend = payload["environment"]["backend"]
        s = payload["settings"]
        for r in payload["results"]:
            train, inference = r["train"], r["inference"]
            memory = r.get("memory")
            if memory:
                peak = {
                    k: (v["device_peak_bytes"] or v["peak_rss_bytes"]) / 2**20
                    for k, v in memory.items()
                }
                memory_cell = f"{peak['none']:.0f} / {peak['isobn']:.0f}"
                if "none_control" in peak:
                    memory_cell += f" / {peak['none_control']:.0f}"
                memory_cell += " MiB"
                if "isobn_state_bytes" in r:
                    memory_cell += (
                        f" (IsoBN's statistics: "
                        f"{r['isobn_state_bytes'] / 2**20:.1f} MiB)"
                    )
            else:
                memory_cell = "-"
            rows.append(
                [
                    backend,
                    f"{r['model']} (d={r['hidden_dim']}, {r['num_layers']} "
                    f"layers), {s['batch_size']}x{s['sequence_length']}, "
                    f"{len(train['none']['steps'])} steps",
                    f"{us(train['none']['median_s'])} / "
                    f"{us(train['isobn']['median_s'])}",
                    _ratio_cell(r["train_ratio_isobn_to_none"]),
                    _ratio_cell(r.get("train_ratio_control_to_none")),
                    f"{r['analytic']['share'] * 100:.4f}%",
                    f"{us(inference['none']['median_s'])} / "
                    f"{us(inference['isobn']['median_s'])} / "
                    f"{us(inference['isobn_folded']['median_s'])}",
                    f"{_ratio_cell(r['inference_ratio_isobn_to_none'])} / "
                    f"{_ratio_cell(r['inference_ratio_folded_to_none'])} / "
                    f"{_ratio_cell(r.get('inference_ratio_control_to_none'))}",
                    memory_cell,
                ]
            )
    return table(
        ["backend", "classifier, batch, timed steps",
         "train step without / with IsoBN",
         "paired ratio IsoBN / without, median [quartiles]",
         "same, control / without", "IsoBN's flops share",
         "predict without / with / folded",
         "predict ratios IsoBN / folded / control",
         "peak memory without / with / control"],
        rows,
    )


def section_gpu(runs):
    rows = []
    for payload in runs:
        env = payload["environment"]
        ratio = payload["step_ratio_isobn_to_none"]
        timing = payload["step_time"]
        rows.append(
            [
                f"`{payload['file']}`",
                ", ".join(env.get("devices", [])[:1]),
                "PASS" if payload["passed"] else "FAIL: " + ", ".join(
                    k for k, v in payload["checks"].items() if not v
                ),
                payload["settings"]["steps"],
                f"{payload['dev_accuracy']:.3f}",
                f"{us(timing['none']['median_s'])} / "
                f"{us(timing['isobn']['median_s'])}" if timing else "-",
                f"{ratio['median']:.4f}" if ratio else "-",
            ]
        )
    return table(
        ["file", "device", "checks", "steps", "dev accuracy",
         "step without / with IsoBN", "paired ratio"],
        rows,
    )


def _percent(ratio):
    return f"{100 * (ratio - 1):+.2f}%"


def _overhead_status(ratio, control, target):
    """Met, missed, or not resolved by a measurement as noisy as this."""
    overhead = ratio["median"] - 1
    # How far two identical classifiers differ, and how much both ratios
    # spread from step to step.
    noise = (ratio["q3"] - ratio["q1"]) / 2
    if control:
        noise = max(
            noise,
            abs(control["median"] - 1),
            (control["q3"] - control["q1"]) / 2,
        )
    if overhead <= target:
        return "met", noise
    if overhead <= noise:
        return "not resolved", noise
    return "missed", noise


def _classifier_goal(e2e, layer, results, mode, target, models=None):
    """The goal row of the train-step or inference overhead."""
    measured, statuses, over = [], [], []
    for payload in e2e:
        backend = payload["environment"]["backend"]
        for r in payload["results"]:
            if models and r["model"] not in models:
                continue
            ratio = r[f"{mode}_ratio_isobn_to_none"]
            control = r.get(f"{mode}_ratio_control_to_none")
            status, noise = _overhead_status(ratio, control, target)
            statuses.append(status)
            base = r[mode]["none"]["median_s"]
            share = _layer_share(layer, backend, r["hidden_dim"], base, mode,
                                 results)
            measured.append(
                f"{backend} {r['model']}: {_percent(ratio['median'])}"
                + (f" (control {_percent(control['median'])})" if control else "")
                + (f", layer alone {100 * share:.3f}%" if share else "")
            )
            if share and share > target:
                over.append(f"{backend} {r['model']} ({100 * share:.3f}%)")
    if not measured:
        return "not run", "-"
    if "missed" in statuses:
        status = "**missed**"
    elif "not resolved" in statuses:
        status = "not resolved by the paired timing; " + (
            "**missed** by the layer alone on " + ", ".join(over)
            if over else "met by the layer alone"
        )
    else:
        status = "met"
    return "; ".join(measured), status


def goals(results):
    """Rows `[goal, target, measured, status]` and notes on misses."""
    rows, notes = [], []
    layer = layer_goals(results.get("layer_cost", []))
    e2e = results.get("end_to_end", [])
    stab = results.get("stability", [])

    measured, status = _classifier_goal(
        e2e, layer, results, "train", 0.01, models=("bert_base",)
    )
    rows.append([GOALS["step"], "<= 1%", measured, status])

    if layer:
        worst = max(layer, key=lambda r: r["ratio"])
        per_backend = {}
        for r in layer:
            per_backend.setdefault(r["backend"], []).append(r)
        measured = "; ".join(
            f"{b}: {min(x['ratio'] for x in rs):.1f}-"
            f"{max(x['ratio'] for x in rs):.1f}x"
            for b, rs in per_backend.items()
        )
        rows.append([GOALS["layer"], "<= 1.5x", measured,
                     _status(worst["ratio"] <= 1.5)])
        if worst["ratio"] > 1.5:
            notes.append(
                f"**{GOALS['layer']}: missed**, by up to "
                f"{worst['ratio'] / 1.5:.1f}x ({worst['ratio']:.1f}x the "
                f"covariance product instead of 1.5x: {worst['backend']}, "
                f"d={worst['dim']}, {worst['dtype']}). See *Where IsoBN's "
                "train time goes* and the first point below."
            )
        zca = [r for r in layer if r["dim"] == max(x["dim"] for x in layer)
               and r["zca_ratio"]]
        if zca:
            rows.append(
                [GOALS["zca"], ">= 10x",
                 "; ".join(f"{r['backend']} {r['dtype']}: "
                           f"{r['zca_ratio']:.0f}x" for r in zca),
                 _status(min(r["zca_ratio"] for r in zca) >= 10)]
            )
    else:
        rows.append([GOALS["layer"], "<= 1.5x", "not run", "-"])

    measured, status = _classifier_goal(e2e, layer, results, "inference", 0.001)
    rows.append([GOALS["inference"], "< 0.1%", measured, status])
    if e2e:
        folded_measured, same_everywhere = [], True
        for p in e2e:
            backend = p["environment"]["backend"]
            for r in p["results"]:
                folded = r["folded"]
                same = (
                    folded["layers"] == folded["layers_without_isobn"]
                    and not folded["has_normalization"]
                )
                same_everywhere &= same
                folded_measured.append(
                    f"{backend} {r['model']}: "
                    + ("the same layers as without IsoBN" if same
                       else "a normalization is left")
                    + f", logits within {folded['max_abs_logit_difference']:.0e}"
                    + ", timed "
                    + _percent(r["inference_ratio_folded_to_none"]["median"])
                )
        rows.append([GOALS["folded"], "0", "; ".join(folded_measured),
                     _status(same_everywhere)])

    if stab:
        isobn = [r for p in stab for r in p["results"] if r["method"] == "isobn"]
        whitening = [
            (p["environment"]["backend"], r["family"], r["dtype"])
            for p in stab for r in p["results"]
            if r["method"] in ("zca", "iternorm") and r["failed_trials"]
        ]
        failed = sum(r["failed_trials"] for r in isobn)
        settings = sum(
            1 for p in stab for r in p["results"]
            if r["method"] in ("zca", "iternorm")
        )
        rows.append(
            [GOALS["nan"], "0",
             f"IsoBN {failed} of {sum(r['trials'] for r in isobn)} trials; "
             f"whitening failed in {len(whitening)} of {settings} settings "
             "(method, backend, inputs, dtype)",
             _status(failed == 0)]
        )
    return rows, notes


def _layer_share(layer, backend, dim, step_s, mode="train", results=None):
    if mode == "train":
        match = [r for r in layer if r["backend"] == backend
                 and r["dim"] == dim and r["dtype"] == "float32"]
        return match[0]["isobn"] / step_s if match else None
    for payload in (results or {}).get("layer_cost", []):
        if payload["environment"]["backend"] != backend:
            continue
        value = _index(payload).get(("inference", "isobn", dim, "float32"))
        if value:
            return value / step_s
    return None


def _status(met):
    return "met" if met else "**missed**"


def render(results, title="keras-isobn benchmarks", others=()):
    """The Markdown summary of `results` (see `load_results`).

    Args:
        results: `{benchmark: [payload, ...]}`.
        title: The page title.
        others: File names of other Markdown results to link to.
    """
    goal_rows, notes = goals(results)
    layer = layer_goals(results.get("layer_cost", []))
    out = [f"# {title}", ""]
    out.append(
        "IsoBN's claim is most of whitening's benefit without its cost and "
        "instability. These numbers are rerun with `python -m benchmarks` "
        "(all of them, every backend; `--help` for options) or one script "
        "at a time, e.g. `python -m benchmarks.layer_cost --backend jax`; "
        "the GPU check is `benchmarks/gpu_check.sh GLUE_DIR` "
        "(`--small` on a CPU). Each JSON file here holds the raw numbers, "
        "the machine, CPU count, load, backend, versions and date of its "
        "run; this page is written from them by "
        "`python -m benchmarks.report`."
    )
    out += ["", "## Goals", ""]
    out.append(table(["goal", "target", "measured", "status"], goal_rows))
    if notes:
        out += [""] + [f"- {n}" for n in notes]
    out += ["", ANALYSIS]
    if layer:
        out += ["", "## Layer cost", "",
                "One layer on a `(32, d)` input, compiled (XLA on JAX and "
                "TensorFlow; PyTorch eager), float32 under the `float32` "
                "policy and float16 under `mixed_float16` (float16 inputs "
                "and outputs, float32 statistics for every method). The "
                "methods are timed in alternation, `repeats` blocks each, "
                "median per call.", "",
                section_layer_cost(results["layer_cost"])]
        out += ["", "### Where IsoBN's train time goes", "",
                "The pieces of IsoBN's train step timed alone, forward "
                "only: the empty step (calling a compiled function that "
                "returns its input), the centred float32 covariance, the "
                "statistics update (covariance, std, finiteness check, "
                "moving averages) and the scale from the moving statistics. "
                "IsoBN's train step is update + scale (stored in "
                "`moving_scale`) + `x * scale` + its gradient; its inference "
                "is `x * moving_scale`.", "", section_breakdown(layer)]
    if results.get("stability"):
        settings = results["stability"][0]["settings"]
        batch = settings["batch_size"]
        out += ["", "## Stability", "",
                STABILITY.format(batch=batch, dim=settings["dim"],
                                 rank=batch - 1),
                "", section_stability(results["stability"])]
    if results.get("end_to_end"):
        out += ["", "## End to end", "", END_TO_END, "",
                section_end_to_end(results["end_to_end"])]
    if results.get("gpu_check"):
        out += ["", "## GPU check", "",
                "`benchmarks/gpu_check.sh`: mixed_float16 fine-tuning of the "
                "IsoBN MiniLM classifier on SST-2, checks of the statistics, "
                "step time with vs without IsoBN. Rows run with `--small` "
                "(20 steps of batch 8, e.g. on a CPU) are a smoke test of "
                "the script: the statistics checks apply, the accuracy is "
                "not checked.", "",
                section_gpu(results["gpu_check"])]
    out += ["", "## Machines and noise", "", NOISE, "",
            section_machines(results)]
    if others:
        out += ["", "## Other results in this folder", ""]
        out += [f"- [{name}]({name})" for name in others]
    return "\n".join(out) + "\n"


ANALYSIS = """\
Why, and what would close the misses:

- **IsoBN's layer time against its covariance product.** The one product
  IsoBN cannot avoid is the batch covariance, `2 n d^2` flops (`n` = 32).
  On a CPU at batch 32 every elementwise pass over a `d x d` float32
  matrix (4 MiB at d = 1024) moves about 8 bytes per entry against the
  product's 64 flops per entry, so each such pass costs a good fraction
  of the product. The layer keeps these passes few: it checks finiteness
  on the `d` sums of squares (by Cauchy-Schwarz they bound every
  covariance entry), zeroes the `n x d` centred batch for a skipped batch,
  updates as one `(1 - rate) * moving + (rate / n) * Y^T Y`, and builds
  `rho^2` from `1 / std` per feature. Against the layer before this
  rewrite, same process, in alternation
  ([layer_rewrite.md](layer_rewrite.md)), that took the train step from
  1.9-3.5x to 1.4-1.7x the covariance product on JAX, from 1.9-2.5x to
  1.6-1.8x on TensorFlow and from 9-18x to 4.7-7.0x on PyTorch (0.32-0.85
  of the previous time). What remains: the moving average (three `d x d`
  passes and the variable write) and, in the scale, the two `1 / std`
  products, the square, the clip and the row means. XLA fuses most of
  them, hence JAX and TensorFlow at 1.4-2.2x (runs on this shared CPU
  differ by a few tenths; the A/B, interleaved, is the steadier); eager
  PyTorch runs each Keras op as its own kernel with its own `d x d`
  temporary (several dozen op dispatches per step), hence its 5-7x. What would
  close the rest: a GEMM that accumulates into the moving covariance
  (`beta = 1 - rate` in BLAS terms, not expressible in `keras.ops`), and
  on PyTorch a compiled step (`--torch-compile` runs `torch.compile`; not
  used for these numbers).
- **Inference.** Each training update stores the scale in the `(d,)`
  weight `moving_scale`, so inference is `x * moving_scale`, as cheap as
  BatchNormalization's inference (*Layer cost*). The `layer alone`
  inference figures of the goals table use these layer times; the paired
  classifier timings were measured before this change (the layer then
  recomputed its scale from the `d x d` moving covariance at every call),
  and cannot resolve 0.1% anyway. The export folds the scale into the
  classifier kernel, where it costs nothing.
- **Whitening.** Full ZCA whitening needs an eigendecomposition of the
  `d x d` covariance and its backward pass every step, IterNorm 15 `d x d x
  d` products and theirs: `O(d^3)` against IsoBN's `O(n d^2)`, so the gap
  widens with d. TensorFlow's XLA eigendecomposition on the CPU is far slower
  than the LAPACK one of JAX and PyTorch, hence its thousands.
- **Whole classifier.** IsoBN's own work is a few thousandths of a percent
  of a BERT-base train step (the analytic share in *End to end*). Two
  identical classifiers without IsoBN (the control) already differ by
  several percent step to step on this shared CPU, so the paired timing
  cannot resolve 1%, let alone 0.01%; its sign flips from run to run. The
  `layer alone` figure, the layer's own train-mode (or inference) time from
  *Layer cost* over the classifier's step, is the resolved bound."""

STABILITY = """\
Each trial trains a fresh layer for a few compiled train steps of {batch}
vectors of size {dim}, then runs it in inference; it fails if any
output, input gradient or moving statistic is NaN/Inf, or if a step
raises. `isotropic`: standard normal features. `cls_like`: feature stds
spread log-uniformly from 1e-33 to 1 (as in pre-trained [CLS] vectors),
a non-zero mean and three shared factors; their float32 variances under
~1e-38, and in float16 their values under ~6e-8, are exactly 0. `minilm`:
pooled [CLS] vectors of the MiniLM checkpoint on SST-2 sentences.

Why ZCA fails: with {batch} rows and d = {dim} the batch covariance has
rank {rank} at most, so its `d - {rank}` smallest eigenvalues all equal
`epsilon` up to rounding (exactly, for features of zero variance). The
backward pass of an eigendecomposition divides by the differences of the
eigenvalues: JAX and PyTorch return Inf/NaN input gradients. TensorFlow's
gradient replaces `1 / x` by `x / (x^2 + 1e-20)`: exact ties give 0
instead of Inf, which hides the failure, and near ties large finite terms
(its largest gradient in the last table). Isotropic inputs fail least;
the [CLS]-like and the real MiniLM vectors make the eigensolver's
gradient fail in every trial on JAX and PyTorch. Decorrelated BN mitigates this by whitening
groups of features (e.g. 16) smaller than the batch; the IsoBN paper
argues that whitening [CLS] embeddings is too costly and unstable, which
is what full ZCA shows here. IterNorm stays finite at 5 iterations, but 5
Newton steps only partly whiten an ill-conditioned covariance, and the
plain Newton iteration diverges in float32 after ~20 steps
(`tests/benchmarks/test_whitening.py`). IsoBN needs no inverse, no
eigendecomposition and no gradient through its statistics, and gives
features without variance the limit of its formula."""

END_TO_END = """\
`IsoBNBertTextClassifier`s with `normalization="isobn"` and `None`, and a
second one with `None` (the control: how far two identical classifiers
differ), same weights, same batches (random token ids, full length),
compiled alike (AdamW, XLA on JAX and TensorFlow, eager PyTorch),
`train_on_batch` steps in alternation after one warm-up step each. A
paired ratio is the median of the step-by-step ratios to the first
classifier without IsoBN. Predict adds the IsoBN classifier folded by
`keras_isobn.export.fold_normalization` (the form it is exported in). The
flops share is IsoBN's own work (`2 n d^2` plus ten `d x d` passes) over
the classifier's train step (3x a forward pass of `2 N` flops per token
for `N` non-embedding weights, plus attention). Peak memory is the
`VmHWM` of a fresh process per classifier (the device's peak on a GPU),
the framework itself included, after two train steps; the control's is
the probe without IsoBN run a second time, so its difference to the
first is the run-to-run variation."""

NOISE = """\
The CPU runs were made on a 2-core machine shared with other jobs (the
load averages are in the table). Timings there move by tens of percent from
one block to the next; the benchmarks interleave the methods, take medians
of many blocks and use one thread per library (`--threads 1`, layer cost)
to keep the ratios stable, but a ratio within about 10% of 1 is not
resolved, and a difference of 1% of a BERT-base step is far below it.
Rerun on a quiet machine for firmer numbers."""


def main(argv=None):
    """Writes the summary; returns its path."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--results", default=common.RESULTS_DIR,
        help="Folder of the JSON results. Defaults to %(default)s.",
    )
    parser.add_argument(
        "--output",
        help="Markdown file to write. Defaults to README.md in --results.",
    )
    parser.add_argument(
        "--include-quick", action="store_true",
        help="Summarise the --quick runs instead of the full ones.",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    results = load_results(args.results, quick=args.include_quick)
    path = args.output or os.path.join(args.results, "README.md")
    others = sorted(
        os.path.basename(p)
        for p in glob.glob(os.path.join(args.results, "*.md"))
        if os.path.basename(p) != os.path.basename(path)
    )
    with open(path, "w") as f:
        f.write(render(results, others=others))
    return path


if __name__ == "__main__":
    print(main())
