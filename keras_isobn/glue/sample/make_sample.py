"""Writes the sample GLUE dataset shipped with keras-isobn.

The sample is synthetic, written from small word lists by a seeded random
generator, so that `python recipes/glue.py` runs offline in minutes. It has
three tasks in the original GLUE TSV formats (headers and MRPC's byte-order
mark included), each with a label a small model can learn from the text:

- `SST-2/`: sentiment of a short review sentence, set by its sentiment
  words; in "X, but Y" sentences the clause after "but" decides.
- `MRPC/`: whether two news sentences are paraphrases: a paraphrase keeps
  every content word (with a synonym verb and another word order), a
  non-paraphrase changes two of the four content slots.
- `STS-B/`: similarity score from 0 to 5 of two captions: 1.25 per content
  slot (who, doing what, with what, where) the two share, plus a small
  jitter.

In MRPC and STS-B a changed slot takes its word from a list the first
sentence never uses, so the label can also be read from the words of the
second sentence alone: the shortcut that lets a small model trained from
scratch learn the pair tasks in a few minutes.

`vocab.txt` lists BERT's special tokens, then every lower-cased word and
punctuation mark of the sample, so a lower-casing WordPiece tokenizer
covers the sample without `[UNK]`.

Run `python keras_isobn/glue/sample/make_sample.py` to rewrite the files;
the output is the same on every run.
"""

import os
import random
import re

__all__ = ["write_sample"]

NUM_TRAIN = 480
NUM_DEV = 120
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# SST-2.
POSITIVE = (
    "good great wonderful charming delightful brilliant moving funny "
    "beautiful clever fresh warm touching superb engaging lovely smart "
    "gripping inventive hilarious enjoyable stunning honest elegant"
).split()
NEGATIVE = (
    "bad dull boring awful tedious clumsy bland weak painful messy flat "
    "lifeless silly stale forgettable terrible annoying shallow predictable "
    "hollow sloppy tiresome lazy pointless"
).split()
WORKS = (
    "film movie story script plot cast acting direction dialogue ending "
    "soundtrack performance comedy drama thriller picture premise"
).split()
ADVERBS = "very really quite truly rather remarkably deeply often".split()
ASIDES = [
    "from start to finish",
    "at times",
    "for the most part",
    "in the end",
    "on the whole",
    "for two hours",
]

# MRPC and STS-B: each content slot has two word lists. The first sentence
# of a pair takes its words from the first list; a slot the second sentence
# changes takes a word from the second list. A model trained from scratch
# for a few minutes cannot learn to compare two sentences word by word, but
# it can learn which words signal a change.
AGENTS = (
    ["the company", "the minister", "the police", "the bank", "the team"],
    ["the union", "the court", "the mayor", "the council", "the board"],
)
VERB_SYNONYMS = [
    ("announced", "unveiled"),
    ("bought", "acquired"),
    ("reported", "disclosed"),
    ("criticized", "condemned"),
    ("approved", "backed"),
    ("rejected", "dismissed"),
    ("launched", "started"),
    ("closed", "shut"),
    ("signed", "completed"),
    ("delayed", "postponed"),
]
THEMES = (
    ["a new plan", "the deal", "the report", "a new factory", "the budget"],
    ["the contract", "the proposal", "the project", "the offer", "a tax cut"],
)
CITIES = (
    ["boston", "denver", "paris", "tokyo", "london", "sydney"],
    ["chicago", "dallas", "madrid", "berlin", "toronto", "seattle"],
)
DAYS = (
    ["monday", "tuesday", "wednesday", "thursday"],
    ["friday", "saturday", "sunday", "yesterday"],
)
ACTORS = (
    ["a man", "a woman", "a child", "a dog", "a cat"],
    ["a girl", "a boy", "a baby", "a bird", "a horse"],
)
ACTIONS = (
    ["playing", "riding", "eating", "holding", "carrying"],
    ["chasing", "pushing", "watching", "cutting", "throwing"],
)
OBJECTS = (
    ["a ball", "a guitar", "a bike", "an apple", "a box"],
    ["a rope", "a kite", "a bottle", "a book", "a hat"],
)
PLACES = (
    ["in the park", "on the beach", "in the kitchen", "on the street"],
    ["in a field", "near the river", "in the snow", "on a stage"],
)


def pair_slots(rng, slot_lists, num_changed):
    """Slot words of a pair of sentences that differ in `num_changed` slots."""
    first = [rng.choice(kept) for kept, _ in slot_lists]
    changed = set(rng.sample(range(len(slot_lists)), num_changed))
    second = [
        rng.choice(slot_lists[slot][1]) if slot in changed else word
        for slot, word in enumerate(first)
    ]
    return first, second


def sst2_example(rng):
    """Returns `(sentence, label)` with 1 for a positive sentence."""

    def clause(positive):
        words = POSITIVE if positive else NEGATIVE
        return rng.choice(
            [
                f"the {rng.choice(WORKS)} is {rng.choice(ADVERBS)} "
                f"{rng.choice(words)}",
                f"a {rng.choice(words)} {rng.choice(WORKS)} "
                f"{rng.choice(ASIDES)}",
                f"the {rng.choice(WORKS)} feels {rng.choice(words)} and "
                f"{rng.choice(words)}",
            ]
        )

    label = rng.randrange(2)
    if rng.random() < 0.2:
        sentence = f"{clause(not label)} , but {clause(label)}"
    else:
        sentence = clause(label)
    return f"{sentence} . ", label


def mrpc_example(rng):
    """Returns `(sentence1, sentence2, label)`, 1 for a paraphrase.

    A paraphrase keeps the agent, theme, city and day, with a synonym verb
    and another word order; a non-paraphrase changes two of them.
    """
    label = rng.randrange(2)
    slots1, slots2 = pair_slots(
        rng, [AGENTS, THEMES, CITIES, DAYS], num_changed=0 if label else 2
    )
    verb, synonym = rng.choice(VERB_SYNONYMS)
    agent, theme, city, day = slots1
    sentence1 = (
        f"{agent.capitalize()} {verb} {theme} in {city.capitalize()} on "
        f"{day.capitalize()} ."
    )
    agent, theme, city, day = slots2
    sentence2 = (
        f"On {day.capitalize()} , {agent} in {city.capitalize()} {synonym} "
        f"{theme} ."
    )
    return sentence1, sentence2, label


def stsb_example(rng):
    """Returns `(sentence1, sentence2, score)`, a score from 0 to 5.

    The score is 1.25 per slot (actor, action, object, place) the two
    captions share, plus a jitter in [-0.3, 0.3], clipped to [0, 5].
    """
    num_shared = rng.randrange(5)
    slots1, slots2 = pair_slots(
        rng, [ACTORS, ACTIONS, OBJECTS, PLACES], num_changed=4 - num_shared
    )
    score = 1.25 * num_shared + rng.uniform(-0.3, 0.3)
    score = min(5.0, max(0.0, score))

    def caption(actor, action, thing, place):
        return f"{actor.capitalize()} is {action} {thing} {place}."

    return caption(*slots1), caption(*slots2), score


def unique_examples(make_example, seed, count):
    """`count` examples of `make_example` with no repeated text."""
    rng = random.Random(seed)
    examples, seen = [], set()
    while len(examples) < count:
        example = make_example(rng)
        if example[:-1] not in seen:
            seen.add(example[:-1])
            examples.append(example)
    return examples


def write_tsv(path, header, rows, bom=False):
    """Writes a header line and tab-separated rows, LF line endings."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = [header] + ["\t".join(str(field) for field in row) for row in rows]
    with open(path, "w", encoding="utf-8", newline="\n") as file:
        file.write(("\ufeff" if bom else "") + "\n".join(lines) + "\n")


def write_sample(out_dir):
    """Writes the sample dataset and `vocab.txt` under `out_dir`."""
    count = NUM_TRAIN + NUM_DEV
    sst2 = unique_examples(sst2_example, 2, count)
    mrpc = unique_examples(mrpc_example, 3, count)
    stsb = unique_examples(stsb_example, 4, count)
    for split, part in (
        ("train", slice(0, NUM_TRAIN)),
        ("dev", slice(NUM_TRAIN, count)),
    ):
        write_tsv(
            os.path.join(out_dir, "SST-2", f"{split}.tsv"),
            "sentence\tlabel",
            sst2[part],
        )
        write_tsv(
            os.path.join(out_dir, "MRPC", f"{split}.tsv"),
            "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
            [
                (label, 2 * i + 100001, 2 * i + 100002, s1, s2)
                for i, (s1, s2, label) in enumerate(mrpc[part], part.start)
            ],
            bom=True,
        )
        write_tsv(
            os.path.join(out_dir, "STS-B", f"{split}.tsv"),
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\t"
            "sentence1\tsentence2\tscore",
            [
                (i, "main-captions", "MSRvid", "2012test", f"{i:04d}")
                + ("none", "none", s1, s2, f"{score:.3f}")
                for i, (s1, s2, score) in enumerate(stsb[part])
            ],
        )
    words = set()
    for example in sst2 + mrpc + stsb:
        for text in example[:-1]:
            words.update(re.findall(r"\w+|[^\w\s]", text.lower()))
    with open(os.path.join(out_dir, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(SPECIAL_TOKENS + sorted(words)) + "\n")


if __name__ == "__main__":
    write_sample(os.path.dirname(os.path.abspath(__file__)))
