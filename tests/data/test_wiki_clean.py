"""The linear wikitext cleaner on a corpus of tricky wikitext, each case with the prose it must give."""

from __future__ import annotations

import time

import pytest

from bertforge.data.wikiclean import clean_wikitext

VI = ("tập tin:", "thể loại:", "bản mẫu:", "wikipedia:")  # Vietnamese File, Category, Template, Wikipedia

CASES = {
    "nested templates": (
        "{{Infobox country|name={{lang|fr|France}}|capital={{nowrap|{{flag|Paris}}}}}}France is a country.",
        "France is a country.",
    ),
    "table inside a template": (
        '{{Navbox|list1=\n{| class="wikitable"\n|-\n| a || b\n|}\n}}\nTables are gone.',
        "Tables are gone.",
    ),
    "nested tables": ('Before.\n{| class="x"\n|-\n|\n{|\n| inner\n|}\n| outer cell\n|}\nAfter.', "Before.\n\nAfter."),
    "ref with a template inside": (
        'Paris is big.<ref name="a/b">{{cite web|url=http://x.org|title=Source}}</ref> It is old.<ref name=c/>',
        "Paris is big. It is old.",
    ),
    "template with a ref inside": ("Rome{{efn|A note.<ref>{{cite book|title=B}}</ref>}} is older.", "Rome is older."),
    "math": (
        'The area is <math>\\pi r^{2} = {{x}}</math> square units, as <math display="block">a|}b</math> shows.',
        "The area is  square units, as  shows.",
    ),  # spaces are collapsed later, by clean_document
    "gallery": (
        'Pictures:\n<gallery mode="packed">\nFile:A.jpg|A [[cat]]\nImage:B.png|B\n</gallery>\nThe end.',
        "Pictures:\n\nThe end.",
    ),
    "comments": (
        "Visible <!-- hidden [[link]] {{t}} --> text.<!-- unclosed comment runs to the end\nnever shown",
        "Visible  text.",
    ),
    "external links with and without text": (
        "See [https://example.org the site] and [http://example.com] or [//x.org/y?a=b Foo Bar].",
        "See the site and  or Foo Bar.",
    ),
    "interwiki and category links": (
        "Berlin is a [[city]] in [[Germany|Deutschland]].\n[[de:Berlin]]\n[[Category:Cities]]\n[[fr:Berlin]]",
        "Berlin is a city in Deutschland.",
    ),
    "visible category and interwiki links": (
        "See [[:Category:Cities|the cities]], [[wikt:house|house]] and [[:fr:Paris|Paris]].",
        "See the cities, house and Paris.",
    ),
    "file link with nested caption links": (
        "[[File:Map.svg|thumb|upright=1.2|A map of [[Europe]] with [[Paris|the capital]]]]Text after.",
        "Text after.",
    ),
    "magic words": (
        "__NOTOC__Intro text.__FORCETOC__\n{{DEFAULTSORT:Smith, John}}{{PAGENAME}} is it.",
        "Intro text.\n\nis it.",
    ),
    "non-English namespaces": (
        "Hà Nội là thủ đô.[[Tập tin:Hanoi.jpg|nhỏ|Hồ [[Hoàn Kiếm]]]]\n[[Thể loại:Thủ đô]] [[Bản mẫu:X|y]]",
        "Hà Nội là thủ đô.",
    ),
    "media file without a namespace we know": ("A song.[[Datei:Song.ogg|Listen]] More.", "A song. More."),
    "bold italic and entities": (
        "'''Bold''' and ''italic'' and '''''both''''' &ndash; &amp;nbsp;x&nbsp;y &lt;b&gt;",
        "Bold and italic and both – &nbsp;x\u00a0y <b>",
    ),
    "html tags kept content": (
        'a<br>b<br/>c <span style="x">kept</span> <small>small</small> <sup>2</sup>',
        "a b c kept small 2",
    ),
    "headings lists indents rules": (
        "Intro.\n== History ==\n* item one\n# item two\n; term\n: indented text\n----\nBody.",
        "Intro.\n\nindented text\n\nBody.",
    ),
    "pipe trick and link trail": (
        "[[Paris (France)|]] and [[bus]]es and [[Help:Contents|help]].",
        "Paris and buses and help.",
    ),
    "unclosed template and stray closers": (
        "A }} stray closer, a {{closed}} one, then {{never closed, {{x}} and prose ]] after.",
        "A  stray closer, a  one, then never closed,  and prose  after.",
    ),
    "self-closing and unknown tags": (
        'A<references/> B<ref name=x /> C <templatestyles src="a.css" /> D <nowiki>[[raw]]</nowiki>.',
        "A B C  D raw.",
    ),
    "syntaxhighlight and code": (
        'Use <syntaxhighlight lang="python">print({{x}})</syntaxhighlight> or <code>f()</code> then.',
        "Use  or  then.",
    ),
    "redirect-like text in prose": ("Cats are #1 at {{tl|x}}naps.", "Cats are #1 at naps."),
}


@pytest.mark.parametrize("name", list(CASES))
def test_tricky_wikitext(name):
    wikitext, expected = CASES[name]
    assert clean_wikitext(wikitext, VI) == expected


def test_headings_kept_like_wikiextractor():
    text = "Intro.\n== History ==\nBody one.\n=== Empty ===\n== Later ==\nBody two!\n== Why? ==\nBody three."
    assert clean_wikitext(text, headings=True) == (
        "Intro.\n\nHistory.\n\nBody one.\n\nLater.\n\nBody two!\n\nWhy?\n\nBody three."
    )
    assert clean_wikitext(text) == "Intro.\n\nBody one.\n\nBody two!\n\nBody three."


@pytest.mark.parametrize(
    ("wikitext", "expected"),
    [
        # stacked headings: the parent was lost (only the last pending heading was written)
        ("Intro text.\n== Giáo dục ==\n=== Trường đại học ===\nBody.", "Intro text.|Giáo dục.|Trường đại học.|Body."),
        # a deeper heading replaces its level only; a shallower one drops the deeper levels (compact()'s headers)
        ("== A ==\n=== B ===\n=== C ===\nOne.\n==== D ====\nTwo.", "A.|C.|One.|D.|Two."),
        ("== A ==\n=== B ===\n==== C ====\n== E ==\n=== F ===\nOne.", "E.|F.|One."),
        ("== A ==\nOne.\n=== B ===\nTwo.\n=== C? ===\n== ==\nThree.", "A.|One.|B.|Two.|Three."),
    ],
)
def test_stacked_headings_kept_like_wikiextractor(wikitext, expected):
    assert clean_wikitext(wikitext, headings=True) == expected.replace("|", "\n\n")


def _cpu_time(text: str) -> float:
    t0 = time.process_time()  # CPU time: the machine may be shared
    clean_wikitext(text)
    return time.process_time() - t0


def test_linear_in_page_size():
    """A page 40x longer takes about 40x longer, not 1600x (the tree cleaner's remove-per-node was quadratic)."""
    unit = (
        "{{cite|a={{b}}}} Prose with a [[link|text]] and a ref.<ref>{{c}}</ref> ''More'' [[File:x.jpg|y]]\n"
        "{|\n| cell\n|}\n"
    ) * 50
    small = min(_cpu_time(unit) for _ in range(9))
    big = min(_cpu_time(unit * 40) for _ in range(3))
    assert big < 200 * small, (small, big)
