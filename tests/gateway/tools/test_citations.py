"""gateway/tools/citations.py: gpt-oss's ``【3†L1-L2】`` marks to inline links with ``url_citation``
annotations, on a text that arrives in deltas of any size.

The property that matters: for every annotation, ``text[start_index:end_index]`` is exactly the
inserted ``([domain](url))`` link, the annotation validates as the openai SDK's
``AnnotationURLCitation``, and the result does not depend on where the stream was cut. It is checked
by hypothesis over random texts built from segments (ordinary text, marks, things that only look like
marks), against an oracle that knows the segments and so need not parse anything, and over texts of
raw mark-ish characters, where only split-invariance and the span property are checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses.response_output_text import AnnotationURLCitation, ResponseOutputText

from gateway.tools.citations import CitationWriter, Source, link_domain, link_target

# (url, the link text expected, the link target expected): written out by hand, not computed
SOURCES: list[tuple[str, str, str]] = [
    ("https://www.apnews.com/article/x-1", "apnews.com", "https://www.apnews.com/article/x-1"),
    ("https://apnews.com/other", "apnews.com", "https://apnews.com/other"),
    ("https://b.org/a b(c)<d>\\e", "b.org", "https://b.org/a%20b%28c%29%3Cd%3E%5Ce"),
    ("https://bücher.de/straße?q=ä😀", "bücher.de", "https://bücher.de/straße?q=ä😀"),
    ("http://[::1]:8080/p", "\\[::1\\]", "http://[::1]:8080/p"),
    ("https://WWW.Example.COM:8443/x\ty\u3000z", "example.com", "https://WWW.Example.COM:8443/x%09y%E3%80%80z"),
]
EXPECTED_LINK = {url: f"([{text}]({target}))" for url, text, target in SOURCES}


def _pages_resolver(pages: dict[int, tuple[int, int]]) -> Any:
    """cursor -> (index into SOURCES, number of lines): the lines must be on the page."""

    def resolve(cursor: int, first: int, last: int | None) -> Source | None:
        if cursor not in pages:
            return None
        source, lines = pages[cursor]
        end = first if last is None else last
        if not 0 <= first <= end < lines:
            return None
        url = SOURCES[source][0]
        return Source(url, f"title of {url}")

    return resolve


def _run(writer: CitationWriter, chunks: Sequence[str]) -> tuple[str, list[dict[str, Any]]]:
    """Feed the chunks, then finish; the text and the annotations as the calls returned them."""
    out: list[str] = []
    annotations: list[dict[str, Any]] = []
    for chunk in chunks:
        text, new = writer.feed(chunk)
        out.append(text)
        annotations.extend(new)
    text, new = writer.finish()
    out.append(text)
    annotations.extend(new)
    assert annotations == writer.annotations
    return "".join(out), annotations


def _rewrite(text: str, resolve: Any, **kwargs: Any) -> tuple[str, list[dict[str, Any]]]:
    return _run(CitationWriter(resolve, **kwargs), [text])


def _check_annotations(text: str, annotations: list[dict[str, Any]]) -> None:
    """THE property: each annotation validates and covers exactly the link written for its URL."""
    ResponseOutputText.model_validate({"type": "output_text", "text": text, "annotations": annotations})
    previous_end = 0
    for annotation in annotations:
        assert set(annotation) == {"type", "url", "title", "start_index", "end_index"}
        assert AnnotationURLCitation.model_validate(annotation).model_dump() == annotation
        start, end = annotation["start_index"], annotation["end_index"]
        assert previous_end <= start < end <= len(text)
        url = annotation["url"]
        assert text[start:end] == f"([{link_domain(url)}]({link_target(url)}))"
        if url in EXPECTED_LINK:
            assert text[start:end] == EXPECTED_LINK[url]
        previous_end = end


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


# --- examples --------------------------------------------------------------------------------------

PAGES = {3: Source("https://www.a.com/x", "A"), 5: Source("https://b.org/y", "B"), 7: Source("https://c.net/", "C")}
A = "([a.com](https://www.a.com/x))"
B = "([b.org](https://b.org/y))"
C = "([c.net](https://c.net/))"


def resolve_pages(cursor: int, first: int, last: int | None) -> Source | None:
    """PAGES, each 20 lines long."""
    if cursor in PAGES and 0 <= first < 20 and (last is None or last < 20):
        return PAGES[cursor]
    return None


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("Fact.【3†L1-L2】 More.", f"Fact. {A} More."),
        ("Fact 【3†L1】", f"Fact {A}"),
        ("【3†L1】 starts", f"{A} starts"),
        ("Fact\n【3†L10–L12】", f"Fact\n{A}"),
        ("Fact【3†L1】【3†L4-L6】.", f"Fact {A}."),
        ("Fact【3†L1】【5†L4-L6】.", f"Fact {A} {B}."),
        ("Fact【3†L1】【5†L4】【3†L9】【7†L0】.", f"Fact {A} {B} {C}."),
        ("Fact【3†L1】 and【3†L2】", f"Fact {A} and {A}"),
        ("Fact【3†L1】【9†L2】【3†L4】.", f"Fact {A}."),
        ("Fact【9†L2】.", "Fact."),
        ("Fact 【9†L2】 more", "Fact  more"),
        ("Fact【3†L20】.", "Fact."),
        ("Fact【3†L2-L20】.", "Fact."),
        ("Fact【3†L5-L4】.", "Fact."),
        ("【note】", "【note】"),
        ("【3†x】", "【3†x】"),
        ("【3†L1-】", "【3†L1-】"),
        ("【3†L1-2】", "【3†L1-2】"),
        ("【3†L1—L2】", "【3†L1—L2】"),
        ("【3†Lakers win†nba.com】", "【3†Lakers win†nba.com】"),
        ("【3†L10 things†x.com】", "【3†L10 things†x.com】"),
        ("【】【 3†L1】【3 †L1】【3†L1 】", "【】【 3†L1】【3 †L1】【3†L1 】"),
        ("【٣†L1】", "【٣†L1】"),
        ("【【3†L1】", f"【 {A}"),
        ("【3【3†L1】】", f"【3 {A}】"),
        ("】【3†L1】】", f"】 {A}】"),
        ("unfinished 【3†L1-L", "unfinished 【3†L1-L"),
        ("【", "【"),
        ("", ""),
    ],
)
def test_examples(given: str, expected: str) -> None:
    text, annotations = _rewrite(given, resolve_pages)
    assert text == expected
    _check_annotations(text, annotations)
    assert len(annotations) == len(re.findall(r"\(\[", expected))


def test_annotation_fields() -> None:
    text, annotations = _rewrite("See【5†L1】【3†L2】.", resolve_pages)
    assert annotations == [
        {"type": "url_citation", "url": "https://b.org/y", "title": "B", "start_index": 4, "end_index": 4 + len(B)},
        {
            "type": "url_citation",
            "url": "https://www.a.com/x",
            "title": "A",
            "start_index": 5 + len(B),
            "end_index": 5 + len(B) + len(A),
        },
    ]
    assert text == f"See {B} {A}."


def test_the_resolver_gets_the_cursor_and_the_lines() -> None:
    calls: list[tuple[int, int, int | None]] = []

    def resolve(cursor: int, first: int, last: int | None) -> Source | None:
        calls.append((cursor, first, last))
        return None

    text, _ = _rewrite("a【6†L9-L11】b【8†L3】c【12†L007–L7】d【1†L5-L4】e", resolve)
    assert text == "abcde"
    assert calls == [(6, 9, 11), (8, 3, None), (12, 7, 7)]  # a reversed range is not asked about


def test_indices_count_from_the_start_of_the_part_across_calls() -> None:
    writer = CitationWriter(resolve_pages)
    assert writer.feed("x" * 100) == ("x" * 100, [])
    text, new = writer.feed("😀【3†L1】")  # one code point, two UTF-16 units: indices count code points
    assert text == f"😀 {A}"
    assert new == [
        {
            "type": "url_citation",
            "url": "https://www.a.com/x",
            "title": "A",
            "start_index": 102,
            "end_index": 102 + len(A),
        }
    ]


def test_holds_only_what_could_still_be_a_mark() -> None:
    writer = CitationWriter(resolve_pages)
    assert writer.feed("see 【3†L") == ("see ", [])
    assert writer.feed("1") == ("", [])
    assert writer.feed("-") == ("", [])
    assert writer.feed("x and 【") == ("【3†L1-x and ", [])
    assert writer.feed("3†La") == ("【3†La", [])
    assert writer.feed("【3") == ("", [])
    text, new = writer.feed("†L2】")
    assert text == f" {A}" and len(new) == 1
    assert writer.feed("【【") == ("【", [])
    assert writer.finish() == ("【", [])


def test_max_mark_chars_bounds_the_mark() -> None:
    mark = "【3†L0000000001】"  # 15 characters
    assert _rewrite(mark, resolve_pages, max_mark_chars=15)[0] == A
    assert _rewrite(mark, resolve_pages, max_mark_chars=14)[0] == mark
    long = "【" + "1" * 100 + "†L1】"
    assert _rewrite(long, lambda *_: PAGES[3])[0] == long
    writer = CitationWriter(resolve_pages, max_mark_chars=8)
    assert writer.feed("【123456") == ("", [])  # 7 held
    assert writer.feed("7") == ("【1234567", [])  # 8 could only become a 9-character mark
    with pytest.raises(ValueError):
        CitationWriter(resolve_pages, max_mark_chars=5)


def test_feed_after_finish_is_an_error() -> None:
    writer = CitationWriter(resolve_pages)
    writer.finish()
    with pytest.raises(RuntimeError):
        writer.feed("x")


@pytest.mark.parametrize(
    ("url", "domain", "target"),
    [
        *SOURCES,
        ("https://www.ex.com/a\nb\\", "ex.com", "https://www.ex.com/a%0Ab%5C"),
        ("mailto:x", "source", "mailto:x"),
    ],
)
def test_the_link_for_a_url(url: str, domain: str, target: str) -> None:
    text, annotations = _rewrite("【0†L0】", lambda *_: Source(url, "t"))
    assert text == f"([{domain}]({target}))"
    assert annotations[0]["url"] == url  # the raw URL, not the one written into the link


@pytest.mark.parametrize("url", [u for u, _, _ in SOURCES] + ["https://x.org/a)b(c", "https://x.org/<script>"])
def test_a_commonmark_parser_reads_the_link_back(url: str) -> None:
    markdown_it = pytest.importorskip("markdown_it")
    md = markdown_it.MarkdownIt("commonmark")
    text, [annotation] = _rewrite("Fact【0†L0】.", lambda *_: Source(url, "t"))
    tokens = md.parseInline(text)[0].children
    kinds = [t.type for t in tokens]
    opened, closed = kinds.index("link_open"), kinds.index("link_close")
    assert kinds.count("link_open") == 1
    assert "".join(t.content for t in tokens[:opened]) == "Fact ("
    assert "".join(t.content for t in tokens[opened + 1 : closed]) == link_domain(url).replace("\\", "")
    assert "".join(t.content for t in tokens[closed + 1 :]) == ")."
    # the parser reads the written target as the same link it would make of the raw URL
    assert unquote(str(tokens[opened].attrs["href"])) == unquote(md.normalizeLink(url))
    assert annotation["url"] == url


# --- properties ------------------------------------------------------------------------------------

_marks = st.builds(
    lambda cursor, first, last, dash: f"【{cursor}†L{first}" + ("" if last is None else f"{dash}L{last}") + "】",
    st.integers(0, 9),
    st.integers(0, 35),
    st.none() | st.integers(0, 35),
    st.sampled_from("-–"),
).map(lambda mark: ("mark", mark))
#: look like marks but each breaks the grammar within itself, so what follows cannot rescue it
_not_marks = st.sampled_from(
    ["【note】", "【3†x】", "【3†L1-】", "【3†L1 】", "【】", "【3†Title†example.com】", "【3†L1-L2x", "【" + "7" * 63]
).map(lambda s: ("text", s))
_texts = st.text(alphabet="a😀 .\n\t†L-–0123456789】", max_size=8).map(lambda s: ("text", s))
_pages = st.dictionaries(st.integers(0, 9), st.tuples(st.integers(0, len(SOURCES) - 1), st.integers(1, 30)))
_cuts = st.lists(st.integers(0, 10**6), max_size=30)


def _oracle(segments: list[tuple[str, str]], resolve: Any) -> tuple[str, list[tuple[int, str]]]:
    """The expected text and (start, url) of each link, from the segments: no parsing needed."""
    out = ""
    run: set[str] = set()
    links: list[tuple[int, str]] = []
    for kind, value in segments:
        if kind == "text":
            out += value
            if value:
                run.clear()
            continue
        cursor, lines = value[1:-1].split("†L")
        first, _, last = lines.replace("–", "-").partition("-L")
        source = (
            None if last and int(last) < int(first) else resolve(int(cursor), int(first), int(last) if last else None)
        )
        if source is None or source.url in run:
            continue
        if out and not out[-1].isspace():
            out += " "
        links.append((len(out), source.url))
        out += EXPECTED_LINK[source.url]
        run.add(source.url)
    return out, links


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segments=st.lists(st.one_of(_marks, _marks, _texts, _not_marks), max_size=25),
    pages=_pages,
    cuts=_cuts,
)
def test_any_split_gives_the_oracles_text_and_annotations(
    segments: list[tuple[str, str]], pages: dict[int, tuple[int, int]], cuts: list[int]
) -> None:
    resolve = _pages_resolver(pages)
    given_text = "".join(value for _, value in segments)
    expected, links = _oracle(segments, resolve)
    for chunks in ([given_text], list(given_text), _split(given_text, cuts)):
        text, annotations = _run(CitationWriter(resolve), chunks)
        assert text == expected
        assert [(a["start_index"], a["url"]) for a in annotations] == links
        _check_annotations(text, annotations)


@settings(max_examples=400, deadline=None)
@given(
    given_text=st.text(alphabet="【】†L-–0123456789 a", max_size=120),
    pages=_pages,
    cuts=_cuts,
    max_mark_chars=st.sampled_from([6, 9, 64]),
)
def test_raw_mark_characters_split_anywhere(
    given_text: str, pages: dict[int, tuple[int, int]], cuts: list[int], max_mark_chars: int
) -> None:
    resolve = _pages_resolver(pages)
    whole, whole_annotations = _rewrite(given_text, resolve, max_mark_chars=max_mark_chars)
    _check_annotations(whole, whole_annotations)
    for chunks in (list(given_text), _split(given_text, cuts)):
        assert _run(CitationWriter(resolve, max_mark_chars=max_mark_chars), chunks) == (whole, whole_annotations)
    if "】" not in given_text:
        assert whole == given_text  # nothing can close: all of it is text


#: a prefix of a mark, written independently of the module's transition table
_VIABLE = re.compile(r"【(?:[0-9]+(?:†(?:L(?:[0-9]+(?:[-–](?:L[0-9]*)?)?)?)?)?)?")


@settings(max_examples=300, deadline=None)
@given(
    given_text=st.text(alphabet="【†L-–0123456789 a", max_size=150),
    cuts=_cuts,
    max_mark_chars=st.sampled_from([6, 9, 64]),
)
def test_holds_back_a_mark_prefix_only_and_never_more_than_the_bound(
    given_text: str, cuts: list[int], max_mark_chars: int
) -> None:
    # without 】 nothing is rewritten, so what is not emitted yet is exactly what is held
    writer = CitationWriter(lambda *_: Source("https://a.com/", "A"), max_mark_chars=max_mark_chars)
    fed, emitted = "", ""
    for chunk in _split(given_text, cuts):
        fed += chunk
        emitted += writer.feed(chunk)[0]
        assert fed.startswith(emitted)
        held = fed[len(emitted) :]
        assert held == "" or (_VIABLE.fullmatch(held) and len(held) < max_mark_chars)
    assert emitted + writer.finish()[0] == given_text


@pytest.mark.timeout(120)  # linear: about a second; a rescan per delta would take hours
@pytest.mark.parametrize("unit", ["【", "【1", "【1†L", "【1†L2-L3", "【1†L2】"])
def test_a_megabyte_of_marks_is_linear(unit: str) -> None:
    given_text = unit * (1_000_000 // len(unit))

    def resolve(cursor: int, first: int, last: int | None) -> Source | None:
        return None

    text, annotations = _rewrite(given_text, resolve)
    expected = "" if unit.endswith("】") else given_text
    assert text == expected and annotations == []
    chunked = [given_text[i : i + 7] for i in range(0, min(len(given_text), 200_000), 7)]
    assert _run(CitationWriter(resolve), chunked)[0] == expected[: sum(map(len, chunked))]
