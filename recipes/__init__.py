"""Recipes: end-to-end training commands built on `keras_isobn`.

`python recipes/glue.py` (or `from recipes import glue`, from the
repository root) fine-tunes KerasHub text classifiers on GLUE with IsoBN.
"""
