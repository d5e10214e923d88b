import filecmp
import os
import re

import numpy as np
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.linear_model import Ridge

from keras_isobn.glue import compute_metrics
from keras_isobn.glue import load_split
from keras_isobn.glue import sample_data_dir
from keras_isobn.glue import sample_vocabulary_path
from keras_isobn.glue.sample import make_sample

SAMPLE_FILES = [
    os.path.join(folder, f"{split}.tsv")
    for folder in ("SST-2", "MRPC", "STS-B")
    for split in ("train", "dev")
] + ["vocab.txt"]


def _load(task, split):
    return load_split(task, split, data_dir=sample_data_dir())


def test_sample_files_exist():
    root = sample_data_dir()
    assert os.path.isdir(root)
    for name in SAMPLE_FILES:
        assert os.path.isfile(os.path.join(root, name)), name
    assert sample_vocabulary_path() == os.path.join(root, "vocab.txt")


def test_sample_is_what_the_generator_writes(tmp_path):
    make_sample.write_sample(str(tmp_path))
    written = sorted(
        os.path.relpath(os.path.join(folder, name), tmp_path)
        for folder, _, names in os.walk(tmp_path)
        for name in names
    )
    assert written == sorted(SAMPLE_FILES)
    _, mismatch, errors = filecmp.cmpfiles(
        sample_data_dir(), str(tmp_path), SAMPLE_FILES, shallow=False
    )
    assert mismatch == [] and errors == []


def test_sample_splits_sizes_and_labels():
    for task in ("sst2", "mrpc", "stsb"):
        train, dev = _load(task, "train"), _load(task, "validation")
        assert (len(train), len(dev)) == (480, 120)
        if task == "stsb":
            assert train.labels.min() >= 0.0 and train.labels.max() <= 5.0
        else:
            # Both classes well represented in each split.
            for split in (train, dev):
                assert 0.4 <= split.labels.mean() <= 0.6
        # No example of dev repeats one of train.
        assert not set(zip(*train.texts)) & set(zip(*dev.texts))


def test_mrpc_sample_keeps_the_byte_order_mark():
    path = os.path.join(sample_data_dir(), "MRPC", "train.tsv")
    with open(path, "rb") as file:
        assert file.read(3) == b"\xef\xbb\xbf"


def _words(text):
    return re.findall(r"\w+|[^\w\s]", text.lower())


def test_vocabulary_covers_every_word_of_the_sample():
    with open(sample_vocabulary_path(), encoding="utf-8") as file:
        vocabulary = file.read().splitlines()
    assert vocabulary[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(vocabulary) == len(set(vocabulary))
    assert all(token == token.lower() for token in vocabulary[5:])
    words = set()
    for task in ("sst2", "mrpc", "stsb"):
        for split in ("train", "validation"):
            for column in _load(task, split).texts:
                for text in column:
                    words.update(_words(text))
    assert words == set(vocabulary[5:])
    assert len(vocabulary) < 400


def test_wordpiece_tokenizer_maps_the_sample_without_unknowns():
    import keras_hub

    tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
        vocabulary=sample_vocabulary_path(), lowercase=True
    )
    unknown = tokenizer.token_to_id("[UNK]")
    for task in ("sst2", "mrpc", "stsb"):
        for column in _load(task, "validation").texts:
            token_ids = tokenizer(list(column))
            flat = np.concatenate([np.asarray(ids) for ids in token_ids])
            assert flat.size > 0 and unknown not in flat


def test_sst2_label_is_the_polarity_of_the_last_sentiment_word():
    positive, negative = set(make_sample.POSITIVE), set(make_sample.NEGATIVE)
    for split in ("train", "validation"):
        data = _load("sst2", split)
        for sentence, label in zip(data.texts[0], data.labels):
            polar = [w for w in sentence.split() if w in positive | negative]
            assert polar, sentence
            assert label == (polar[-1] in positive), sentence


def test_mrpc_label_is_whether_the_content_words_match():
    verbs = {verb for pair in make_sample.VERB_SYNONYMS for verb in pair}
    for split in ("train", "validation"):
        data = _load("mrpc", split)
        for sentence1, sentence2, label in zip(*data.texts, data.labels):
            content1 = set(_words(sentence1)) - verbs - {","}
            content2 = set(_words(sentence2)) - verbs - {","}
            assert label == (content1 == content2), (sentence1, sentence2)


def test_stsb_score_counts_the_shared_slots():
    caption = re.compile(r"^(\w+ \w+) is (\w+) (\w+ \w+) (\w+ \w+ \w+)\.$")
    for split in ("train", "validation"):
        data = _load("stsb", split)
        for sentence1, sentence2, score in zip(*data.texts, data.labels):
            slots1 = caption.match(sentence1.lower()).groups()
            slots2 = caption.match(sentence2.lower()).groups()
            shared = sum(a == b for a, b in zip(slots1, slots2))
            assert abs(score - 1.25 * shared) <= 0.3 + 1e-6
            assert 0.0 <= score <= 5.0


def _documents(split):
    if len(split.texts) == 1:
        return list(split.texts[0])
    # Mark the second sentence's words as separate features.
    return [
        first + " " + " ".join("2_" + word for word in second.split())
        for first, second in zip(*split.texts)
    ]


def test_labels_are_learnable_by_a_bag_of_words_baseline():
    # A linear model on word counts learns each sample task: a floor on
    # how learnable the labels are, far above chance.
    floors = {"sst2": 0.75, "mrpc": 0.9, "stsb": 0.9}
    for task, floor in floors.items():
        train, dev = _load(task, "train"), _load(task, "validation")
        vectorizer = CountVectorizer(token_pattern=r"[^ ]+")
        features = vectorizer.fit_transform(_documents(train))
        dev_features = vectorizer.transform(_documents(dev))
        if task == "stsb":
            model = Ridge(alpha=1.0).fit(features, train.labels)
            predictions = model.predict(dev_features)
        else:
            model = LogisticRegression(max_iter=2000)
            model.fit(features, train.labels)
            predictions = model.predict_proba(dev_features)
        scores = compute_metrics(task, dev.labels, predictions)
        assert scores[dev.task.primary_metric] >= floor, (task, scores)
