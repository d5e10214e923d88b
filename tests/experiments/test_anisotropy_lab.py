"""The anisotropy lab (`experiments.anisotropy_lab`) at a tiny size.

The full lab takes hours; here each piece runs end to end on the GLUE
sample: the masking, a few pretraining steps that write a KerasHub preset
(twice: the same command gives the same weights), the recipe fine-tuning
that preset, the anisotropy measures and the paired comparison.
"""

import json
import os

import keras
import numpy as np
import pytest
from scipy import stats

from experiments.anisotropy_lab import anisotropy
from experiments.anisotropy_lab import command_line
from experiments.anisotropy_lab import paired_statistics
from experiments.anisotropy_lab import pretraining
from keras_isobn import glue

TINY = (
    "--layers 1 --heads 2 --width 16 --sequence-length 32 "
    "--vocabulary-size 300 --batch-size 8 --steps 4 --log-every 2 "
    "--held-out 16 --corpus sst2 mrpc"
).split()


def _preprocessor(sequence_length=24):
    import keras_hub

    vocabulary = glue.sample_vocabulary_path()
    tokenizer = keras_hub.models.BertTokenizer(vocabulary, lowercase=True)
    return keras_hub.models.BertMaskedLMPreprocessor(
        tokenizer, sequence_length=sequence_length, mask_selection_length=5
    )


def test_masking_follows_bert_and_is_seeded():
    preprocessor = _preprocessor()
    singles, pairs = pretraining.read_corpus(
        glue.sample_data_dir(), "train", ["sst2", "mrpc"]
    )
    tokens = pretraining.pack_corpus(preprocessor, singles, pairs)
    assert len(tokens["token_ids"]) == len(singles) + len(pairs[0])
    assert tokens["segment_ids"][len(singles) :].max() == 1  # Pairs packed.
    x, y, weights = pretraining.mask_tokens(
        tokens, preprocessor, np.random.default_rng(0)
    )
    tokenizer = preprocessor.tokenizer
    ids = tokens["token_ids"]
    special = np.isin(ids, tokenizer.special_token_ids)
    count = weights.sum(axis=1)
    expected = np.clip(np.round((~special).sum(axis=1) * 0.15), 1, 5)
    np.testing.assert_array_equal(count, expected)
    rows = np.arange(len(ids))[:, None]
    chosen = weights > 0
    positions = x["mask_positions"]
    # Only ordinary tokens are chosen, each once; labels are the originals.
    assert not special[rows, positions][chosen].any()
    for row in range(len(ids)):
        chosen_positions = positions[row][chosen[row]]
        assert len(set(chosen_positions)) == len(chosen_positions)
    np.testing.assert_array_equal(y[chosen], ids[rows, positions][chosen])
    assert (y[~chosen] == 0).all()
    # 80% [MASK], 10% random, 10% kept; nothing else changes.
    new = x["token_ids"][rows, positions][chosen]
    mask_share = np.mean(new == tokenizer.token_to_id("[MASK]"))
    assert 0.7 < mask_share < 0.9
    assert 0.02 < np.mean(new == y[chosen]) < 0.2
    untouched = np.ones_like(ids, dtype=bool)
    untouched[rows.repeat(5, 1)[chosen], positions[chosen]] = False
    np.testing.assert_array_equal(x["token_ids"][untouched], ids[untouched])
    # The same seed, the same masks; another seed, others.
    again = pretraining.mask_tokens(
        tokens, preprocessor, np.random.default_rng(0)
    )
    np.testing.assert_array_equal(again[0]["token_ids"], x["token_ids"])
    other = pretraining.mask_tokens(
        tokens, preprocessor, np.random.default_rng(1)
    )
    assert (other[0]["mask_positions"] != positions).any()


def test_length_batches_cut_the_padding_and_cover_each_row_once():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 64, size=100)
    mask = (np.arange(64) < lengths[:, None]).astype("int32")
    x = {
        "token_ids": np.arange(100)[:, None] * mask,
        "padding_mask": mask,
        "segment_ids": 0 * mask,
        "mask_positions": np.zeros((100, 3), "int32"),
    }
    y, weights = np.arange(100)[:, None] * np.ones((1, 3), "int32"), None
    seen = []
    for bx, by, _ in pretraining.length_batches(
        x, y, np.ones((100, 3)), 8, np.random.default_rng(1)
    ):
        width = bx["token_ids"].shape[1]
        assert width % 16 == 0 and bx["mask_positions"].shape == (8, 3)
        row_lengths = bx["padding_mask"].sum(axis=1)
        assert (row_lengths <= width).all() and (row_lengths > width - 16).all()
        seen += by[:, 0].tolist()
    assert len(seen) == len(set(seen)) > 60  # Group remainders left out.
    del weights


def test_measure_finds_groups_and_spread():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(2000, 4))
    # Features 0-7 one correlated group (copies of z0 with a little noise),
    # the other 8 independent, with stds over two orders of magnitude.
    x = np.concatenate(
        [
            z[:, :1] + 0.05 * rng.normal(size=(2000, 8)),
            rng.normal(size=(2000, 8)) * np.logspace(-2, 0, 8),
        ],
        axis=1,
    )
    m = anisotropy.measure(x)
    assert m["correlated_share"] == pytest.approx(0.5)
    assert m["group_size_max"] == pytest.approx(8, rel=0.05)
    assert m["std_max"] / m["std_min"] > 50
    assert m["ev1"] > 0.8 and m["ev3"] >= m["ev1"]
    iso = anisotropy.measure(rng.normal(size=(4000, 16)))
    assert iso["correlated_share"] == 0 and iso["ev3"] < 0.25
    assert iso["group_size_median"] == pytest.approx(1, abs=0.05)


def test_paired_comparison_is_a_t_interval_over_seeds():
    results = []
    scores = {
        "none": [0.80, 0.82, 0.81, 0.79, 0.80],
        "isobn": [0.83, 0.84, 0.84, 0.81, 0.83],
        "batchnorm": [0.81, 0.80, 0.82, 0.80, 0.79],
    }
    for norm, values in scores.items():
        for seed, value in enumerate(values, start=1):
            results.append(
                {
                    "task": "mrpc",
                    "norm": norm,
                    "seed": seed,
                    "primary_metric": "f1",
                    "dev_metrics": {"f1": value},
                }
            )
    rows = {r["norm"]: r for r in paired_statistics.paired_comparison(results)}
    d = 100 * (np.array(scores["isobn"]) - np.array(scores["none"]))
    low, high = stats.t.interval(0.95, 4, loc=d.mean(), scale=stats.sem(d))
    assert rows["isobn"]["mean_difference"] == pytest.approx(d.mean())
    assert rows["isobn"]["low"] == pytest.approx(low)
    assert rows["isobn"]["high"] == pytest.approx(high)
    assert rows["isobn"]["claim"] == "better"
    assert rows["batchnorm"]["claim"] == "no claim"
    assert "isobn-unit" not in rows  # Not run: no row.
    # Bonferroni over the 2 comparisons: the 97.5% interval, wider.
    low, high = stats.t.interval(0.975, 4, loc=d.mean(), scale=stats.sem(d))
    assert rows["isobn"]["adjusted_confidence"] == pytest.approx(0.975)
    assert rows["isobn"]["adjusted_low"] == pytest.approx(low)
    assert rows["isobn"]["adjusted_high"] == pytest.approx(high)
    assert rows["isobn"]["adjusted_claim"] == "better"


def test_pretrain_is_repeatable_and_the_recipe_fine_tunes_the_preset(
    tmp_path, capfd
):
    import keras_hub

    data = glue.sample_data_dir()
    first, second = tmp_path / "a", tmp_path / "b"
    summary = command_line.main(
        ["pretrain", "--glue-dir", data, "--output", str(first), *TINY]
    )
    assert summary["corpus"]["sentences"] == 480  # SST-2's sample.
    assert summary["corpus"]["pairs"] == 480  # MRPC's sample.
    curve = (first / "pretraining.csv").read_text().splitlines()
    assert curve[0].startswith("step,epoch,train_loss,train_accuracy")
    assert len(curve) == 4  # Steps 0, 2 and 4.
    header = curve[0].split(",")
    for side in ("cls", "pooled"):
        for key in ("ev1", "ev3", "std_p95_p5", "correlated_share"):
            column = header.index(f"{side}_{key}")
            values = [float(row.split(",")[column]) for row in curve[1:]]
            assert all(np.isfinite(values)), (side, key)
            if key.startswith("ev"):
                assert all(0 < v <= 1 for v in values)
    command_line.main(
        ["pretrain", "--glue-dir", data, "--output", str(second), *TINY]
    )
    a = keras_hub.models.BertBackbone.from_preset(str(first))
    b = keras_hub.models.BertBackbone.from_preset(str(second))
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)
    tokens = (first / "assets" / "tokenizer" / "vocabulary.txt").read_text()
    assert tokens.split("\n")[:5] == pretraining.RESERVED_TOKENS
    # Trained: the weights moved away from a fresh initialisation.
    keras.utils.set_random_seed(0)
    fresh = keras_hub.models.BertBackbone.from_config(a.get_config())
    assert any(
        not np.allclose(w, f)
        for w, f in zip(a.get_weights(), fresh.get_weights())
    )

    # The recipe fine-tunes it like any preset, through the lab's command.
    runs, tables = tmp_path / "runs", tmp_path / "tables"
    out = command_line.main(
        ["experiment", "--preset", str(first), "--glue-dir", data]
        + ["--runs", str(runs), "--output", str(tables), "--task", "sst2"]
        + ["--norm", "none", "isobn-unit", "--seeds", "1", "--"]
        + ["--train-limit", "32", "--epochs", "1", "--batch-size", "16"]
        + ["--max-sequence-length", "32"]
    )
    result = json.loads(
        (runs / "sst2" / "isobn-unit" / "seed-1" / "results.json").read_text()
    )
    assert result["preset"] == str(first)
    # A preset, even on the sample's data: no "the sample cannot show" line.
    printed = capfd.readouterr().out
    assert "[glue] sst2/isobn-unit/seed-1: best epoch" in printed
    assert "The sample shows" not in printed
    assert result["hyperparameters"]["train_limit"] == 32
    assert 0.0 <= result["dev_metrics"]["accuracy"] <= 1.0
    assert out["paired"] == []  # One seed: no interval, no claim.
    (environment,) = (tables / "environments.jsonl").read_text().splitlines()
    environment = json.loads(environment)
    assert environment["cpu_model"] and environment["versions"]["keras"]
    for name in ("table1.md", "table2.md", "paired.md", "paired.json"):
        assert os.path.getsize(tables / name) > 0
    # The runs, one line each, beside the tables; and the tables again
    # from that file alone.
    lines = (tables / "runs.jsonl").read_text().splitlines()
    norms = [json.loads(line)["norm"] for line in lines]
    assert norms == ["none", "isobn-unit"]
    assert json.loads(lines[1]) == result
    table1 = (tables / "table1.md").read_text()
    again = command_line.main(
        ["tables", "--runs", str(tables / "runs.jsonl")]
        + ["--output", str(tables)]
    )
    assert again["paired"] == []
    assert (tables / "table1.md").read_text() == table1
    assert (tables / "runs.jsonl").read_text().splitlines() == lines

    # The anisotropy measures of the preset, beside an untrained twin.
    report = command_line.main(
        ["anisotropy", "--preset", str(first), "--glue-dir", data]
        + ["--output", str(tables), "--task", "mrpc", "--sequence-length", "32"]
    )
    encoders = {r["encoder"] for r in report["rows"]}
    assert {"lab, pretrained", "lab, untrained (same shape)"} <= encoders
    for row in report["rows"]:
        assert row["examples"] == 120  # MRPC's sample dev pairs.
        assert 0 < row["ev1"] <= row["ev3"] <= 1
    assert (tables / "anisotropy.md").read_text().count("| mrpc |") == len(
        report["rows"]
    )
    assert os.path.getsize(tables / "cls_std_lab.png") > 0
    assert (tables / "pretraining.csv").read_text() == (
        first / "pretraining.csv"
    ).read_text()
    assert os.path.getsize(tables / "pretraining.png") > 0


def _tiny_preset(folder, num_layers=1):
    """A tiny random BERT preset, standing for MiniLM's folder."""
    import keras_hub

    vocabulary = glue.sample_vocabulary_path()
    tokenizer = keras_hub.models.BertTokenizer(vocabulary, lowercase=True)
    keras.utils.set_random_seed(3)
    source = keras_hub.models.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=num_layers,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=64,
    )
    source.save_to_preset(str(folder))
    tokenizer.save_to_preset(str(folder))
    return source, tokenizer, vocabulary


def test_pretrain_continues_a_preset_on_its_own_vocabulary(tmp_path):
    import keras_hub

    preset = tmp_path / "preset"
    source, tokenizer, vocabulary = _tiny_preset(preset)

    argv = ["pretrain", "--glue-dir", glue.sample_data_dir()]
    argv += ["--from-preset", str(preset), "--sequence-length", "32"]
    argv += "--batch-size 8 --steps 2 --log-every 2 --held-out 16".split()
    argv += ["--corpus", "sst2"]
    summary = command_line.main(argv + ["--output", str(tmp_path / "a")])
    command_line.main(argv + ["--output", str(tmp_path / "b")])
    assert summary["vocabulary_size"] == tokenizer.vocabulary_size()
    assert summary["settings"]["from_preset"] == str(preset)
    a = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "a"))
    b = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "b"))
    assert a.get_config() == source.get_config()
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)  # The same command, the same.
    # Trained on from the preset's weights: near them, not equal.
    moved = [
        not np.array_equal(w, s)
        for w, s in zip(a.get_weights(), source.get_weights())
    ]
    assert any(moved)
    np.testing.assert_allclose(
        a.get_weights()[0], source.get_weights()[0], atol=0.05
    )
    vocabulary_file = tmp_path / "a" / "assets" / "tokenizer" / "vocabulary.txt"
    with open(vocabulary) as file:
        assert vocabulary_file.read_text().split() == file.read().split()
    # Masked-LM training does not reach the pooler: it stays as it was, but
    # for AdamW's weight decay where the backend gives it a zero gradient.
    pooler = [w.path for w in a.weights].index("pooled_dense/kernel")
    np.testing.assert_allclose(
        a.weights[pooler].numpy(), source.weights[pooler].numpy(), rtol=1e-4
    )
    assert summary["backbone"]["hidden_dim"] == 16
    assert "layers" not in summary["settings"]  # The preset's, not ours.

    # The pair objective trains it, and the curve follows the pair head.
    pair = command_line.main(
        argv[:-1]
        + ["mrpc", "--pair-objective", "--output", str(tmp_path / "c")]
    )
    command_line.main(
        argv[:-1]
        + ["mrpc", "--pair-objective", "--output", str(tmp_path / "d")]
    )
    c = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "c"))
    d = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "d"))
    for wc, wd in zip(c.get_weights(), d.get_weights()):
        np.testing.assert_array_equal(wc, wd)  # Pairs drawn from the seed.
    assert not np.allclose(
        c.weights[pooler].numpy(), source.weights[pooler].numpy(), rtol=1e-4
    )
    curve = (tmp_path / "c" / "pretraining.csv").read_text().splitlines()
    header = curve[0].split(",")
    for key in ("held_out_pair_accuracy", "train_mlm_loss", "pooled_ev3"):
        assert np.isfinite(float(curve[-1].split(",")[header.index(key)]))
    assert 0 <= pair["final"]["held_out_pair_accuracy"] <= 1


def test_pretrain_trains_only_the_top_layers_asked(tmp_path):
    import keras_hub

    preset = tmp_path / "preset"
    source, _, _ = _tiny_preset(preset, num_layers=2)
    argv = ["pretrain", "--glue-dir", glue.sample_data_dir()]
    argv += ["--from-preset", str(preset), "--sequence-length", "32"]
    argv += "--batch-size 8 --steps 2 --log-every 2 --held-out 16".split()
    argv += ["--corpus", "mrpc", "--pair-objective"]
    summary = command_line.main(
        argv + ["--train-top-layers", "1", "--output", str(tmp_path / "a")]
    )
    assert summary["settings"]["train_top_layers"] == 1
    a = keras_hub.models.BertBackbone.from_preset(str(tmp_path / "a"))
    trained = ("transformer_layer_1/", "pooled_dense/")
    for new, old in zip(a.weights, source.weights):
        if new.path.startswith(trained):
            continue
        # Frozen: not even AdamW's weight decay moves them.
        np.testing.assert_array_equal(new.numpy(), old.numpy(), new.path)
    for path in ("transformer_layer_1/", "pooled_dense/"):
        assert any(
            not np.array_equal(new.numpy(), old.numpy())
            for new, old in zip(a.weights, source.weights)
            if new.path.startswith(path)
        ), path
    # A count beyond the backbone's layers is refused, before the corpus is
    # read (the folder given here has none) and before anything is written.
    with pytest.raises(ValueError, match=r"--train-top-layers.*\[0, 2\]"):
        pretraining.freeze_below(a, 3)
    bad = [str(tmp_path / "no_glue") if x == argv[2] else x for x in argv]
    with pytest.raises(ValueError, match=r"--train-top-layers.*\[0, 2\]"):
        command_line.main(
            bad + ["--train-top-layers", "3", "--output", str(tmp_path / "b")]
        )
    assert not (tmp_path / "b").exists()


def test_drawn_pairs_swap_half_of_the_second_sentences_with_a_seed():
    preprocessor = _preprocessor(sequence_length=32)
    _, pairs = pretraining.read_corpus(glue.sample_data_dir(), tasks=["mrpc"])
    tokens, labels = pretraining.drawn_pairs(
        preprocessor, pairs, np.random.default_rng(0)
    )
    real = pretraining.pack_corpus(preprocessor, [], pairs)["token_ids"]
    kept = labels == 1
    assert 0.4 < kept.mean() < 0.6
    np.testing.assert_array_equal(tokens["token_ids"][kept], real[kept])
    # A drawn pair keeps its first sentence (its start: packing truncates
    # the longer sentence) and gets another second one.
    np.testing.assert_array_equal(
        tokens["token_ids"][~kept, :6], real[~kept, :6]
    )
    assert all(
        not np.array_equal(t, r)
        for t, r in zip(tokens["token_ids"][~kept], real[~kept])
    )
    again, _ = pretraining.drawn_pairs(
        preprocessor, pairs, np.random.default_rng(0)
    )
    np.testing.assert_array_equal(again["token_ids"], tokens["token_ids"])

    x, y, weights = pretraining.epoch_examples(
        pretraining.pack_corpus(
            preprocessor, ["a short one", "and two"], ([], [])
        ),
        preprocessor,
        np.random.default_rng(1),
        pairs,
    )
    assert len(x["token_ids"]) == 2 + len(labels)
    np.testing.assert_array_equal(weights["pair"][:2], [0, 0])
    assert weights["pair"][2:].min() == 1
    assert set(y["pair"][2:]) == {0, 1}
    with pytest.raises(ValueError, match="at least 2 sentence pairs"):
        pretraining.drawn_pairs(
            preprocessor, (["one"], ["two"]), np.random.default_rng(0)
        )
