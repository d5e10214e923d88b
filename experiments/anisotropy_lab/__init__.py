"""The anisotropy lab: a small BERT pretrained here, and IsoBN tested on it.

IsoBN exists for the anisotropic [CLS] embeddings of MLM-pretrained encoders.
No such checkpoint is reachable offline (MiniLM, the one at hand, is trained
contrastively and is near isotropic), so the lab builds one and tests the
paper's two claims on it, in three commands:

1. `pretrain` (`pretraining.py`): a WordPiece vocabulary and a
   `keras_hub.models.BertBackbone` trained as a masked LM on the training
   sentences of CoLA, SST-2, MRPC and STS-B, with fixed seeds; writes a
   KerasHub preset and its learning curve.
2. `anisotropy` (`anisotropy.py`): the paper's measures (EV_1, EV_3,
   per-feature std spread, correlated groups) of the pooled output and
   [CLS] on each task's dev sentences, beside the untrained network and
   MiniLM.
3. `experiment` (`fine_tuning.py`): `recipes/glue.py` over tasks x norms x
   seeds on the preset, then the report's tables and, for each norm against
   none, a paired comparison over seeds with a Student-t interval
   (`paired_statistics.py`; `tables`, also a command of its own). Arguments
   after `--` go to the recipe, the same for every norm.

`pretrain --from-preset DIR --pair-objective` adapts a pretrained BERT
(MiniLM) instead: masked-LM training on its own vocabulary, and its pooler
trained on real against drawn sentence pairs, as BERT's next-sentence
prediction trains it. `bundle` and `pretrain-bundle`
(`gpu_pretraining.py`) run `pretrain` on a GPU host without TensorFlow:
the first builds the pre-tokenized, pre-masked corpus and wheels here, the
second trains a larger BERT from it there and writes the preset.

Usage, from the repository root (the full lab, as committed in
`experiments/anisotropy_lab/results/`: about 2.5 hours on 2 cores):

```
python -m experiments.anisotropy_lab pretrain --glue-dir ../shared/glue \\
    --output /tmp/lab/preset
python -m experiments.anisotropy_lab anisotropy --preset /tmp/lab/preset \\
    --glue-dir ../shared/glue --output experiments/anisotropy_lab/results
python -m experiments.anisotropy_lab experiment --preset /tmp/lab/preset \\
    --glue-dir ../shared/glue --runs /tmp/lab/runs \\
    --output experiments/anisotropy_lab/results -- --train-limit 1000 \\
    --max-sequence-length 64 --batch-size 32 --epochs 3 --learning-rate 5e-4
python -m experiments.anisotropy_lab tables \\
    --runs experiments/anisotropy_lab/results/runs.jsonl \\
    --output experiments/anisotropy_lab/results
```
"""
