import os

from keras_isobn.run_directory import RunDirectory
from tests.helpers.scored_training import Scores
from tests.helpers.scored_training import fit_scored
from tests.helpers.scored_training import isobn_model


def test_run_directory_writes_in_one_process(tmp_path):
    chief = RunDirectory(str(tmp_path / "run"))  # One process: the chief.
    other = RunDirectory(str(tmp_path / "run"), write=False)
    assert chief.write and not other.write
    assert chief.load_json("results.json") is None
    seen = []
    other.save("results.json", '{"a": 1}')
    other.save("model.keras", lambda path: seen.append(path) or open(
        path, "w").close())  # fmt: skip
    assert not (tmp_path / "run").exists()
    # A callable runs in every process (a model's save is collective), on
    # a private temporary path, deleted at once.
    assert seen and not seen[0].startswith(str(tmp_path))
    assert not os.path.exists(seen[0])
    chief.save("results.json", '{"a": 1}')
    assert other.load_json("results.json") == {"a": 1}

    checkpoint = chief.checkpoint("score")
    assert checkpoint.write and checkpoint.monitor == "score"
    assert checkpoint.csv_path == chief.path("epochs.csv")
    assert not other.checkpoint().write
    # No saved epoch: the writer empties the folder, the others do not.
    assert other.start(checkpoint) is False
    assert (tmp_path / "run" / "results.json").exists()
    assert chief.start(checkpoint) is False
    assert not (tmp_path / "run").exists()
    fit_scored(isobn_model(), [Scores([0.2]), checkpoint], epochs=1)
    assert chief.start(checkpoint) is True
    other.finish()
    assert os.path.exists(checkpoint.state_path)
    chief.finish()
    assert not (tmp_path / "run" / "backup").exists()
