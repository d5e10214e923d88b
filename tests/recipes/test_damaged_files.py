"""A file the recipe wrote, damaged on disk: the run ends as if it were not,
or stops with one line and exit status 1; nothing is deleted."""

import csv
import errno
import json
import os
import shutil

import numpy as np
import pytest

from keras_isobn import callbacks
from keras_isobn import files
from recipes import glue as recipe

# 3 epochs of 4 batches of the shipped SST-2 sample, on the built-in BERT.
ARGS = [
    *("--task", "sst2", "--norm", "isobn", "--epochs", "3"),
    *("--train-limit", "64", "--batch-size", "16"),
    *("--max-sequence-length", "24", "--verbose", "0"),
    "--no-report",
]
SEED_DIR = os.path.join("sst2", "isobn", "seed-1")


class Killed(Exception):
    """Stands for a kill right after the state of an epoch was saved."""


def run_recipe(output_dir, *extra):
    return recipe.main([*ARGS, "--output-dir", str(output_dir), *extra])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("uninterrupted")
    (results,) = run_recipe(output_dir)
    return output_dir / SEED_DIR, results


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A run stopped after its second epoch's state was written."""
    output_dir = tmp_path_factory.mktemp("killed")
    on_epoch_end = callbacks.TrainingCheckpoint.on_epoch_end

    def stop_after_two(self, epoch, logs=None):
        on_epoch_end(self, epoch, logs)
        if epoch == 1:
            raise Killed

    callbacks.TrainingCheckpoint.on_epoch_end = stop_after_two
    try:
        with pytest.raises(Killed):
            run_recipe(output_dir)
    finally:
        callbacks.TrainingCheckpoint.on_epoch_end = on_epoch_end
    backup = output_dir / SEED_DIR / "backup"
    # The last two states, each with its checksum.
    assert {"state.npz", "state-1.npz", "best.npz"} <= set(os.listdir(backup))
    for name in ("state.npz", "state-1.npz", "best.npz"):
        assert (backup / f"{name}.sha256").is_file()
    return output_dir


def comparable(results):
    """`results.json` without what may differ: times and the resume flag."""
    results = json.loads(json.dumps(results))
    for row in results["epochs"]:
        del row["epoch_time_s"]
    for key in ("train_time_s", "wall_time_s", "resumed"):
        del results[key]
    return results


def damage(path, kind):
    """Damages `path` in place (every hard link to it too)."""
    content = path.read_bytes()
    with open(path, "r+b") as file:
        if kind == "truncate":
            file.truncate(len(content) // 3)
        elif kind == "empty":
            file.truncate(0)
        else:  # "flip": one byte in the middle, inverted.
            file.seek(len(content) // 2)
            file.write(bytes([content[len(content) // 2] ^ 0xFF]))


def csv_rows(path):
    """The rows of `epochs.csv`, without the epochs' times."""
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    return [{k: v for k, v in r.items() if k != "epoch_time_s"} for r in rows]


def assert_as_uninterrupted(seed_dir, results, uninterrupted):
    expected_dir, expected = uninterrupted
    assert comparable(results) == comparable(expected)
    with open(seed_dir / "results.json") as file:
        assert comparable(json.load(file)) == comparable(expected)
    got = np.load(seed_dir / "dev_predictions.npz")["validation"]
    want = np.load(expected_dir / "dev_predictions.npz")["validation"]
    np.testing.assert_array_equal(got, want)
    assert csv_rows(seed_dir / "epochs.csv") == csv_rows(
        expected_dir / "epochs.csv"
    )
    for name in ("results.json", "dev_predictions.npz", "best.keras"):
        assert files.verified(str(seed_dir / name)), name
    assert not any(".partial" in name for name in os.listdir(seed_dir))


def copy(source, tmp_path):
    shutil.copytree(source, tmp_path / "out")
    return tmp_path / "out", tmp_path / "out" / SEED_DIR


@pytest.mark.parametrize("kind", ["truncate", "flip", "empty"])
def test_damaged_newest_state_resumes_from_the_one_before(
    killed, uninterrupted, tmp_path, kind, capsys
):
    output_dir, seed_dir = copy(killed, tmp_path)
    state = seed_dir / "backup" / "state.npz"
    damage(state, kind)
    (results,) = run_recipe(output_dir)
    captured = capsys.readouterr()
    assert f"{state} is damaged" in captured.err
    assert "resuming after epoch 1" in captured.out
    assert_as_uninterrupted(seed_dir, results, uninterrupted)
    # Set aside, not deleted.
    assert (seed_dir / "backup" / "state.npz.damaged").is_file()


@pytest.mark.parametrize(
    "name, kind",
    [
        ("epochs.csv", "truncate"),
        ("ev_before.json", "empty"),
    ],
)
def test_other_damaged_files_of_a_killed_run_are_made_again(
    killed, uninterrupted, tmp_path, name, kind, capsys
):
    output_dir, seed_dir = copy(killed, tmp_path)
    damage(seed_dir / name, kind)
    (results,) = run_recipe(output_dir)
    assert_as_uninterrupted(seed_dir, results, uninterrupted)
    assert "is damaged" in capsys.readouterr().err
    folder, _, base = (seed_dir / name).parent, None, os.path.basename(name)
    assert any(n.startswith(f"{base}.damaged") for n in os.listdir(folder))


def test_no_whole_state_stops_with_one_line_then_restart(
    killed, uninterrupted, tmp_path, capsys
):
    output_dir, seed_dir = copy(killed, tmp_path)
    backup = seed_dir / "backup"
    damage(backup / "state.npz", "truncate")
    damage(backup / "state-1.npz", "flip")
    before = sorted(os.listdir(backup))
    with pytest.raises(SystemExit) as info:
        run_recipe(output_dir)
    assert info.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("python recipes/glue.py: error: No saved state")
    assert "state.npz" in line and "state-1.npz" in line
    assert "--restart" in line and str(seed_dir) in line
    assert sorted(os.listdir(backup)) == before  # Nothing changed.

    # The fix the line names: the old run is kept, the new one starts.
    (results,) = run_recipe(output_dir, "--restart")
    assert_as_uninterrupted(seed_dir, results, uninterrupted)
    kept = output_dir / SEED_DIR.replace("seed-1", "seed-1.restarted")
    assert sorted(os.listdir(kept / "backup")) == before


def test_damaged_best_state_stops_with_one_line(
    killed, uninterrupted, tmp_path, capsys
):
    # The best epoch is the first (the sample's scores), whose state is
    # best.npz alone once the last two are kept: nothing to take it from.
    assert uninterrupted[1]["best_epoch"] == 1
    output_dir, seed_dir = copy(killed, tmp_path)
    best = seed_dir / "backup" / "best.npz"
    damage(best, "flip")
    with pytest.raises(SystemExit) as info:
        run_recipe(output_dir)
    assert info.value.code == 1
    warning, line = capsys.readouterr().err.strip().splitlines()
    assert f"{best} is damaged" in warning
    assert line.startswith("python recipes/glue.py: error: No whole file")
    assert str(best) in line and "--restart" in line
    assert (seed_dir / "backup" / "best.npz.damaged").is_file()
    # Again: the same line (the damaged file stays set aside).
    with pytest.raises(SystemExit) as info:
        run_recipe(output_dir)
    assert info.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "No whole file" in line and "best.npz: missing" in line

    (results,) = run_recipe(output_dir, "--restart")
    assert_as_uninterrupted(seed_dir, results, uninterrupted)
    kept = output_dir / SEED_DIR.replace("seed-1", "seed-1.restarted")
    assert (kept / "backup" / "best.npz.damaged").is_file()


@pytest.mark.parametrize(
    "name, kind",
    [
        ("results.json", "truncate"),
        ("results.json", "flip"),
        ("results.json", "empty"),
        ("dev_predictions.npz", "flip"),
        ("best.keras", "truncate"),
    ],
)
def test_a_finished_run_with_a_damaged_file_is_run_again(
    uninterrupted, tmp_path, name, kind, capsys
):
    output_dir, seed_dir = copy(uninterrupted[0].parents[2], tmp_path)
    damage(seed_dir / name, kind)
    (results,) = run_recipe(output_dir)
    assert f"{seed_dir / name} is damaged" in capsys.readouterr().err
    assert_as_uninterrupted(seed_dir, results, uninterrupted)
    assert (seed_dir / f"{name}.damaged").is_file()
    # Whole again: the next start skips it.
    (again,) = run_recipe(output_dir)
    assert "done already; skipped" in capsys.readouterr().out
    assert again == json.loads((seed_dir / "results.json").read_text())


def test_a_run_from_before_checksums_is_kept(uninterrupted, tmp_path, capsys):
    output_dir, seed_dir = copy(uninterrupted[0].parents[2], tmp_path)
    for name in os.listdir(seed_dir):
        if name.endswith(".sha256"):
            os.remove(seed_dir / name)
    (results,) = run_recipe(output_dir)
    assert "done already; skipped" in capsys.readouterr().out
    assert comparable(results) == comparable(uninterrupted[1])
    assert (seed_dir / "results.json.sha256").is_file()  # Written now.


def test_a_full_disk_keeps_the_last_state(
    killed, uninterrupted, tmp_path, monkeypatch, capsys
):
    output_dir, seed_dir = copy(killed, tmp_path)
    state = seed_dir / "backup" / "state.npz"
    before = state.read_bytes()
    savez = np.savez

    def full(path, *args, **kwargs):
        with open(path, "wb") as file:
            file.write(b"PK half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(SystemExit) as info:
        run_recipe(output_dir)
    assert info.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "The disk is full" in line and str(state) in line
    assert state.read_bytes() == before
    assert files.verified(str(state))
    assert not any(".partial" in n for n in os.listdir(state.parent))

    monkeypatch.setattr(np, "savez", savez)
    (results,) = run_recipe(output_dir)
    assert_as_uninterrupted(seed_dir, results, uninterrupted)
