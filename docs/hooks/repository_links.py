"""MkDocs hook: links from the docs to files of the repository outside docs/.

A link that starts with "/" names a file or folder of the repository from
its root, e.g. `[main job](/benchmarks/results/main_job.md)`, as GitHub
reads such links in a Markdown file. MkDocs does not validate absolute links
(`validation: absolute_links: info` in mkdocs.yml), so this hook does: a
link to a path that does not exist is a warning, which fails
`mkdocs build --strict`. When `repo_url` is set, the link is pointed at the
file in the repository, so it also works on the built site.

The README is not a page of the site, but it links into docs/ and to
results: the same check covers its relative links (and link definitions).
"""

import logging
import os
import re

log = logging.getLogger("mkdocs.hooks.repository_links")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # docs/hooks/ -> the repository
# A Markdown link or image whose target starts with one "/" (not "//").
LINK = re.compile(r"(\]\()(/(?!/)[^)\s#]*)((?:#[^)\s]*)?\))")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
# In the README: inline links and link definitions ("[name]: target").
README_LINK = re.compile(r"(?:\]\(|^\[[^\]]+\]:\s*)([^)\s#]+)", re.MULTILINE)


def on_pre_build(config):
    path = os.path.join(ROOT, "README.md")
    with open(path, encoding="utf-8") as file:
        readme = FENCE.sub("", file.read())
    for target in README_LINK.findall(readme):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not os.path.exists(os.path.join(ROOT, target.lstrip("/"))):
            log.warning(
                "README.md links to '%s', which is not a file or folder of "
                "the repository.",
                target,
            )


def on_page_markdown(markdown, page, config, files):
    repo_url = (config.get("repo_url") or "").rstrip("/")

    def check(match):
        path = match.group(2)
        if not os.path.exists(os.path.join(ROOT, path.lstrip("/"))):
            log.warning(
                "Doc file '%s' links to '%s', which is not a file or folder "
                "of the repository.",
                page.file.src_uri,
                path,
            )
            return match.group(0)
        if not repo_url:
            return match.group(0)
        return f"{match.group(1)}{repo_url}/blob/main{path}{match.group(3)}"

    parts = []
    start = 0
    for fence in FENCE.finditer(markdown):
        parts.append(LINK.sub(check, markdown[start : fence.start()]))
        parts.append(fence.group(0))
        start = fence.end()
    parts.append(LINK.sub(check, markdown[start:]))
    return "".join(parts)
