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


def test_damaged_files_are_set_aside_and_kept(tmp_path, capsys):
    run_dir = RunDirectory(str(tmp_path / "run"))
    run_dir.save("results.json", '{"a": 1}')
    run_dir.save("ev_before.json", '{"ev3_in": 0.5}')
    with open(run_dir.path("results.json"), "w") as file:
        file.write('{"a": 2}')
    assert run_dir.load_json("results.json") is None  # To be made again.
    assert "results.json is damaged" in capsys.readouterr().err
    assert run_dir.load_json("ev_before.json") == {"ev3_in": 0.5}
    assert run_dir.damaged(["ev_before.json", "missing.npz"]) == []
    with open(run_dir.path("ev_before.json"), "a") as file:
        file.write(" ")
    assert run_dir.damaged(["ev_before.json"]) == ["ev_before.json"]

    # A fresh start keeps what was set aside, in backup/ too.
    checkpoint = run_dir.checkpoint("score")
    os.makedirs(run_dir.path("backup"))
    open(run_dir.path("backup/state.npz.damaged"), "w").close()
    open(run_dir.path("backup/other"), "w").close()
    assert run_dir.start(checkpoint) is False
    assert sorted(os.listdir(run_dir.directory)) == [
        "backup",
        "ev_before.json.damaged",
        "ev_before.json.damaged.sha256",
        "results.json.damaged",
        "results.json.damaged.sha256",
    ]
    assert os.listdir(run_dir.path("backup")) == ["state.npz.damaged"]
    run_dir.finish()
    assert os.listdir(run_dir.path("backup")) == ["state.npz.damaged"]


def test_restart_keeps_the_old_folder(tmp_path):
    run_dir = RunDirectory(str(tmp_path / "run"))
    assert run_dir.restart() is None
    for number in (1, 2):
        run_dir.save("results.json", str(number))
        kept = run_dir.restart()
        suffix = "" if number == 1 else "-2"
        assert kept == str(tmp_path / f"run.restarted{suffix}")
        assert not os.path.exists(run_dir.directory)
        assert open(os.path.join(kept, "results.json")).read() == str(number)
