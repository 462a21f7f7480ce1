"""MkDocs hook (mkdocs.yml ``hooks:``): a page line ``--8<-- "README.md:NAME"`` becomes the README's text
between ``<!-- --8<-- [start:NAME] -->`` and ``<!-- --8<-- [end:NAME] -->``, so the site repeats the README
instead of copying it. The README's relative links are written from the repository root; they are rewritten
for the including page (``docs/x.md`` becomes a link to that page; a file outside ``docs/`` becomes its path
in code, as the site does not serve it)."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

INCLUDE = re.compile(r'^--8<-- "README\.md:([\w-]+)"[ \t]*$', re.MULTILINE)
LINK = re.compile(r"\[([^\]]+)\]\((?![a-z]+:|#)([^)#\s]+)(#[^)\s]*)?\)")


def _section(readme: str, name: str) -> str:
    start, end = f"<!-- --8<-- [start:{name}] -->", f"<!-- --8<-- [end:{name}] -->"
    if readme.count(start) != 1 or readme.count(end) != 1:
        raise PluginError(f"README.md: section {name!r} needs exactly one {start} and one {end}")
    body = readme.split(start, 1)[1].split(end, 1)[0].strip("\n")
    if not body.strip():
        raise PluginError(f"README.md: section {name!r} is empty")
    return body


def _relink(body: str, page_uri: str) -> str:
    def fix(m: re.Match[str]) -> str:
        text, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if target.startswith("docs/"):
            return f"[{text}]({posixpath.relpath(target[len('docs/') :], posixpath.dirname(page_uri))}{anchor})"
        return f"`{target}`" if text.strip("`") == target else f"{text} (`{target}`)"

    return LINK.sub(fix, body)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace every README include line of the page with the section, its links rewritten for the page."""
    if not INCLUDE.search(markdown):
        return markdown
    readme = (Path(config["config_file_path"]).parent / "README.md").read_text(encoding="utf-8")
    return INCLUDE.sub(lambda m: _relink(_section(readme, m.group(1)), page.file.src_uri), markdown)
