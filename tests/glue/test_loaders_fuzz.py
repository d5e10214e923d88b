"""Property-based tests: the GLUE TSV loader on damaged and foreign files.

Every file either loads, and then the split is consistent, or raises a
`ValueError` of the loader's own (not a bare `UnicodeDecodeError` or
`csv.Error`) with a one-line message that starts with the file's path and,
where a row is at fault, `line N`: the 1-based line an editor shows.
"""

import codecs
import os
import re
import tempfile

import numpy as np
import pytest
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_isobn.glue import TASKS
from keras_isobn.glue import load_split

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

# 25 examples per task and property, some 2,000 files in all: about 20
# seconds. No example database is written into the tree.
FUZZ = settings(max_examples=25, deadline=None, database=None)


class Layout:
    """The layout of one task's TSV files, read from its fixture."""

    def __init__(self, task):
        self.task = task
        folder = os.path.join(FIXTURES, task.tsv_folder)
        fixture = os.path.join(folder, sorted(os.listdir(folder))[0])
        with open(fixture, "rb") as file:
            raw = file.read()
        self.bom = codecs.BOM_UTF8 if raw.startswith(codecs.BOM_UTF8) else b""
        first = raw[len(self.bom) :].decode("utf-8").split("\n")[0]
        self.header = first.split("\t") if task.tsv_has_header else None
        self.num_fields = len(first.split("\t"))
        columns = task.tsv_text_columns + (task.tsv_label_column,)
        if self.header:
            columns = [self.header.index(name) for name in columns]
        *self.text_positions, self.label_position = columns

    def line_of(self, row_index):
        """The line number of row `row_index` (0-based) in `render`."""
        return row_index + 1 + (self.header is not None)

    def render(self, rows, ending="\n", final=True):
        """The file's bytes: its header, if any, then `rows`."""
        lines = ([self.header] if self.header else []) + list(rows)
        text = ending.join("\t".join(line) for line in lines)
        return self.bom + (text + (ending if final else "")).encode("utf-8")


LAYOUTS = {name: Layout(task) for name, task in TASKS.items()}
# Each property runs for every task, and draws any of its splits (MNLI's two
# dev files included).
every_task = pytest.mark.parametrize("name", sorted(TASKS))

# A field as GLUE files hold it: anything but a tab, a line break or a NUL.
fields = st.text(
    st.characters(
        blacklist_categories=("Cs",), blacklist_characters="\t\n\r\x00"
    ),
    max_size=12,
)
line_endings = st.sampled_from(["\n", "\r\n"])


def splits(name):
    return st.sampled_from(TASKS[name].splits)


@st.composite
def labels(draw, task):
    """A label as a GLUE file writes it, and the value it loads as."""
    if task.is_regression:
        score = draw(st.floats(0.0, 5.0))
        text = draw(
            st.sampled_from([repr(score), f"{score:.3f}", f"{score:g}"])
        )
        return text, float(text)
    class_id = draw(st.integers(0, task.num_classes - 1))
    text = draw(st.sampled_from([str(class_id), task.label_names[class_id]]))
    return text, class_id


@st.composite
def bad_labels(draw, task):
    """A label that no GLUE file of `task` holds."""
    if task.is_regression:
        words = "nan NaN inf -inf Infinity 1e39 -0.5 5.01".split()
        number = draw(st.floats().filter(lambda score: not 0 <= score <= 5))
    else:
        words = ["nan", "inf", "1.0", "neutral", str(task.num_classes)]
        words = [word for word in words if word not in task.label_names]
        number = draw(
            st.one_of(
                st.integers(max_value=-1),
                st.integers(min_value=task.num_classes),
                st.floats(-1e3, 1e3).filter(lambda x: x != int(x)),
            )
        )
    return draw(
        st.one_of(
            st.sampled_from(words + [""]),
            st.just(repr(number)),
            fields.map(lambda text: "x" + text),
        )
    )


@st.composite
def valid_files(draw, name, max_rows=5):
    """`(split, rows, labels)` of a valid file of task `name`."""
    split = draw(splits(name))
    layout = LAYOUTS[name]
    rows, values = [], []
    for _ in range(draw(st.integers(1, max_rows))):
        size = layout.num_fields
        row = draw(st.lists(fields, min_size=size, max_size=size))
        row[layout.label_position], value = draw(labels(layout.task))
        rows.append(row)
        values.append(value)
    return split, rows, values


def _load(name, split, data):
    """Loads `data` as the file of a split and checks the loader's contract.

    Returns `(glue_split, None, None)` if it loads, else `(None, message,
    line)`: the line the error names, `0` for an error about the whole file.
    """
    task = TASKS[name]
    with tempfile.TemporaryDirectory() as data_dir:
        path = task.tsv_path(data_dir, split)
        os.makedirs(os.path.dirname(path))
        with open(path, "wb") as file:
            file.write(data)
        try:
            result = load_split(name, split, data_dir=data_dir)
        except ValueError as error:
            message = str(error)
            assert type(error) is ValueError, repr(error)
            assert "\n" not in message, message
            where = re.match(re.escape(path) + r"(?:, line (\d+))?: ", message)
            assert where, message
            line = int(where.group(1) or 0)
            assert line <= data.count(b"\n") + 1, message
            return None, message, line
    assert len(result) > 0
    assert len(result.texts) == len(task.text_features)
    for column in result.texts:
        assert column.dtype == object and column.shape == (len(result),)
        assert all(type(text) is str for text in column)
    if task.is_regression:
        assert result.labels.dtype == np.float32
        assert np.all((result.labels >= 0) & (result.labels <= 5))
    else:
        assert result.labels.dtype == np.int32
        assert np.all(result.labels >= 0)
        assert np.all(result.labels < task.num_classes)
    return result, None, None


def _assert_loads(name, split, data, rows, values):
    result, message, _ = _load(name, split, data)
    assert result is not None, message
    layout = LAYOUTS[name]
    for column, position in zip(result.texts, layout.text_positions):
        assert column.tolist() == [row[position] for row in rows]
    expected = np.asarray(values, dtype=result.labels.dtype)
    np.testing.assert_array_equal(result.labels, expected)


def _assert_fails(name, split, data, line=None):
    result, message, named = _load(name, split, data)
    assert result is None, f"{data!r} loaded"
    if line is not None:
        assert named == line, message
    return message, named


@every_task
@FUZZ
@given(data=st.data())
def test_valid_files_load_exactly(name, data):
    split, rows, values = data.draw(valid_files(name))
    ending = data.draw(line_endings)
    layout = LAYOUTS[name]
    encoded = layout.render(rows, ending, final=data.draw(st.booleans()))
    _assert_loads(name, split, encoded, rows, values)


@every_task
@FUZZ
@given(data=st.data())
def test_random_bytes(name, data):
    split = data.draw(splits(name))
    encoded = data.draw(st.binary(max_size=600))
    if data.draw(st.booleans()):
        encoded = LAYOUTS[name].render([]) + encoded
    _load(name, split, encoded)


@every_task
@FUZZ
@given(data=st.data())
def test_valid_files_with_bytes_flipped_cut_or_inserted(name, data):
    split, rows, _ = data.draw(valid_files(name))
    raw = bytearray(LAYOUTS[name].render(rows))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw)))
        change = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if change == "flip" and at < len(raw):
            raw[at] = data.draw(st.integers(0, 255))
        elif change == "cut":
            del raw[at : at + data.draw(st.integers(1, 20))]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    _load(name, split, bytes(raw))


@every_task
@FUZZ
@given(data=st.data())
def test_rows_with_fields_removed_or_added(name, data):
    split, rows, _ = data.draw(valid_files(name))
    layout = LAYOUTS[name]
    index = data.draw(st.integers(0, len(rows) - 1))
    row = rows[index]
    if data.draw(st.booleans()):
        for _ in range(data.draw(st.integers(1, len(row) - 1))):
            del row[data.draw(st.integers(0, len(row) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 3))):
            row.insert(data.draw(st.integers(0, len(row))), data.draw(fields))
    assume(row != [""])  # A blank line, which is skipped.
    _assert_fails(name, split, layout.render(rows), layout.line_of(index))


@pytest.mark.parametrize(
    "name", [n for n in sorted(TASKS) if LAYOUTS[n].header]
)
@FUZZ
@given(data=st.data())
def test_header_with_fields_removed_or_added(name, data):
    layout = LAYOUTS[name]
    split = data.draw(splits(name))
    header = list(layout.header)
    if data.draw(st.booleans()):
        del header[data.draw(st.integers(0, len(header) - 1))]
    else:
        header.insert(data.draw(st.integers(0, len(header))), data.draw(fields))
    row = ["1"] * layout.num_fields
    for position in layout.text_positions:
        row[position] = "A text."
    text = "\t".join(header) + "\n" + "\t".join(row) + "\n"
    _, line = _assert_fails(name, split, layout.bom + text.encode("utf-8"))
    # A missing column is named on line 1, else the row does not fit.
    assert line in (1, 2)


STRAY = ['"', "'", '""', "\\", "\t", "\r", "\x00"]
STRAY += ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\ufeff"]


def _read_as(row):
    """The fields of `row` as read, or `None` if the row cannot be read.

    A tab splits a field, a CR is only read as part of a CRLF line ending,
    and a NUL is in no GLUE file.
    """
    line = "\t".join(row)
    body = line.rstrip("\r")
    if "\r" in body or "\x00" in line:
        return None
    return body.split("\t")


@every_task
@FUZZ
@given(data=st.data())
def test_stray_characters_in_texts(name, data):
    split, rows, values = data.draw(valid_files(name))
    layout = LAYOUTS[name]
    for _ in range(data.draw(st.integers(1, 4))):
        row = rows[data.draw(st.integers(0, len(rows) - 1))]
        position = data.draw(st.sampled_from(layout.text_positions))
        at = data.draw(st.integers(0, len(row[position])))
        stray = data.draw(st.sampled_from(STRAY))
        row[position] = row[position][:at] + stray + row[position][at:]
    read = [_read_as(row) for row in rows]
    faulty = [
        index
        for index, fields_read in enumerate(read)
        if fields_read is None or len(fields_read) != layout.num_fields
    ]
    if faulty:
        line = layout.line_of(faulty[0])
        _assert_fails(name, split, layout.render(rows), line)
    else:
        _assert_loads(name, split, layout.render(rows), read, values)


def _first_line_not_utf8(encoded):
    for number, line in enumerate(encoded.split(b"\n"), start=1):
        try:
            line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            return number
    return None


ENCODINGS = ["latin-1", "cp1252", "utf-16", "utf-16-le", "utf-16-be"]
ENCODINGS += ["utf-8-sig"]


@every_task
@FUZZ
@given(data=st.data())
def test_other_encodings(name, data):
    split, rows, values = data.draw(valid_files(name))
    encoding = data.draw(st.sampled_from(ENCODINGS))
    layout = LAYOUTS[name]
    accented = st.text(st.sampled_from("ab .\"'éüñßÆ€’“—"), max_size=12)
    for row in rows:
        for position in range(layout.num_fields):
            if position != layout.label_position:
                row[position] = data.draw(accented)
    text = layout.render(rows).decode("utf-8-sig")
    encoded = text.encode(encoding, errors="replace")
    if encoding.startswith("utf-16"):
        # Told on line 1: its ASCII is NUL bytes apart in UTF-16.
        _assert_fails(name, split, encoded, 1)
    elif encoding == "utf-8-sig":
        _assert_loads(name, split, encoded, rows, values)
    elif _first_line_not_utf8(encoded):
        _assert_fails(name, split, encoded, _first_line_not_utf8(encoded))
    else:
        # ASCII only, or bytes that happen to be UTF-8 too.
        result, message, _ = _load(name, split, encoded)
        assert result is not None, message


@every_task
@FUZZ
@given(data=st.data())
def test_empty_and_header_only_files(name, data):
    split = data.draw(splits(name))
    layout = LAYOUTS[name]
    blanks = st.lists(st.sampled_from(["", "\r", " ", "\t"]), max_size=3)
    lines = data.draw(blanks)
    if layout.header and data.draw(st.booleans()):
        lines = ["\t".join(layout.header)] + lines
    bom = data.draw(st.sampled_from([b"", codecs.BOM_UTF8]))
    encoded = bom + data.draw(line_endings).join(lines).encode("utf-8")
    _assert_fails(name, split, encoded)


@every_task
@FUZZ
@given(data=st.data())
def test_bad_labels(name, data):
    split, rows, _ = data.draw(valid_files(name))
    layout = LAYOUTS[name]
    index = data.draw(st.integers(0, len(rows) - 1))
    label = data.draw(bad_labels(layout.task))
    rows[index][layout.label_position] = label
    line = layout.line_of(index)
    message, _ = _assert_fails(name, split, layout.render(rows), line)
    assert repr(label)[:40] in message
