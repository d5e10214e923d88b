import json
import os
import subprocess
import sys
import textwrap

import keras
import pytest

import keras_isobn


def _run(code):
    """Runs `code` in a fresh Python with this backend; its last JSON line."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "KERAS_BACKEND": keras.config.backend(),
            "TF_CPP_MIN_LOG_LEVEL": "3",
        },
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_loads_keras_and_numpy_only():
    # Keras 3.15 itself imports matplotlib (keras.visualization), sklearn
    # (keras.wrappers) and, on JAX, scipy when they are installed: those
    # may be loaded, but by `import keras`, not by `keras_isobn`.
    loaded = _run(
        """
        import json
        import sys

        heavy = ["keras_hub", "matplotlib", "scipy", "sklearn", "tensorflow"]

        def loaded():
            return [name for name in heavy if name in sys.modules]

        import keras

        by_keras = loaded()
        import keras_isobn

        keras_isobn.IsoBatchNormalization()
        print(json.dumps({
            "backend": keras.config.backend(),
            "by_keras": by_keras,
            "by_isobn": loaded(),
            "submodules": sorted(
                name for name in sys.modules
                if name.startswith("keras_isobn.")
            ),
        }))
        """
    )
    backend = keras.config.backend()
    assert loaded["backend"] == backend
    assert "keras_hub" not in loaded["by_isobn"]
    assert ("tensorflow" in loaded["by_isobn"]) == (backend == "tensorflow")
    assert set(loaded["by_isobn"]) == set(loaded["by_keras"])
    for lazy in ("models", "export", "glue", "plots", "run_directory"):
        assert f"keras_isobn.{lazy}" not in loaded["submodules"], lazy


def test_all_names_resolve_once():
    names = keras_isobn.__all__
    assert len(names) == len(set(names))
    assert {"EVkCallback", "IsoBatchNormalization"} <= set(names)
    for name in names:
        assert getattr(keras_isobn, name) is not None, name
    assert keras_isobn.IsoBatchNormalization is (
        keras_isobn.layers.IsoBatchNormalization
    )
    assert keras_isobn.EVkCallback is keras_isobn.callbacks.EVkCallback
    # The isotropy functions are in `keras_isobn.isotropy` only.
    for name in (
        "explained_variance",
        "feature_std",
        "clustered_correlation",
        "logit_variance_share",
        "optimal_logit_variance_share",
    ):
        assert callable(getattr(keras_isobn.isotropy, name))
        assert not hasattr(keras_isobn, name), name
        assert name not in dir(keras_isobn)
    assert set(names) <= set(dir(keras_isobn))
    assert "__version__" in dir(keras_isobn)


def test_submodules_are_attributes_after_a_plain_import():
    found = _run(
        """
        import json
        import keras_isobn

        names = ["export", "distribution", "glue", "models", "batching",
                 "files", "run_directory", "mixed_precision", "optimizers",
                 "plots", "isotropy", "callbacks", "layers"]
        print(json.dumps({
            name: getattr(keras_isobn, name).__name__ for name in names
        }))
        """
    )
    assert found == {name: f"keras_isobn.{name}" for name in found}
    assert len(found) == 13


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        keras_isobn.no_such_thing  # noqa: B018
    assert not hasattr(keras_isobn, "ev_k")
    with pytest.raises(ImportError):
        from keras_isobn import no_such_module  # noqa: F401


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lines(*parts):
    """Lines of the file, or of the `.py` files under the folder, `parts`."""
    path = os.path.join(REPO_ROOT, *parts)
    if os.path.isfile(path):
        paths = [path]
    else:
        paths = [
            os.path.join(folder, name)
            for folder, _, names in os.walk(path)
            for name in names
            if name.endswith(".py")
        ]
    lines = {}
    for p in paths:
        with open(p, encoding="utf-8") as f:
            lines[p] = len(f.readlines())
    return lines


def test_the_layout_keeps_its_size_limits():
    # A front page, modules small enough to read, benchmarks smaller than
    # the library, a recipe that reads top to bottom.
    assert sum(_lines("README.md").values()) <= 180
    too_long = {p: n for p, n in _lines("keras_isobn").items() if n > 450}
    assert not too_long, f"Split these library modules: {too_long}"
    assert sum(_lines("benchmarks").values()) <= 4000
    assert sum(_lines("recipes").values()) <= 600
