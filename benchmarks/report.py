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
    "isobn_lean": "IsoBN, lean prototype",
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
                get = lambda mode, method: index.get((mode, method, dim, dtype))  # noqa: E731
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
                        "lean": get("train", "isobn_lean"),
                        "zca": get("train", "zca"),
                        "iternorm": get("train", "iternorm"),
                        "batchnorm": get("train", "batchnorm"),
                        "ratio": isobn / cov,
                        "ratio_net": (isobn - noop) / max(cov - noop, 1e-9)
                        if noop is not None
                        else None,
                        "lean_ratio": get("train", "isobn_lean") / cov
                        if get("train", "isobn_lean")
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
         "same, net of the empty step", "lean prototype / covariance"],
        [
            [
                r["backend"], r["dim"], r["dtype"], us(r["noop"]),
                us(r["covariance"]), us(r["update"]), us(r["scale"]),
                us(r["isobn"]), f"{r['ratio']:.2f}",
                "-" if r["ratio_net"] is None else f"{r['ratio_net']:.2f}",
                "-" if r["lean_ratio"] is None else f"{r['lean_ratio']:.2f}",
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
                ["backend"] + [NAMES[m] for m in NAMES if m != "isobn_lean"],
                [
                    [b] + [
                        f"{gradients[b, m]:.3g}" if (b, m) in gradients else "-"
                        for m in NAMES if m != "isobn_lean"
                    ]
                    for b in backends
                ],
            )
        )
    if errors:
        text += "\n\nErrors raised:\n\n" + "\n".join(f"- {e}" for e in errors)
    return text


def section_end_to_end(runs):
    rows = []
    for payload in runs:
        backend = payload["environment"]["backend"]
        s = payload["settings"]
        for r in payload["results"]:
            train, inference = r["train"], r["inference"]
            ratio = r["train_ratio_isobn_to_none"]
            pred = r["inference_ratio_isobn_to_none"]
            folded = r["inference_ratio_folded_to_none"]
            memory = r.get("memory")
            if memory:
                peak = {
                    k: (v["device_peak_bytes"] or v["peak_rss_bytes"]) / 2**20
                    for k, v in memory.items()
                }
                memory_cell = (
                    f"{peak['none']:.0f} / {peak['isobn']:.0f} MiB"
                )
            else:
                memory_cell = "-"
            rows.append(
                [
                    backend,
                    f"{r['model']} (d={r['hidden_dim']}, {r['num_layers']} "
                    f"layers), {s['batch_size']}x{s['sequence_length']}",
                    f"{us(train['none']['median_s'])} / "
                    f"{us(train['isobn']['median_s'])}",
                    f"{ratio['median']:.4f} [{ratio['q1']:.4f}, "
                    f"{ratio['q3']:.4f}], n={len(train['none']['steps'])}",
                    f"{r['analytic']['share'] * 100:.4f}%",
                    f"{us(inference['none']['median_s'])} / "
                    f"{us(inference['isobn']['median_s'])} / "
                    f"{us(inference['isobn_folded']['median_s'])}",
                    f"{pred['median']:.4f} / {folded['median']:.4f}",
                    memory_cell,
                ]
            )
    return table(
        ["backend", "classifier, batch", "train step without / with IsoBN",
         "paired ratio, median [quartiles]", "IsoBN's share of the step's "
         "flops", "predict without / with / folded",
         "predict ratio with / folded", "peak memory without / with"],
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


def goals(results):
    """Rows `[goal, target, measured, status]` and notes on misses."""
    rows, notes = [], []
    layer = layer_goals(results.get("layer_cost", []))
    e2e = results.get("end_to_end", [])
    stab = results.get("stability", [])

    bert = [
        (p["environment"]["backend"], r)
        for p in e2e
        for r in p["results"]
        if r["model"] == "bert_base"
    ]
    if bert:
        measured = []
        worst = 0.0
        for backend, r in bert:
            ratio = r["train_ratio_isobn_to_none"]
            share = _layer_share(layer, backend, r["hidden_dim"],
                                 r["train"]["none"]["median_s"])
            worst = max(worst, ratio["median"] - 1)
            measured.append(
                f"{backend}: {100 * (ratio['median'] - 1):+.2f}% "
                f"[{100 * (ratio['q1'] - 1):+.2f}, "
                f"{100 * (ratio['q3'] - 1):+.2f}]"
                + (f", layer alone {100 * share:.3f}%" if share else "")
            )
        rows.append([GOALS["step"], "<= 1%", "; ".join(measured),
                     _status(worst <= 0.01)])
    else:
        rows.append([GOALS["step"], "<= 1%", "not run", "-"])

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
            lean = [r["lean_ratio"] for r in layer if r["lean_ratio"]]
            notes.append(
                f"**{GOALS['layer']}: missed**, by up to "
                f"{worst['ratio'] / 1.5:.1f}x ({worst['ratio']:.1f}x the "
                f"covariance product instead of 1.5x; {worst['backend']}, "
                f"d={worst['dim']}, {worst['dtype']}). See *Where IsoBN's "
                "train time goes*."
                + (
                    f" The lean prototype reaches {min(lean):.1f}-"
                    f"{max(lean):.1f}x."
                    if lean
                    else ""
                )
            )
        zca = [r for r in layer if r["dim"] == 1024 and r["zca_ratio"]]
        if zca:
            least = min(r["zca_ratio"] for r in zca)
            rows.append(
                [GOALS["zca"], ">= 10x",
                 "; ".join(f"{r['backend']} {r['dtype']}: "
                           f"{r['zca_ratio']:.0f}x" for r in zca),
                 _status(least >= 10)]
            )
    else:
        rows.append([GOALS["layer"], "<= 1.5x", "not run", "-"])

    if e2e:
        measured, worst = [], 0.0
        folded_measured = []
        for p in e2e:
            backend = p["environment"]["backend"]
            for r in p["results"]:
                pred = r["inference_ratio_isobn_to_none"]
                share = _layer_share(
                    layer, backend, r["hidden_dim"],
                    r["inference"]["none"]["median_s"], mode="inference",
                    results=results,
                )
                worst = max(worst, pred["median"] - 1)
                measured.append(
                    f"{backend} {r['model']}: "
                    f"{100 * (pred['median'] - 1):+.2f}%"
                    + (f", layer alone {100 * share:.3f}%" if share else "")
                )
                folded = r["folded"]
                same = folded["layers"] == folded["layers_without_isobn"]
                folded_measured.append(
                    f"{backend} {r['model']}: "
                    + ("same layers as without IsoBN"
                       if same and not folded["has_normalization"]
                       else "normalization left")
                    + f", logits within {folded['max_abs_logit_difference']:.1e}"
                    + f", measured {100 * (r['inference_ratio_folded_to_none']['median'] - 1):+.2f}%"
                )
        rows.append([GOALS["inference"], "< 0.1%", "; ".join(measured),
                     _status(worst < 0.001)])
        rows.append([GOALS["folded"], "0", "; ".join(folded_measured),
                     _status(all(
                         r["folded"]["layers"] == r["folded"]["layers_without_isobn"]
                         for p in e2e for r in p["results"]
                     ))])
    else:
        rows.append([GOALS["inference"], "< 0.1%", "not run", "-"])

    if stab:
        isobn_failed = sum(
            r["failed_trials"] for p in stab for r in p["results"]
            if r["method"] == "isobn"
        )
        whitening_failed = [
            (p["environment"]["backend"], r) for p in stab for r in p["results"]
            if r["method"] in ("zca", "iternorm") and r["failed_trials"]
        ]
        isobn_there = sum(
            r["failed_trials"] for p in stab for r in p["results"]
            if r["method"] == "isobn"
            and any(
                w["family"] == r["family"] and w["dtype"] == r["dtype"]
                and b == p["environment"]["backend"]
                for b, w in whitening_failed
            )
        )
        total = sum(
            r["trials"] for p in stab for r in p["results"]
            if r["method"] == "isobn"
        )
        rows.append(
            [GOALS["nan"], "0",
             f"IsoBN {isobn_failed}/{total} trials in all (0 expected), "
             f"{isobn_there} where whitening failed; whitening failed in "
             f"{len(whitening_failed)} settings",
             _status(isobn_failed == 0)]
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


def render(results, title="keras-isobn benchmarks"):
    """The Markdown summary of `results` (see `load_results`)."""
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
                "IsoBN's train step is update + scale + `x * scale` + its "
                "gradient.", "", section_breakdown(layer)]
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
                "step time with vs without IsoBN.", "",
                section_gpu(results["gpu_check"])]
    out += ["", "## Machines and noise", "", NOISE, "",
            section_machines(results)]
    return "\n".join(out) + "\n"


ANALYSIS = """\
Why, and what would close the misses:

- **Layer time vs its covariance product.** IsoBN's unavoidable work is the
  `n x d` by `d x n` product (`2 n d^2` flops, `n = 32`). Around it the layer
  makes about ten elementwise passes over `d x d` float32 matrices (4 MiB at
  d=1024): the finiteness check of the batch covariance, the masked update
  of the moving covariance, and, for the scale, `outer(std, std)`, the
  division, the clip, the square and the row means, read again in inference.
  At batch 32 a `d x d` pass costs about as much as the product itself (both
  are memory-bound), so these passes, not the product, set the time. What
  would close most of it, all in `IsoBatchNormalization` and with the same
  results (the lean prototype, `benchmarks/lean_isobn.py`, does the first
  three and is tested equal to the layer): check finiteness on the `d` sums
  of squares (Cauchy-Schwarz bounds every covariance entry by them) instead
  of the `d x d` product; zero the `n x d` batch, not the `d x d` product,
  for a skipped batch, and update as one `(1 - rate) * moving + (rate / n)
  * Y^T Y`; compute `rho^2` with `1 / std` per feature instead of
  `outer(std, std)`; and keep the scale in a `(d,)` non-trainable weight
  written by the update, so inference is `x * scale` as cheap as
  BatchNormalization (folding already does that on export). The floor is
  then the product plus one read of the `d x d` covariance, about 1.3-2x
  the product on a CPU at batch 32; below that needs a fused kernel.
- **ZCA / IterNorm.** Full whitening needs an eigendecomposition (or
  3 x 5 `d x d x d` products) and their backward pass every step: `O(d^3)`
  against IsoBN's `O(n d^2)`, so the gap widens with d.
- **Whole classifier.** IsoBN's own work is a few thousandths of a percent
  of a BERT-base step; the measured difference between two classifiers is
  the run-to-run noise of a shared CPU (see the quartiles), so the paired
  ratio bounds the overhead only to that noise. The `layer alone` figure
  (the layer's train-mode time from *Layer cost* over the step) is the
  tighter bound."""

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
eigenvalues: JAX and PyTorch return Inf/NaN input gradients, while
TensorFlow's gradient replaces `1 / x` by `x / (x^2 + 1e-20)`, which
hides the failure (and gives a wrong, huge-but-finite gradient instead).
The more spread the eigenvalues of the data, the less often exact ties
occur (isotropic inputs fail least). Decorrelated BN avoids this with
groups of at most the batch size; the IsoBN paper's point is that
whitening all features of a [CLS] vector is what breaks. IterNorm stays
finite at 5 iterations, but 5 Newton steps only partly whiten an
ill-conditioned covariance, and the plain Newton iteration diverges in
float32 after ~20 steps (`tests/benchmarks/test_whitening.py`). IsoBN
needs no inverse, no eigendecomposition and no gradient through its
statistics, and gives features without variance the limit of its
formula."""

END_TO_END = """\
Two `IsoBNBertTextClassifier`s, with `normalization="isobn"` and `None`,
same weights, same batches (random token ids, full length), compiled alike
(AdamW, XLA on JAX and TensorFlow, eager PyTorch), `train_on_batch` steps
in alternation after one warm-up step each; the paired ratio is the median
of the step-by-step ratios. Predict adds the IsoBN classifier folded by
`keras_isobn.export.fold_normalization` (the form it is exported in).
Peak memory comes from a fresh process per classifier (`ru_maxrss` on a
CPU, the device's peak on a GPU) and includes the framework itself."""

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
    with open(path, "w") as f:
        f.write(render(results))
    return path


if __name__ == "__main__":
    print(main())
