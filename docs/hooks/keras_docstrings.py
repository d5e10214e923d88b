"""MkDocs hook: Markdown for the parts of Keras-style docstrings.

mkdocstrings parses a docstring's `Args:`, `Returns:` and `Raises:`; two
other parts of Keras's style would read wrongly as Markdown:

- The example: an unindented `Example:` paragraph of doctest lines
  (`>>> ...`, `... ...` and the expected output), which Markdown reads as
  nested block quotes. Each run of doctest lines, up to the next blank
  line, becomes a fenced `pycon` code block.
- Argument lists outside `Args:` (`Call arguments:`), which mkdocstrings
  shows as an admonition whose `name: description` lines would run into one
  paragraph. A block of two or more such entries, each followed by its
  indented continuation lines, becomes a bulleted list.

The hook adds one Markdown preprocessor, used by the pages and by
mkdocstrings alike.
"""

import re

import mkdocs.plugins
from markdown import Extension
from markdown.preprocessors import Preprocessor

PROMPT = re.compile(r"^(\s*)>>>( |$)")
FENCE = re.compile(r"^\s*(```|~~~)")
ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_]\w*): (\S.*)$")


def doctest_block(lines, index, indent):
    """The fenced lines of the doctest starting at `index`, and its end."""
    block = []
    while index < len(lines) and lines[index].strip():
        block.append(indent + lines[index][len(indent) :])
        index += 1
    fenced = [f"{indent}```pycon", *block, f"{indent}```", ""]
    return fenced, index


def argument_list(lines, index):
    """The bulleted list of the argument entries at `index`, and its end.

    Returns `None, index` unless two or more entries start there.
    """
    entries = []
    while index < len(lines):
        entry = ENTRY.match(lines[index])
        if entry:
            entries.append([f"`{entry.group(1)}`", entry.group(2)])
        elif entries and lines[index].startswith(" ") and lines[index].strip():
            entries[-1].append(lines[index].strip())
        else:
            break
        index += 1
    if len(entries) < 2:
        return None, index
    bullets = [f"- {name}: {' '.join(words)}" for name, *words in entries]
    return bullets + [""], index


class KerasDocstrings(Preprocessor):
    def run(self, lines):
        result = []
        in_fence = False
        index = 0
        while index < len(lines):
            line = lines[index]
            if FENCE.match(line):
                in_fence = not in_fence
            prompt = None if in_fence else PROMPT.match(line)
            after_blank = not result or not result[-1].strip()
            if prompt:
                if not after_blank:
                    result.append("")
                block, index = doctest_block(lines, index, prompt.group(1))
                result += block
                continue
            if not in_fence and after_blank and ENTRY.match(line):
                bullets, end = argument_list(lines, index)
                if bullets:
                    result += bullets
                    index = end
                    continue
            result.append(line)
            index += 1
        return result


class KerasDocstringsExtension(Extension):
    def extendMarkdown(self, md):
        # Before the fenced-code preprocessor (priority 25), so that the
        # blocks made here are read as code.
        md.preprocessors.register(KerasDocstrings(md), "keras_docstrings", 40)


@mkdocs.plugins.event_priority(100)  # Before mkdocstrings reads the list.
def on_config(config):
    config.markdown_extensions.append(KerasDocstringsExtension())
    return config
