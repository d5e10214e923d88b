import types

import numpy as np
import pytest
from matplotlib import image

from keras_isobn import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path, width, height):
    with open(path, "rb") as file:
        assert file.read(8) == PNG_SIGNATURE
    assert image.imread(path).shape[:2] == (height, width)


def test_std_histogram_counts_every_feature_on_a_log_axis(rng, tmp_path):
    std = np.exp(rng.normal(size=300))
    path = tmp_path / "std.png"
    figure = plots.plot_std_histogram(std, bins=20, title="std", path=path)
    _assert_png(path, 600, 400)
    (axes,) = figure.axes
    assert axes.get_xscale() == "log"
    heights = [patch.get_height() for patch in axes.patches]
    assert len(heights) == 20
    assert sum(heights) == 300
    assert axes.get_title() == "std"


def test_std_histogram_overlays_a_dict(rng, tmp_path):
    std = {"raw": np.exp(rng.normal(size=50)), "isobn": np.ones(50)}
    figure = plots.plot_std_histogram(std, path=tmp_path / "a" / "b.png")
    _assert_png(tmp_path / "a" / "b.png", 600, 400)
    (axes,) = figure.axes
    assert len(axes.containers) == 2
    texts = [text.get_text() for text in axes.get_legend().get_texts()]
    assert texts == ["raw", "isobn"]


def test_std_histogram_counts_features_off_the_axis_in_the_legend(rng):
    std = np.concatenate([np.exp(rng.normal(size=10)), [0.0, 0.0]])
    figure = plots.plot_std_histogram(std, bins=5)
    axes = figure.axes[0]
    assert sum(patch.get_height() for patch in axes.patches) == 10
    (text,) = axes.get_legend().get_texts()
    assert "(2 outside the axis)" in text.get_text()

    std = np.array([1e-30, 0.1, 0.2, 0.3, 5.0])
    figure = plots.plot_std_histogram(std, bins=4, limits=(0.05, 0.5))
    axes = figure.axes[0]
    assert axes.get_xlim()[0] <= 0.05 and axes.get_xlim()[1] >= 0.5
    assert [patch.get_height() for patch in axes.patches] == [0, 1, 1, 1]
    (text,) = axes.get_legend().get_texts()
    assert "(2 outside the axis)" in text.get_text()


def test_std_histogram_rejects_bad_values():
    with pytest.raises(ValueError, match="finite and >= 0"):
        plots.plot_std_histogram(np.array([1.0, np.nan, 2.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        plots.plot_std_histogram(np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="All standard deviations are 0"):
        plots.plot_std_histogram(np.zeros(3))
    with pytest.raises(ValueError, match="0 < low < high"):
        plots.plot_std_histogram(np.ones(3), limits=(0.0, 1.0))


def test_correlation_heatmap_shows_the_matrix(rng, tmp_path):
    correlation = np.corrcoef(rng.normal(size=(6, 40)))
    path = tmp_path / "rho.png"
    figure = plots.plot_correlation_heatmap(correlation, path=path)
    _assert_png(path, 500, 400)
    heatmap = figure.axes[0].images[0]
    np.testing.assert_array_equal(heatmap.get_array(), correlation)
    assert heatmap.get_clim() == (-1.0, 1.0)


def test_correlation_heatmap_side_by_side(rng):
    matrices = {"raw": np.eye(3), "isobn": -np.eye(3)}
    figure = plots.plot_correlation_heatmap(matrices, title="t")
    image_axes = [axes for axes in figure.axes if axes.images]
    assert [axes.get_title() for axes in image_axes] == ["raw", "isobn"]
    second = image_axes[1].images[0].get_array()
    np.testing.assert_array_equal(second, -np.eye(3))


def test_correlation_heatmap_rejects_a_non_square_matrix():
    with pytest.raises(ValueError, match="square"):
        plots.plot_correlation_heatmap(np.ones((2, 3)))


def test_ev_curves_from_a_callback_history(tmp_path):
    history = {
        "epoch": [0.0, 0.5, 1.0],
        "ev3_in": [0.9, 0.8, 0.7],
        "ev3_out": [0.9, 0.5, 0.4],
        "ev1_in": [0.6, 0.5, 0.4],
        "ev1_out": [0.6, 0.3, 0.2],
    }
    callback = types.SimpleNamespace(history=history)
    path = tmp_path / "ev.png"
    figure = plots.plot_ev_curves(callback, path=path)
    _assert_png(path, 600, 400)
    lines = {line.get_label(): line for line in figure.axes[0].lines}
    assert sorted(lines) == ["ev1_in", "ev1_out", "ev3_in", "ev3_out"]
    np.testing.assert_array_equal(lines["ev3_out"].get_xdata(), [0, 0.5, 1])
    np.testing.assert_array_equal(lines["ev3_out"].get_ydata(), [0.9, 0.5, 0.4])
    assert lines["ev3_in"].get_linestyle() == "--"
    assert lines["ev3_out"].get_linestyle() == "-"
    assert lines["ev3_in"].get_color() == lines["ev3_out"].get_color()
    assert lines["ev3_in"].get_color() != lines["ev1_in"].get_color()


def test_ev_curves_from_a_keras_history_use_epoch_numbers():
    history = types.SimpleNamespace(
        history={"loss": [3.0, 2.0], "ev3_out": [0.5, 0.4]}
    )
    figure = plots.plot_ev_curves(history)
    (line,) = figure.axes[0].lines
    np.testing.assert_array_equal(line.get_xdata(), [1, 2])


def test_ev_curves_reject_missing_or_misaligned_values():
    with pytest.raises(ValueError, match="EVkCallback"):
        plots.plot_ev_curves({"loss": [1.0]})
    with pytest.raises(ValueError, match="2 values for 3 epochs"):
        plots.plot_ev_curves({"epoch": [0, 1, 2], "ev3_in": [0.5, 0.4]})


def test_logit_variance_share_bars(tmp_path):
    shares = {
        "fine-tuned": np.array([0.7, 0.2, 0.05, 0.05]),
        "optimal": np.array([0.1, 0.1, 0.3, 0.5]),
    }
    path = tmp_path / "logits.png"
    figure = plots.plot_logit_variance_share(shares, top=3, path=path)
    _assert_png(path, 600, 400)
    axes = figure.axes[0]
    assert len(axes.containers) == 2
    for container, expected in zip(axes.containers, shares.values()):
        heights = [bar.get_height() for bar in container]
        np.testing.assert_array_equal(heights, expected[:3])


def test_figures_are_only_saved_as_png(tmp_path):
    with pytest.raises(ValueError, match="must end in '.png'"):
        plots.plot_logit_variance_share(np.ones(3) / 3, path=tmp_path / "x.pdf")
    assert not (tmp_path / "x.pdf").exists()
