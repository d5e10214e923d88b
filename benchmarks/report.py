"""Writes `README.md` in the results folder from the JSON files there.

Each benchmark's JSON already holds its rows; a `Section` says which
benchmark's runs a table reads, its columns and how a run becomes rows,
and `write_section` writes them all alike. The goals are data as well
(`GOALS`). What the numbers mean: the hand-written `ANALYSIS.md`.

Usage: `python -m benchmarks.report [--results DIR] [--include-quick]`.
"""

import collections
import glob
import json
import os

from benchmarks import harness
from benchmarks.harness import percent
from benchmarks.harness import status
from benchmarks.harness import table
from benchmarks.harness import us

__all__ = ["GOALS", "SECTIONS", "classifier_goal", "load_results", "main"]

NAMES = {"isobn": "IsoBN", "batchnorm": "BatchNormalization",
         "zca": "ZCA whitening (eigh)", "iternorm": "IterNorm (5 Newton its.)"}
PIECES = {  # The pieces of IsoBN's train step, timed alone.
    "noop": "empty step", "covariance": "covariance `Y^T Y / n`",
    "isobn_update": "statistics update",
    "isobn_forward": "forward in training mode", "isobn_scale": "scale",
}
IMPORT_TARGET = 1.2
LAYER_TARGET = 1.5
# A table: its heading (`None`: under the previous one), caption, the
# benchmarks whose runs it reads, its header (or a function of the runs
# giving it) and a function of the runs giving its rows.
Section = collections.namedtuple("Section", "title caption benchmarks header rows")
# A goal: its name, target, and a function of all results giving the
# cells `(measured, status)`.
Goal = collections.namedtuple("Goal", "name target check")


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


def layer_index(payload):
    """`{(mode, method, dim, dtype): median seconds}` of a layer-cost run."""
    return {
        (r["mode"], r["method"], r["dim"], r["dtype"]): r["median_s"]
        for r in payload["results"]
    }


def layer_columns(runs):
    s = runs[0]["settings"]
    return [(d, t) for d in s["dims"] for t in s["dtypes"]]


def layer_rows(mode):
    """Rows of the layer-cost table of `mode`: times and ratios to BN."""

    def rows(runs):
        for payload in runs:
            index = layer_index(payload)
            for method in NAMES:
                cells = []
                for dim, dtype in layer_columns(runs):
                    value = index.get((mode, method, dim, dtype))
                    bn = index.get((mode, "batchnorm", dim, dtype))
                    if value is None or method == "batchnorm" or not bn:
                        cells.append(us(value))
                    else:
                        cells.append(f"{us(value)} ({value / bn:.1f}x)")
                if any(c != "-" for c in cells):
                    backend = payload["environment"]["backend"]
                    yield [backend, NAMES[method], *cells]

    return rows


def layer_header(runs):
    return ["backend", "method"] + [f"d={d} {t}" for d, t in layer_columns(runs)]


def breakdown(runs):
    """Per backend, size and dtype: IsoBN's train time and its pieces."""
    rows = []
    for payload in runs:
        index = layer_index(payload)
        for dim in payload["settings"]["dims"]:
            for dtype in payload["settings"]["dtypes"]:
                row = {
                    method: index.get(("train", method, dim, dtype))
                    for method in list(NAMES) + list(PIECES)
                }
                isobn, cov, noop = row["isobn"], row["covariance"], row["noop"]
                if isobn is None or cov is None:
                    continue
                net = None
                if noop is not None:
                    net = (isobn - noop) / max(cov - noop, 1e-9)
                zca = row["zca"] / isobn if row["zca"] else None
                backend = payload["environment"]["backend"]
                row.update(backend=backend, dim=dim, dtype=dtype,
                           ratio=isobn / cov, ratio_net=net, zca_ratio=zca)
                rows.append(row)
    return rows


def measured_pieces(runs):
    rows = breakdown(runs)
    return [p for p in PIECES if any(r[p] is not None for r in rows)]


def breakdown_rows(runs):
    for r in breakdown(runs):
        net = "-" if r["ratio_net"] is None else f"{r['ratio_net']:.2f}"
        pieces = [us(r[p]) for p in measured_pieces(runs)]
        yield [r["backend"], r["dim"], r["dtype"], *pieces, us(r["isobn"]),
               f"{r['ratio']:.2f}", net]


def ratio_cell(r):
    return f"{r['median']:.3f} [{r['q1']:.3f}, {r['q3']:.3f}]" if r else "-"


def memory_cell(result):
    if not result.get("memory"):
        return "-"
    peak = {k: (v.get("device_peak_bytes") or v["peak_rss_bytes"]) / 2**20
            for k, v in result["memory"].items()}
    names = [n for n in ("none", "isobn", "none_control") if n in peak]
    cell = " / ".join(f"{peak[n]:.0f}" for n in names) + " MiB"
    if "isobn_state_bytes" in result:
        state = result["isobn_state_bytes"] / 2**20
        cell += f" (IsoBN's statistics: {state:.1f} MiB)"
    return cell


def end_to_end_rows(runs):
    for payload in runs:
        s = payload["settings"]
        for r in payload["results"]:
            train, inference = r["train"], r["inference"]
            predict = ("none", "isobn", "isobn_folded")
            ratios = ("isobn", "folded", "control")
            yield [
                payload["environment"]["backend"],
                f"{r['model']} (d={r['hidden_dim']}, {r['num_layers']} "
                f"layers), {s['batch_size']}x{s['sequence_length']}, "
                f"{len(train['none']['steps'])} steps",
                f"{us(train['none']['median_s'])} / "
                f"{us(train['isobn']['median_s'])}",
                ratio_cell(r["train_ratio_isobn_to_none"]),
                ratio_cell(r.get("train_ratio_control_to_none")),
                f"{r['analytic']['share'] * 100:.4f}%",
                " / ".join(us(inference[n]["median_s"]) for n in predict),
                " / ".join(ratio_cell(r.get(f"inference_ratio_{x}_to_none"))
                           for x in ratios),
                memory_cell(r),
            ]


def gpu_rows(runs):
    for payload in runs:
        failed = [k for k, v in payload["checks"].items() if not v]
        goals = "; ".join(
            f"{name} {goal['measured']:.3f} "
            f"{'met' if goal['met'] else '**missed**'}"
            for name, goal in payload["goals"].items()
        )
        yield [
            f"`{payload['file']}`",
            ", ".join(payload["environment"].get("devices", [])[:1]),
            "PASS" if payload["passed"] else "FAIL: " + ", ".join(failed),
            goals or "-",
            "<br>".join(payload["summary"]),
        ]


def import_rows(runs):
    for payload in runs:
        for r in payload["results"]:
            statements = r["statements"]
            cells = [
                f"{us(s['wall']['median_s'])}, "
                f"{s['peak_rss_bytes'] / 2**20:.0f} MiB"
                for s in statements.values()
            ]
            added = set(statements["keras_isobn"]["modules"])
            added -= set(statements["keras"]["modules"])
            yield [r["backend"], *cells, f"{r['ratios']['wall']:.2f}x",
                   f"{r['ratios']['peak_rss']:.2f}x",
                   ", ".join(f"`{m}`" for m in sorted(added)) or "none",
                   status(max(r["ratios"].values()) <= IMPORT_TARGET)]


def machine_rows(runs):
    for payload in runs:
        env = payload["environment"]
        # A run without a backend measured them all, in subprocesses.
        libraries = [env["backend"]] if "backend" in env else harness.BACKENDS
        yield [
            f"`{payload['file']}`",
            env["date"][:16].replace("T", " "),
            f"{env.get('cpu_model')} x{env.get('cpu_count')}",
            ", ".join(env.get("devices", [])[:2]),
            " / ".join(f"{x:.1f}" for x in env.get("load_average", [])),
            ", ".join(f"{library} {env['versions'].get(library)}"
                      for library in ["keras", *libraries]),
            payload["settings"].get("compiled", "-"),
            payload["settings"].get("threads", "-"),
        ]


LAYER_CAPTION = (
    "**{}** Median time per call, and in brackets the ratio to "
    "`keras.layers.BatchNormalization` on the same backend, size and dtype."
)
SECTIONS = [
    Section("## Layer cost", "One layer on a `(32, d)` input, compiled (XLA "
            "on JAX and TensorFlow; PyTorch eager), float32 under the "
            "`float32` policy and float16 under `mixed_float16`. The methods "
            "are timed in alternation, `repeats` blocks each, median per "
            "call.\n\n" + LAYER_CAPTION.format(
                "Train mode: forward in training mode (statistics update), "
                "plus the gradient of a scalar loss with respect to the "
                "input."),
            ("layer_cost",), layer_header, layer_rows("train")),
    Section(None, LAYER_CAPTION.format(
        "Inference mode: forward with the moving statistics."),
        ("layer_cost",), layer_header, layer_rows("inference")),
    Section("### Where IsoBN's train time goes", "The pieces of IsoBN's "
            "train step timed alone, forward only (see "
            "`benchmarks/layer_cost.py`).", ("layer_cost",),
            lambda runs: ["backend", "d", "dtype"]
            + [PIECES[p] for p in measured_pieces(runs)]
            + ["IsoBN train", "IsoBN / covariance",
               "same, net of the empty step"],
            breakdown_rows),
    Section("## End to end", "Paired ratios: medians of the step-by-step "
            "ratios to the first classifier without IsoBN; the control is a "
            "second one without IsoBN.", ("end_to_end",),
            ["backend", "classifier, batch, timed steps",
             "train step without / with IsoBN",
             "paired ratio IsoBN / without, median [quartiles]",
             "same, control / without", "IsoBN's flops share",
             "predict without / with / folded",
             "predict ratios IsoBN / folded / control",
             "peak memory without / with / control"],
            end_to_end_rows),
    Section("## GPU check", "`benchmarks/gpu_check.sh run BUNDLE` on a GPU "
            "host (rows run with `--small` are a smoke test: accuracy not "
            "checked). What the H200 run shows, its FAIL lines included: "
            "[gpu_h200/README.md](gpu_h200/README.md).", ("gpu_check",),
            ["file", "device", "checks", "goals", "summary"], gpu_rows),
    Section("## Import cost", "Fresh processes, the two statements in "
            "alternation; medians of the whole process's time and of its "
            "peak resident memory (`VmHWM`).", ("import_cost",),
            ["backend", "`import keras`: time, peak memory",
             "`import keras_isobn` + a layer: time, peak memory",
             "time ratio", "memory ratio", "heavy modules it adds",
             f"<= {IMPORT_TARGET}x"],
            import_rows),
    Section("## Machines", None,
            ("layer_cost", "end_to_end", "gpu_check", "import_cost"),
            ["file", "date (UTC)", "CPU", "devices", "load 1/5/15 min",
             "versions", "compiled", "threads"],
            machine_rows),
]


def write_section(section, results):
    """The Markdown of `section` (`[]` when none of its runs is there)."""
    runs = [p for name in section.benchmarks for p in results.get(name, [])]
    if not runs:
        return []
    header = section.header
    if callable(header):
        header = header(runs)
    out = ["", section.title, ""] if section.title else [""]
    out += [section.caption, ""] if section.caption else []
    return out + [table(header, list(section.rows(runs)))]


def overhead_status(ratio, control, target):
    """Met, missed, or not resolved by a measurement as noisy as this."""
    # How far two identical classifiers differ, and how much both ratios
    # spread from step to step.
    noise = (ratio["q3"] - ratio["q1"]) / 2
    if control:
        noise = max(noise, abs(control["median"] - 1),
                    (control["q3"] - control["q1"]) / 2)
    if ratio["median"] - 1 <= target:
        return "met"
    return "not resolved" if ratio["median"] - 1 <= noise else "missed"


def classifier_goal(e2e, layer_runs, mode, target, models=None):
    """The cells `(measured, status)` of a classifier-overhead goal.

    `mode` is `"train"` or `"inference"`, `target` the largest overhead
    that meets the goal (e.g. `0.01`), `models` the backbones counted
    (default: all). A paired timing within its noise defers to the layer's
    own time (from the layer-cost runs) over the classifier's step.
    """
    measured, statuses, over = [], [], []
    layer = {p["environment"]["backend"]: layer_index(p) for p in layer_runs}
    for payload in e2e:
        backend = payload["environment"]["backend"]
        for r in payload["results"]:
            if models and r["model"] not in models:
                continue
            ratio = r[f"{mode}_ratio_isobn_to_none"]
            control = r.get(f"{mode}_ratio_control_to_none")
            statuses.append(overhead_status(ratio, control, target))
            key = (mode, "isobn", r["hidden_dim"], "float32")
            alone = layer.get(backend, {}).get(key)
            share = alone and alone / r[mode]["none"]["median_s"]
            cell = f"{backend} {r['model']}: {percent(ratio['median'])}"
            if control:
                cell += f" (control {percent(control['median'])})"
            if share:
                cell += f", layer alone {100 * share:.3f}%"
            measured.append(cell)
            if share and share > target:
                over.append(f"{backend} {r['model']} ({100 * share:.3f}%)")
    if not measured:
        return "not run", "-"
    if "missed" in statuses:
        return "; ".join(measured), "**missed**"
    if "not resolved" in statuses:
        return "; ".join(measured), "not resolved by the paired timing; " + (
            "**missed** by the layer alone on " + ", ".join(over)
            if over else "met by the layer alone"
        )
    return "; ".join(measured), "met"


def layer_goal(results):
    rows = breakdown(results.get("layer_cost", []))
    if not rows:
        return "not run", "-"
    ratios = collections.defaultdict(list)
    for r in rows:
        ratios[r["backend"]].append(r["ratio"])
    worst = max(rows, key=lambda r: r["ratio"])
    measured = "; ".join(f"{b}: {min(x):.1f}-{max(x):.1f}x"
                         for b, x in ratios.items())
    if worst["ratio"] <= LAYER_TARGET:
        return measured, "met"
    return measured, (
        f"**missed** (worst {worst['ratio']:.1f}x: {worst['backend']}, "
        f"d={worst['dim']}, {worst['dtype']}; see *Where IsoBN's train "
        "time goes* and [ANALYSIS.md](ANALYSIS.md))"
    )


def whitening_goal(results):
    rows = breakdown(results.get("layer_cost", []))
    largest = max((r["dim"] for r in rows), default=None)
    rows = [r for r in rows if r["dim"] == largest and r["zca_ratio"]]
    if not rows:
        return "not run", "-"
    return ("; ".join(f"{r['backend']} {r['dtype']}: {r['zca_ratio']:.0f}x"
                      for r in rows),
            status(min(r["zca_ratio"] for r in rows) >= 10))


def folded_goal(results):
    measured, same_everywhere = [], True
    for payload in results.get("end_to_end", []):
        for r in payload["results"]:
            folded = r["folded"]
            same = (folded["layers"] == folded["layers_without_isobn"]
                    and not folded["has_normalization"])
            same_everywhere &= same
            measured.append(
                f"{payload['environment']['backend']} {r['model']}: "
                + ("the same layers as without IsoBN" if same
                   else "a normalization is left")
                + f", logits within {folded['max_abs_logit_difference']:.0e}"
                + ", timed "
                + percent(r["inference_ratio_folded_to_none"]["median"])
            )
    if not measured:
        return "not run", "-"
    return "; ".join(measured), status(same_everywhere)


def import_goal(results):
    imports = [r for p in results.get("import_cost", []) for r in p["results"]]
    if not imports:
        return "not run", "-"
    met = all(max(r["ratios"].values()) <= IMPORT_TARGET for r in imports)
    return "; ".join(f"{r['backend']}: {r['ratios']['wall']:.2f}x time, "
                     f"{r['ratios']['peak_rss']:.2f}x memory"
                     for r in imports), status(met)


GOALS = [
    Goal("IsoBN train-step overhead, BERT-base classifier", "<= 1%",
         lambda results: classifier_goal(
             results.get("end_to_end", []), results.get("layer_cost", []),
             "train", 0.01, ("bert_base",))),
    Goal("IsoBN layer, train mode / its covariance product alone",
         f"<= {LAYER_TARGET}x", layer_goal),
    Goal("ZCA whitening / IsoBN, train mode, d=1024", ">= 10x",
         whitening_goal),
    Goal("IsoBN inference overhead, whole classifier", "< 0.1%",
         lambda results: classifier_goal(
             results.get("end_to_end", []), results.get("layer_cost", []),
             "inference", 0.001)),
    Goal("Same, export with the scale folded into the kernel", "0",
         folded_goal),
    Goal("`import keras_isobn` + a layer / `import keras`, time and peak "
         "memory", f"<= {IMPORT_TARGET}x", import_goal),
]


def render(results, others=()):
    """The Markdown of `results` (see `load_results`), linking `others`."""
    goals = [[g.name, g.target, *g.check(results)] for g in GOALS]
    out = [
        "# keras-isobn benchmarks",
        "",
        "Written by `python -m benchmarks.report` from the JSON files of "
        "this folder, which hold the raw numbers and the machine, load, "
        "backend, versions and date of each run. How each benchmark "
        "measures and what its numbers mean: [ANALYSIS.md](ANALYSIS.md). "
        "Rerun with `python -m benchmarks` (every benchmark and backend; "
        "`--help` for options) or one script at a time, e.g. `python -m "
        "benchmarks.layer_cost --backend jax`; the GPU check is "
        "`benchmarks/gpu_check.sh bundle GLUE_DIR OUT`, then `run OUT` on "
        "the GPU host.",
        "",
        "## Goals",
        "",
        table(["goal", "target", "measured", "status"], goals),
    ]
    for section in SECTIONS:
        out += write_section(section, results)
    if others:
        out += ["", "## Other results in this folder", ""]
        out += [f"- [{name}]({name})" for name in others]
    return "\n".join(out) + "\n"


def main(argv=None):
    """Writes the Markdown; returns its path."""
    parser = harness.command(__name__, {
        "results": (harness.RESULTS_DIR, "Folder of the JSON results."),
        "output": (None, "Markdown file to write (default: README.md in "
                   "--results)."),
        "include_quick": (False, "Summarise the --quick runs instead of the "
                          "full ones."),
    }, backends=(), threads=None, output=False, quick=False)
    args = harness.parse(parser, argv)
    results = load_results(args.results, quick=args.include_quick)
    path = args.output or os.path.join(args.results, "README.md")
    others = sorted(
        os.path.basename(p)
        for p in glob.glob(os.path.join(args.results, "*.md"))
        if os.path.basename(p) not in (os.path.basename(path), "ANALYSIS.md")
    )
    with open(path, "w") as f:
        f.write(render(results, others=others))
    return path


if __name__ == "__main__":
    print(main())
