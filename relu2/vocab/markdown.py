"""Strings from outside (a measured folder, written where a pull request's code ran) in markdown that
renders exactly as written: one line, bounded, no heading, link, image, HTML, mention or table cell of
their own (docs/ci.md says why the judge needs this)."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# What markdown reads inside a line: code, emphasis, links and images, strikethrough, table cells.
# (A line of ours never starts with what the folder wrote, so #, >, - and digits need nothing.)
_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_\[\]|~])")
WORD_JOINER = "\u2060"


def plain(s: object, limit: int = 200) -> str:
    """One line: control, line-breaking and direction characters dropped, whitespace collapsed, at most
    ``limit`` characters."""
    text = " ".join(_CONTROL.sub(" ", str(s)).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def code(s: object, limit: int = 200) -> str:
    """``s`` as inline code in a markdown table cell: one line, bounded, fenced with one backtick more
    than its longest run, ``|`` escaped (GFM splits a table row at a pipe before it reads code spans)."""
    text = plain(s, limit).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}"


def prose(s: object, limit: int = 200) -> str:
    """``s`` as markdown text in a line of ours that renders as written: one line, bounded, HTML's ``&``
    and ``<`` escaped (no tag, no entity), the punctuation markdown reads inside a line
    backslash-escaped, and mentions (``@name``), references (``#12``) and bare links (``://``,
    ``www.``) broken by a word joiner, so a folder cannot ping, link, format or add a heading."""
    text = plain(s, limit)
    text = re.sub(r"([@#])(?=\w)", "\\1" + WORD_JOINER, text)
    text = text.replace("://", ":" + WORD_JOINER + "//").replace("www.", "www" + WORD_JOINER + ".")
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", text)
