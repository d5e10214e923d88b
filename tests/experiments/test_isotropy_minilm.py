"""`experiments.isotropy_minilm` on the GLUE sample, `--quick`."""

import json
import os

import keras

from experiments.isotropy_minilm import command_line
from keras_isobn.glue import sample_data_dir

BACKEND = keras.backend.backend()


def test_isotropy_minilm_measures_the_sample_dev_sets(tmp_path):
    path = command_line.main(
        ["--quick", "--data-dir", sample_data_dir()]
        + ["--output-dir", str(tmp_path), "--image-dir", str(tmp_path)]
    )
    with open(path) as f:
        payload = json.load(f)
    assert payload["environment"]["backend"] == BACKEND
    assert set(payload["results"]) == {"SST-2", "MRPC"}
    for result in payload["results"].values():
        assert result["examples"] == 32
        for embedding in ("pooled_output", "cls"):
            for values in result[embedding].values():
                assert 0 < values["ev1"] <= values["ev3"] <= values["ev10"] <= 1
    with open(os.path.splitext(path)[0] + ".md") as f:
        assert "| [CLS] | isobn |" in f.read()
    assert os.path.getsize(tmp_path / "minilm_cls_std.png") > 0
