"""Runs the notebooks headless and checks the committed, executed copies.

Each notebook is written from its `.py` source (jupytext's percent format)
by `notebooks/build_notebooks.py`.

The notebooks run on their own backend (their first cell sets
`KERAS_BACKEND`), so `scripts/test.sh` runs this file on the TensorFlow pass
only.
"""

import importlib.util
import os

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "notebooks"
)
# Smaller sizes than the committed defaults, injected after the parameters
# cell as papermill does, so CI runs every cell in well under a minute each.
SMALL_PARAMETERS = {
    "01_cls_isotropy.ipynb": {
        "NUM_EXAMPLES": 96,
        "SEQUENCE_LENGTH": 32,
        "PASSES": 2,
        "HEAD_EPOCHS": 1,
    },
    "02_finetune_with_isobn.ipynb": {
        "PRESET": "tiny",
        "TRAIN_EXAMPLES": 64,
        "DEV_EXAMPLES": 32,
        "NORMALIZATIONS": [None, "batchnorm", "isobn"],
        "EPOCHS": 1,
        "BATCH_SIZE": 32,
        "LEARNING_RATE": 1e-3,
    },
}
NAMES = sorted(SMALL_PARAMETERS)
CELL_TIMEOUT = 600  # Seconds.


def read(name):
    return nbformat.read(os.path.join(NOTEBOOKS_DIR, name), as_version=4)


def code_cells(notebook):
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def contents(notebook):
    """What a notebook's source sets: the type, text and tags of each cell."""
    return [
        (cell.cell_type, cell.source, cell.metadata.get("tags"))
        for cell in notebook.cells
    ]


def parameters_index(notebook):
    indices = [
        index
        for index, cell in enumerate(notebook.cells)
        if "parameters" in cell.metadata.get("tags", [])
    ]
    assert len(indices) == 1, "a notebook needs one cell tagged 'parameters'"
    return indices[0]


def images(notebook):
    return [
        output
        for cell in code_cells(notebook)
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]


def build_module():
    path = os.path.join(NOTEBOOKS_DIR, "build_notebooks.py")
    spec = importlib.util.spec_from_file_location("build_notebooks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_notebook_is_tested():
    found = sorted(n for n in os.listdir(NOTEBOOKS_DIR) if n.endswith(".ipynb"))
    assert found == NAMES
    sources = [os.path.basename(path) for path in build_module().SOURCES]
    assert [os.path.splitext(n)[0] + ".py" for n in NAMES] == sources


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_matches_its_source(name):
    source = os.path.join(NOTEBOOKS_DIR, os.path.splitext(name)[0] + ".py")
    built = build_module().build(source)
    assert contents(read(name)) == contents(built), (
        f"{name} differs from its source: rebuild it (build_notebooks.py "
        "--execute)"
    )


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_was_run_top_to_bottom(name):
    notebook = read(name)
    cells = code_cells(notebook)
    # One run of every code cell, in order, from a fresh kernel.
    counts = [cell.execution_count for cell in cells]
    assert counts == list(range(1, len(cells) + 1)), counts
    errors = [
        output
        for cell in cells
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert not errors
    assert images(notebook), "the committed notebook shows no figure"
    # The parameters come first, the backend is chosen before `import keras`.
    assert cells.index(notebook.cells[parameters_index(notebook)]) <= 1
    backend_cell = next(
        i
        for i, c in enumerate(cells)
        if 'os.environ["KERAS_BACKEND"]' in c.source
    )
    keras_cell = next(
        i for i, c in enumerate(cells) if "import keras\n" in c.source
    )
    assert backend_cell < keras_cell
    # Kept small enough for git and GitHub.
    assert os.path.getsize(os.path.join(NOTEBOOKS_DIR, name)) < 2_000_000


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name):
    notebook = read(name)
    for cell in code_cells(notebook):
        cell.outputs = []
        cell.execution_count = None
    values = SMALL_PARAMETERS[name]
    source = "\n".join(f"{key} = {value!r}" for key, value in values.items())
    # Every injected name must be a parameter of the notebook.
    parameters = notebook.cells[parameters_index(notebook)].source
    for key in values:
        assert f"\n{key} = " in f"\n{parameters}", key
    injected = nbformat.v4.new_code_cell(source)
    injected.metadata["tags"] = ["injected-parameters"]
    notebook.cells.insert(parameters_index(notebook) + 1, injected)

    # Raises `CellExecutionError` on the first cell that fails.
    NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": NOTEBOOKS_DIR}},
    ).execute()

    assert all(cell.execution_count for cell in code_cells(notebook))
    assert len(images(notebook)) == len(images(read(name)))
