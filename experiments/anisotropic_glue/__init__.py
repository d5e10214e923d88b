"""The GLUE recipe on a simulated anisotropic encoder: MiniLM + a fixed map.

IsoBN's premise is an anisotropic [CLS] embedding: the paper measures EV_3
(the share of the variance on the top 3 principal components) of about
0.86 for BERT-base, per-feature stds spread over orders of magnitude and
clusters of highly correlated features. The MiniLM checkpoint we can load
offline is close to isotropic (EV_3 about 0.12 on GLUE sentences), and no
BERT-base weights or GPU are reachable here. So this experiment *simulates*
an anisotropic encoder: MiniLM whose pooled output passes through a fixed,
frozen linear map

```
M = R1 @ diag(s) @ R2 @ diag(t)
```

with `R1`, `R2` random rotations, `s_i = (i + 1) ** -p` a steep spectrum
(a few directions dominate, and `R2` spreads them over every feature, so
features form correlated groups), `t` per-feature scales log-uniform over
two orders of magnitude, `p` fitted by bisection so that EV_3 of the mapped
pooled outputs of the task's training sentences is `--target-ev`, and `M`
scaled so their total variance is the pre-trained one. The encoder is
fine-tuned as usual; the map stays fixed, so every normalization (none,
BatchNormalization, IsoBN, unit-variance IsoBN) sees features shaped like
the paper's. `recipes/glue.py` runs unchanged but for its classifier,
whose backbone is wrapped with the map; it measures EV_3 of the mapped
features before and after fine-tuning (its Table 2).

Usage:

```
python -m experiments.anisotropic_glue --glue-dir ../shared/glue \\
    --output-dir /tmp/anisotropic/runs -- --task stsb --norm none isobn \\
    --seeds 1 2 3 --train-limit 1000 --max-sequence-length 64 \\
    --learning-rate 1e-4 --epochs 4
```

Everything after `--` goes to `recipes/glue.py` (`--preset`, `--data-dir`
and `--output-dir` are set here). Writes `anisotropic_map_<task>.json` (the
fit: `p`, EV_3, per-feature stds and correlations before and after the map)
to `--output-dir`. The tables of the runs, and their `runs.jsonl`:
`python -m experiments.runs RUNS_DIR --output DIR`.
"""
