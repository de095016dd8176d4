"""Wikitext -> prose in one linear pass per construct (no parse tree).

What mwparserfromhell's tree did with one quadratic `remove` per node, a few regular-expression passes and two
bracket scanners do here, each linear in the page size (the order matters, see `clean_wikitext`):

- comments `<!-- -->` dropped (an unclosed one runs to the end of the page, as MediaWiki renders it);
- elements whose content is not prose dropped whole: `<ref>`, `<math>`, `<gallery>`, `<score>`, `<syntaxhighlight>`,
  `<timeline>`, HTML `<table>` ... (`_DROP_ELEMENTS`), self-closing ones too;
- templates `{{ }}` (nested, parser functions, magic-word calls) and tables `{| |}` (nested, or inside templates)
  dropped by a bracket scanner; an unclosed opener loses only its two characters;
- links `[[target|text]]`: the text kept (the target when there is none, the pipe trick undone); links to files,
  images, media, categories, interlanguage links and any namespace the dump names (`drop_prefixes`) dropped whole,
  with their nested caption links;
- external links `[url text]` -> text, `[url]` -> nothing; other HTML tags stripped, content kept (`<br>` -> space);
- bold/italic quotes and behaviour switches (`__NOTOC__`) dropped; HTML entities decoded;
- per line: headings dropped (`headings=True`: kept as "Title." before a non-empty section, with the enclosing
  headings not yet written, as WikiExtractor does),
  list items (`* # ;`) dropped as WikiExtractor and the BERT paper do, `:` indents kept without the colons, table
  residue (`| ! { }` at line start) and horizontal rules dropped. One paragraph per output line.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_DROP_ELEMENTS = (
    "ref",
    "references",
    "math",
    "chem",
    "ce",
    "gallery",
    "score",
    "timeline",
    "graph",
    "imagemap",
    "syntaxhighlight",
    "source",
    "pre",
    "code",
    "hiero",
    "mapframe",
    "maplink",
    "templatedata",
    "templatestyles",
    "noinclude",
    "includeonly",
    "table",
    "inputbox",
    "categorytree",
    "indicator",
    "section",
)
_ELEMENT = re.compile(r"<({})\b(?:[^>/]|/(?!>))*(?:/>|>.*?</\1\s*>)".format("|".join(_DROP_ELEMENTS)), re.I | re.S)
# innermost templates / tables / links: no opener of their own kind inside (single braces and brackets allowed)
_INNER_TEMPLATE = re.compile(r"\{\{[^{}]*(?:(?:\{(?!\{)|\}(?!\}))[^{}]*)*\}\}")
_INNER_TABLE = re.compile(r"\{\|[^{|]*(?:(?:\{(?!\|)|\|(?!\}))[^{|]*)*\|\}")
_INNER_LINK = re.compile(r"\[\[([^\[\]]*(?:(?:\[(?!\[)|\](?!\]))[^\[\]]*)*)\]\]")
_TEMPLATE_TOKEN = re.compile(r"\{\{|\}\}")
_TABLE_TOKEN = re.compile(r"\{\||\|\}")
_EXTERNAL = re.compile(r"\[(?:https?:|ftp:|mailto:|irc:|news:|//)[^\s\]\[<>\"]*[ \t]*([^\]\[\n]*)\]", re.I)
_BREAK = re.compile(r"<br\s*/?\s*>", re.I)
_TAG = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(?:\s[^<>]{0,500})?/?>")
_MAGIC = re.compile(r"__[A-Z]{2,}__")
_HEADING = re.compile(r"^(={1,6})\s*(.*?)\s*\1$")
_PAREN = re.compile(r"\s*\([^()]*\)\s*$")

_ALWAYS_DROP = ("file:", "image:", "media:", "category:")
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(?:-[a-z]{2,8})*:(?!\s)")
_MEDIA_FILE = re.compile(r"\.(jpe?g|png|svg|gif|tiff?|webp|ogg|ogv|oga|webm|mp3|mp4|wav|flac|mid|pdf|djvu)\s*$", re.I)


def drop_innermost(text: str, inner: re.Pattern, token: re.Pattern, opener: str, closer: str) -> str:
    """Remove balanced opener...closer spans, innermost first: one C-speed regex pass per nesting level (an
    infobox inside a template is two), then `drop_nested` for what is left unbalanced, if anything."""
    while opener in text:
        text, n = inner.subn("", text)
        if not n:
            break
    return drop_nested(text, token, opener, closer) if opener in text or closer in text else text


def drop_nested(text: str, token: re.Pattern, opener: str, closer: str) -> str:
    """Remove every balanced opener...closer span (nesting counted); a stray closer and an unclosed opener lose
    only their own two characters. Linear: one scan of the tokens (an unclosed opener rescans what follows it)."""
    if opener not in text:
        return text.replace(closer, "") if closer in text else text
    out: list[str] = []
    depth, keep_from, open_at = 0, 0, 0
    for m in token.finditer(text):
        if m.group() == opener:
            if depth == 0:
                out.append(text[keep_from : m.start()])
                open_at = m.start()
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                keep_from = m.end()
        else:  # a closer with no opener
            out.append(text[keep_from : m.start()])
            keep_from = m.end()
    if depth:  # the outermost opener never closed: drop just it, and clean what follows it on its own
        out.append(drop_nested(text[open_at + len(opener) :], token, opener, closer))
    else:
        out.append(text[keep_from:])
    return "".join(out)


def _link_text(inner: str, drop_prefixes: tuple[str, ...]) -> str:
    """What `[[inner]]` shows in the article: its text, or nothing for files, categories, interlanguage links."""
    target, pipe, label = inner.partition("|")
    t = target.strip().lower()
    if t.startswith(":"):  # [[:Category:X]] is a visible link, not a categorisation
        target, t = target.strip()[1:], t[1:]
    elif (
        t.startswith(_ALWAYS_DROP)
        or _INTERLANGUAGE.match(t)
        or (drop_prefixes and t.startswith(drop_prefixes))
        or _MEDIA_FILE.search(t)
    ):
        return ""
    if not pipe:
        return target.strip()
    if label.strip():
        return label
    return _PAREN.sub("", target.strip().partition(":")[2] or target.strip())  # the pipe trick [[A (b)|]] -> A


@functools.lru_cache(maxsize=8)
def _link_sub(drop_prefixes: tuple[str, ...]) -> Callable[[re.Match], str]:
    """The replacement for one innermost `[[...]]` match; plain links (no namespace, no file name: nearly all of
    them) take the short way."""

    def sub(m: re.Match) -> str:
        inner = m.group(1)
        if ":" not in inner:
            target, pipe, label = inner.partition("|")
            if "." not in target:
                if not pipe:
                    return target
                if label and not label.isspace():
                    return label
        return _link_text(inner, drop_prefixes)

    return sub


def replace_links(text: str, drop_prefixes: tuple[str, ...] = ()) -> str:
    """`[[...]]` -> the text each shows; nested links (captions inside file links) resolved innermost first, one
    regex pass per nesting level; an unclosed `[[` keeps its text and loses its brackets."""
    sub = _link_sub(drop_prefixes)
    while "[[" in text:
        text, n = _INNER_LINK.subn(sub, text)
        if not n:
            break
    return text.replace("[[", "").replace("]]", "") if "[[" in text or "]]" in text else text


def _lines(text: str, headings: bool) -> list[str]:
    """Paragraph lines of prose; headings, list items and table residue dropped (see the module docstring)."""
    paras: list[str] = []
    pending: dict[int, str] = {}  # level -> heading of the section the next prose is in (headings=True)
    for line in text.split("\n"):
        s = line.strip()
        if not s:
            continue
        c = s[0]
        if c == "=":
            m = _HEADING.match(s)
            if m:
                if headings:
                    _stack_heading(pending, len(m.group(1)), m.group(2).strip())
                continue
        if c in "*#;|!{}" or s.strip("-") == "":
            continue
        if c == ":":
            s = s.lstrip(":").strip()
            if not s:
                continue
        if pending:  # every level still open, outermost first, before the section's first prose
            paras.extend(pending[level] for level in sorted(pending))
            pending.clear()
        paras.append(s)
    return paras


def _stack_heading(pending: dict[int, str], level: int, title: str) -> None:
    """A heading replaces the pending ones at its level and deeper, and keeps those above it: WikiExtractor's
    compact() (`headers[lev] = title`, deeper levels deleted), so "== A ==" then "=== B ===" writes both."""
    for deeper in [k for k in pending if k >= level]:
        del pending[deeper]
    if title:
        pending[level] = title if title[-1] in "!?." else title + "."


def clean_wikitext(wikitext: str, drop_prefixes: tuple[str, ...] = (), headings: bool = False) -> str:
    """Wikitext -> prose, one paragraph per line (paragraphs separated by a blank line).

    `drop_prefixes`: lower-case link prefixes to drop as well — a dump's localized namespace names
    (`non_article_prefixes(dump_namespaces(dump))`, e.g. "tập tin:" for files in Vietnamese)."""
    text = wikitext
    if "<!--" in text:
        text = _COMMENT.sub("", text)
    if "<" in text:
        text = _ELEMENT.sub("", text)
    text = drop_innermost(text, _INNER_TEMPLATE, _TEMPLATE_TOKEN, "{{", "}}")
    text = drop_innermost(text, _INNER_TABLE, _TABLE_TOKEN, "{|", "|}")
    text = replace_links(text, drop_prefixes)
    if "[" in text:
        text = _EXTERNAL.sub(r"\1", text)
    if "<" in text:
        text = _TAG.sub("", _BREAK.sub(" ", text) if "<br" in text or "<BR" in text else text)
    if "''" in text:
        text = text.replace("'''", "").replace("''", "")  # bold, italic, both (5 = 3 + 2)
    if "__" in text:
        text = _MAGIC.sub("", text)
    if "&" in text:
        text = html.unescape(text)
    return "\n\n".join(_lines(text, headings))
