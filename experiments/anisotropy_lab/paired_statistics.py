"""Each normalization against plain fine-tuning, paired by seed.

The runs of one seed share the data order and the classifier's
initialisation, so each norm is compared with `none` seed by seed: a
Student-t interval over the per-seed differences, and the same at the
Bonferroni level for all comparisons together.
"""

import numpy as np

from benchmarks import harness
from keras_isobn.glue.report import NORMS

__all__ = ["BASELINE", "paired_comparison", "paired_markdown"]

BASELINE = "none"


def _interval(differences, level):
    """The Student-t interval of the mean difference, and its claim."""
    from scipy import stats

    d = differences
    half = stats.t.ppf((1 + level) / 2, len(d) - 1) * (
        d.std(ddof=1) / np.sqrt(len(d))
    )
    low, high = d.mean() - half, d.mean() + half
    claim = "better" if low > 0 else "worse" if high < 0 else "no claim"
    return float(low), float(high), claim


def paired_comparison(results, confidence=0.95):
    """Each norm against none, paired by (task, seed): mean and t-intervals.

    Args:
        results: `results.json` dicts of one preset.
        confidence: Of the two-sided Student-t interval over the seeds.

    Returns:
        Rows `task, norm, seeds, differences, mean_difference, low, high,
        claim, adjusted_low, adjusted_high, adjusted_claim`, in points
        (x100) of the task's primary metric. `claim` is `"better"` or
        `"worse"` when the interval excludes zero, else `"no claim"`; the
        `adjusted_` ones are the same at the Bonferroni level for all the
        rows together (confidence `1 - (1 - confidence) / rows`), so that
        the chance of any false claim among them stays under
        `1 - confidence`.
    """
    score = {
        (r["task"], r["norm"], r["seed"]): 100
        * r["dev_metrics"][r["primary_metric"]]
        for r in results
    }
    pairs = []
    for task in dict.fromkeys(r["task"] for r in results):
        for norm in NORMS[1:]:  # Each but the baseline, `"none"`.
            seeds = sorted(
                s
                for t, n, s in score
                if t == task and n == norm and (task, BASELINE, s) in score
            )
            if len(seeds) >= 2:
                differences = [
                    score[task, norm, s] - score[task, BASELINE, s]
                    for s in seeds
                ]
                pairs.append((task, norm, np.array(differences)))

    adjusted = 1 - (1 - confidence) / max(len(pairs), 1)
    rows = []
    for task, norm, d in pairs:
        low, high, claim = _interval(d, confidence)
        a_low, a_high, a_claim = _interval(d, adjusted)
        rows.append(
            {
                "task": task,
                "norm": norm,
                "seeds": len(d),
                "differences": d.round(2).tolist(),
                "mean_difference": float(d.mean()),
                "low": low,
                "high": high,
                "claim": claim,
                "adjusted_confidence": adjusted,
                "adjusted_low": a_low,
                "adjusted_high": a_high,
                "adjusted_claim": a_claim,
            }
        )
    return rows


def paired_markdown(rows):
    """The rows of `paired_comparison` as a Markdown table."""
    level = rows[0]["adjusted_confidence"] if rows else 0.95
    header = [
        "task",
        "norm vs none",
        "seeds",
        "differences (points)",
        "mean",
        "95% interval",
        "claim",
        f"{100 * level:.2f}% interval (Bonferroni, {len(rows)} comparisons)",
        "claim",
    ]
    cells = [
        [
            r["task"],
            r["norm"],
            r["seeds"],
            " / ".join(f"{v:+.1f}" for v in r["differences"]),
            f"{r['mean_difference']:+.2f}",
            f"[{r['low']:+.2f}, {r['high']:+.2f}]",
            r["claim"],
            f"[{r['adjusted_low']:+.2f}, {r['adjusted_high']:+.2f}]",
            r["adjusted_claim"],
        ]
        for r in rows
    ]
    return harness.table(header, cells) + "\n"
