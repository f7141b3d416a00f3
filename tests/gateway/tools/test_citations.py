"""gateway/tools/citations.py: gpt-oss's ``【3†L1-L2】`` marks to inline links with ``url_citation``
annotations, on a text that arrives in deltas of any size.

The property that matters: for every annotation, ``text[start_index:end_index]`` is exactly the
inserted ``([domain](url))`` link, the annotation validates as the openai SDK's
``AnnotationURLCitation``, and the result does not depend on where the stream was cut. It is checked
by hypothesis over random texts built from segments (ordinary text, marks, things that only look like
marks), against an oracle that knows the segments and so need not parse anything, and over texts of
raw mark-ish characters, where only split-invariance and the span property are checked.

file_search's ``【4:0†notes.md】`` marks (the second family, on with ``resolve_file``) are removed and
become ``file_citation`` annotations whose ``index`` is where the mark was; the same properties are
checked for them, mixed with browser marks against a segment oracle, and alone against a regular
expression read of the whole text (independent of the writer's transition table).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses.response_output_text import (
    AnnotationFileCitation,
    AnnotationURLCitation,
    ResponseOutputText,
)

from gateway.tools.citations import CitationWriter, FileSource, Source, link_domain, link_target

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


# --- file_search's marks: 【{call}:{n}†{filename}】 -> file_citation ----------------------------------

#: (call, n) -> the file shown there; file-a is shown twice (two passages of one file)
FILES = {
    (0, 0): FileSource("file-a", "a.md"),
    (0, 1): FileSource("file-a", "a.md"),
    (0, 2): FileSource("file-b", "notes † v2.md"),
    (4, 0): FileSource("file-c", "report 2024.pdf"),
}


def resolve_files(call: int, n: int) -> FileSource | None:
    return FILES.get((call, n))


def _file(index: int, source: FileSource) -> dict[str, Any]:
    return {"type": "file_citation", "file_id": source.file_id, "filename": source.filename, "index": index}


def _check_all(text: str, annotations: list[dict[str, Any]]) -> None:
    """Every annotation validates as the SDK's type, browser links cover their link, and all are in
    text order: a file citation's index is at or after the end of the link before it."""
    ResponseOutputText.model_validate({"type": "output_text", "text": text, "annotations": annotations})
    links = [a for a in annotations if a["type"] == "url_citation"]
    _check_annotations(text, links)
    previous_end = 0
    for annotation in annotations:
        if annotation["type"] == "file_citation":
            assert set(annotation) == {"type", "file_id", "filename", "index"}
            assert AnnotationFileCitation.model_validate(annotation).model_dump() == annotation
            assert previous_end <= annotation["index"] <= len(text)
            previous_end = annotation["index"]
        else:
            assert previous_end <= annotation["start_index"]
            previous_end = annotation["end_index"]


def _rewrite_both(text: str, **kwargs: Any) -> tuple[str, list[dict[str, Any]]]:
    return _run(CitationWriter(resolve_pages, resolve_file=resolve_files, **kwargs), [text])


FA, FB, FC = FILES[0, 0], FILES[0, 2], FILES[4, 0]


@pytest.mark.parametrize(
    ("given", "expected", "files"),
    [
        ("See【4:0†report 2024.pdf】.", "See.", [(3, FC)]),
        ("See 【4:0†report 2024.pdf】 now", "See  now", [(4, FC)]),
        ("【0:0†a.md】 starts", " starts", [(0, FA)]),
        ("See【9:9†gone.md】.", "See.", []),  # well-formed, not shown: removed, no annotation
        ("See【0:5†a.md】.", "See.", []),
        ("See【0:2†notes † v2.md】.", "See.", [(3, FB)]),  # † and spaces in the title
        ("See【0:2†: L1-L2 – 7†x】.", "See.", [(3, FB)]),  # anything but 】, 【, newline
        ("See【4:0†wrong name.txt】.", "See.", [(3, FC)]),  # the title is not trusted
        ("See【04:000†x】.", "See.", [(3, FC)]),
        ("【0:0†a.md】【0:1†a.md】.", ".", [(0, FA)]),  # one file, two passages, one run
        ("【0:0†a.md】【0:2†b】【0:1†a.md】.", ".", [(0, FA), (0, FB)]),
        ("【0:0†a.md】 and 【0:1†a.md】.", " and .", [(0, FA), (5, FA)]),  # text between: two runs
        ("【0:0†a.md】【9:9†x】【0:1†a.md】.", ".", [(0, FA)]),  # a removed mark counts as nothing
        ("【0:0†a\nb.md】", "【0:0†a\nb.md】", []),  # a newline breaks it
        ("【0:0†】", "【0:0†】", []),  # an empty title
        (
            "【0:0a.md】【0:†a】【:0†a】【0:x†a】【0::0†a】【0:0†",
            "【0:0a.md】【0:†a】【:0†a】【0:x†a】【0::0†a】【0:0†",
            [],
        ),
        ("【0 :0†a】【0: 0†a】【0:0 †a】【٣:0†a】", "【0 :0†a】【0: 0†a】【0:0 †a】【٣:0†a】", []),
        ("【0:0†a【4:0†b】", "【0:0†a", [(6, FC)]),  # a 【 in the title breaks it and starts a mark
        ("【0:0†a】】", "】", [(0, FA)]),
        ("unfinished 【4:0†report", "unfinished 【4:0†report", []),
    ],
)
def test_file_examples(given: str, expected: str, files: list[tuple[int, FileSource]]) -> None:
    text, annotations = _run(CitationWriter(resolve_file=resolve_files), [given])
    assert text == expected
    assert annotations == [_file(i, s) for i, s in files]
    _check_all(text, annotations)
    for chunks in (list(given), [given[:5], given[5:]]):
        assert _run(CitationWriter(resolve_file=resolve_files), chunks) == (text, annotations)


def test_file_and_browser_marks_in_one_text() -> None:
    text, annotations = _rewrite_both("Fact【3†L1】 and【4:0†r.pdf】【5†L2】, then【0:0†a】【3†L1】【0:1†a】【3†L3】.")
    assert text == f"Fact {A} and {B}, then {A}."
    at_then = text.index(", then") + len(", then")
    assert annotations == [
        {"type": "url_citation", "url": "https://www.a.com/x", "title": "A", "start_index": 5, "end_index": 5 + len(A)},
        _file(len(f"Fact {A} and"), FC),
        {
            "type": "url_citation",
            "url": "https://b.org/y",
            "title": "B",
            "start_index": len(f"Fact {A} and "),
            "end_index": len(f"Fact {A} and {B}"),
        },
        _file(at_then, FA),  # the run 【0:0】【3】【0:1】【3】: one annotation per file, one link per URL
        {
            "type": "url_citation",
            "url": "https://www.a.com/x",
            "title": "A",
            "start_index": at_then + 1,
            "end_index": at_then + 1 + len(A),
        },
    ]
    _check_all(text, annotations)


def test_each_family_only_with_its_resolver() -> None:
    given = "a【3†L1】b【4:0†r.pdf】c"
    text, annotations = _rewrite(given, resolve_pages)
    assert text == f"a {A}b【4:0†r.pdf】c" and [a["type"] for a in annotations] == ["url_citation"]
    assert _run(CitationWriter(resolve_file=resolve_files), [given]) == ("a【3†L1】bc", [_file(len("a【3†L1】b"), FC)])
    assert _run(CitationWriter(None, resolve_file=resolve_files), [given])[0] == "a【3†L1】bc"
    assert _run(CitationWriter(), [given]) == (given, [])
    writer = CitationWriter()
    assert writer.feed("x【") == ("x【", [])  # with no family on, nothing is ever held


def test_the_file_resolver_gets_the_numbers_and_the_file_is_its_answer() -> None:
    calls: list[tuple[int, int]] = []

    def resolve(call: int, n: int) -> FileSource | None:
        calls.append((call, n))
        return FileSource(f"file-{call}-{n}", f"{call}.{n}.txt")

    text, annotations = _run(CitationWriter(resolve_file=resolve), ["a【12:007†x.md】b【0:0†y】"])
    assert text == "ab"
    assert calls == [(12, 7), (0, 0)]
    assert annotations == [_file(1, FileSource("file-12-7", "12.7.txt")), _file(2, FileSource("file-0-0", "0.0.txt"))]


def test_file_indices_count_code_points_across_calls() -> None:
    writer = CitationWriter(resolve_file=resolve_files)
    assert writer.feed("x" * 100) == ("x" * 100, [])
    assert writer.feed("😀【4:0†r") == ("😀", [])
    assert writer.feed(".pdf") == ("", [])
    assert writer.feed("】y") == ("y", [_file(101, FC)])
    assert writer.finish() == ("", [])


def test_max_file_mark_chars_bounds_the_file_mark() -> None:
    mark = "【4:0†" + "n" * 250 + ".pdf】"  # 260 characters
    assert _run(CitationWriter(resolve_file=resolve_files), [mark]) == ("", [_file(0, FC)])
    assert _run(CitationWriter(resolve_file=resolve_files, max_file_mark_chars=260), [mark])[0] == ""
    assert _run(CitationWriter(resolve_file=resolve_files, max_file_mark_chars=259), [mark])[0] == mark
    long = "【4:0†" + "n" * 300 + "】"
    assert _run(CitationWriter(resolve_file=resolve_files), [long]) == (long, [])
    writer = CitationWriter(resolve_file=resolve_files, max_file_mark_chars=9)
    assert writer.feed("【4:0†abc") == ("", [])  # 8 held
    assert writer.feed("d") == ("【4:0†abcd", [])  # 9 could only become a 10-character mark
    assert writer.feed("【4:0†abc】") == ("", [_file(9, FC)])
    with pytest.raises(ValueError):
        CitationWriter(resolve_file=resolve_files, max_file_mark_chars=6)


def test_the_shared_prefix_is_held_to_the_larger_bound_and_each_branch_to_its_own() -> None:
    writer = CitationWriter(resolve_pages, resolve_file=resolve_files, max_mark_chars=8, max_file_mark_chars=12)
    assert writer.feed("【1234567") == ("", [])  # 8: too long for a browser mark, not for a file mark
    assert writer.feed("†") == ("【1234567†", [])  # the browser branch: past its bound
    assert writer.feed("【123456:0†a") == ("", [])  # 11 held
    assert writer.feed("】") == ("", [])  # a 12-character file mark: recognised (and not shown: removed)
    assert writer.feed("【3†L1-L1") == ("【3†L1-L1", [])  # 8: the browser bound, not the file one
    writer = CitationWriter(resolve_pages, resolve_file=resolve_files, max_mark_chars=12, max_file_mark_chars=7)
    assert writer.feed("【123456789") == ("", [])
    assert writer.feed(":") == ("【123456789:", [])  # the file branch: past its bound
    writer = CitationWriter(resolve_file=resolve_files, max_mark_chars=64, max_file_mark_chars=7)
    assert writer.feed("【123456") == ("【123456", [])  # browser family off: the file bound alone


# --- file marks: properties ------------------------------------------------------------------------

#: ids and names of the files a resolver may give; two ids share a name
_FILE_SOURCES = [FileSource("file-a", "a.md"), FileSource("file-b", "a.md"), FileSource("file-c", "c d † e.pdf")]
_TITLE = st.text(alphabet="a😀 .:†L-–0123456789\t", min_size=1, max_size=30)
#: calls 0-1 and results 0-2 are what a resolver knows (most of them shown); a long call number
#: is never shown but makes the mark longer (the bounds) and is still removed
_CALLS = st.sampled_from([0, 0, 1, 1, 12345678])
_file_marks = st.builds(
    lambda call, n, title: ("file", (call, n, f"【{call}:{n}†{title}】")), _CALLS, st.integers(0, 2), _TITLE
)
#: file-mark look-alikes that break the grammar within themselves (as ``_not_marks`` do)
_not_file_marks = st.sampled_from(
    ["【0:0†】", "【0:x†a】", "【0:†a】", "【0::0†a】", "【0:0a】", "【0:0†a\nb】", "【0 :0†a】", "【0:0†" + "x" * 300]
).map(lambda s: ("text", s))
#: (call * 3 + n) -> index into _FILE_SOURCES, -1: not shown
_shown = st.lists(st.integers(-1, len(_FILE_SOURCES) - 1), min_size=6, max_size=6)


def _files_resolver(shown: list[int]) -> Any:
    def resolve(call: int, n: int) -> FileSource | None:
        if call < 2 and n < 3 and shown[call * 3 + n] >= 0:
            return _FILE_SOURCES[shown[call * 3 + n]]
        return None

    return resolve


def _mixed_oracle(
    segments: list[tuple[str, Any]], resolve: Any, resolve_file: Any, bounds: tuple[int, int]
) -> tuple[str, list[tuple[Any, ...]]]:
    """The expected text and, in order, ("url", start, url) and ("file", index, file_id, filename);
    a mark longer than its family's bound is text."""
    out = ""
    run: set[tuple[str, str]] = set()
    expected: list[tuple[Any, ...]] = []
    for kind, value in segments:
        if kind == "file":
            call, n, mark = value
            if len(mark) > bounds[1]:
                kind, value = "text", mark
            else:
                source = resolve_file(call, n)
                if source is not None and ("file", source.file_id) not in run:
                    expected.append(("file", len(out), source.file_id, source.filename))
                    run.add(("file", source.file_id))
                continue
        if kind == "mark" and len(value) > bounds[0]:
            kind = "text"
        if kind == "text":
            out += value
            if value:
                run.clear()
            continue
        # a browser mark, as _oracle reads it
        cursor, lines = value[1:-1].split("†L")
        first, _, last = lines.replace("–", "-").partition("-L")
        link = (
            None if last and int(last) < int(first) else resolve(int(cursor), int(first), int(last) if last else None)
        )
        if link is None or ("url", link.url) in run:
            continue
        if out and not out[-1].isspace():
            out += " "
        expected.append(("url", len(out), link.url))
        out += EXPECTED_LINK[link.url]
        run.add(("url", link.url))
    return out, expected


def _observed(annotations: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        ("file", a["index"], a["file_id"], a["filename"])
        if a["type"] == "file_citation"
        else ("url", a["start_index"], a["url"])
        for a in annotations
    ]


#: (max_mark_chars, max_file_mark_chars): each smaller than some marks of its family, or not
_BOUNDS = st.tuples(st.sampled_from([6, 9, 64]), st.sampled_from([7, 12, 24, 300]))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segments=st.lists(st.one_of(_marks, _file_marks, _file_marks, _texts, _not_file_marks), max_size=25),
    pages=_pages,
    shown=_shown,
    cuts=_cuts,
    bounds=_BOUNDS,
)
def test_file_marks_any_split_gives_the_oracles_text_and_annotations(
    segments: list[tuple[str, Any]],
    pages: dict[int, tuple[int, int]],
    shown: list[int],
    cuts: list[int],
    bounds: tuple[int, int],
) -> None:
    resolve, resolve_file = _pages_resolver(pages), _files_resolver(shown)
    given_text = "".join(value if kind != "file" else value[2] for kind, value in segments)
    expected, marks = _mixed_oracle(segments, resolve, resolve_file, bounds)
    for chunks in ([given_text], list(given_text), _split(given_text, cuts)):
        writer = CitationWriter(
            resolve, resolve_file=resolve_file, max_mark_chars=bounds[0], max_file_mark_chars=bounds[1]
        )
        text, annotations = _run(writer, chunks)
        assert text == expected
        assert _observed(annotations) == marks
        _check_all(text, annotations)


def _regex_reference(text: str, resolve_file: Any, max_file_mark_chars: int) -> tuple[str, list[tuple[Any, ...]]]:
    """File marks alone, read by a regular expression over the whole text instead of the table: a
    held text never holds a second 【, so a failed match can resume at the next 【, as the writer does."""
    out, run, expected, at = "", set(), [], 0
    for m in re.finditer(r"【([0-9]+):([0-9]+)†[^】【\n]+】", text):
        if len(m.group()) > max_file_mark_chars:
            continue  # text, like all that is not a match
        if m.start() > at:
            out += text[at : m.start()]
            run.clear()
        at = m.end()
        source = resolve_file(int(m.group(1)), int(m.group(2)))
        if source is not None and source.file_id not in run:
            expected.append(("file", len(out), source.file_id, source.filename))
            run.add(source.file_id)
    return out + text[at:], expected


#: raw texts: pieces of marks, and mark-shaped attempts whose every part is well-formed or broken
#: (long call numbers, a missing colon or dagger, titles with newlines, 【, 】), so that marks,
#: near-marks and prefixes near each bound are common
_PIECES = [
    "【",
    "】",
    "†",
    ":",
    "0",
    "1",
    "2",
    "12345678",
    "a",
    " ",
    "\n",
    "-",
    "L",
    "【0:",
    "【1:2†",
    "【0:0†a】",
    "【1:2†b】",
]


def _part(good: list[str], bad: list[str]) -> st.SearchStrategy[str]:
    """One part of an attempt: well-formed three times in four."""
    return st.one_of(st.sampled_from(good), st.sampled_from(good), st.sampled_from(good), st.sampled_from(bad))


_attempts = st.builds(
    lambda *parts: "".join(parts),
    st.just("【"),
    _part(["0", "1", "12345678"], ["", "a", "1 "]),
    _part([":"], ["", "†L", "::"]),
    _part(["0", "2"], ["", "x"]),
    _part(["†"], ["", "】"]),
    st.one_of(st.text(alphabet="a :†L0", min_size=1, max_size=14), st.text(alphabet="a :†L0\n【】", max_size=14)),
    _part(["】"], ["", "\n"]),
)
_raw = st.lists(st.one_of(_attempts, _attempts, st.sampled_from(_PIECES)), max_size=20).map("".join)


@settings(max_examples=500, deadline=None)
@given(given_text=_raw, shown=_shown, cuts=_cuts, bounds=_BOUNDS, browser=st.booleans())
def test_raw_file_mark_pieces_split_anywhere_read_as_a_regex_reads_them(
    given_text: str, shown: list[int], cuts: list[int], bounds: tuple[int, int], browser: bool
) -> None:
    # the browser family may be on: with no "†L" in the text it never closes a mark, but its
    # holds and bound must not change what the file family reads
    given_text = given_text.replace("†L", "†")
    resolve_file = _files_resolver(shown)
    expected, marks = _regex_reference(given_text, resolve_file, bounds[1])
    for chunks in ([given_text], list(given_text), _split(given_text, cuts)):
        writer = CitationWriter(
            (lambda *_: PAGES[3]) if browser else None,
            resolve_file=resolve_file,
            max_mark_chars=bounds[0],
            max_file_mark_chars=bounds[1],
        )
        text, annotations = _run(writer, chunks)
        assert (text, _observed(annotations)) == (expected, marks)
        _check_all(text, annotations)


@settings(max_examples=500, deadline=None)
@given(
    given_text=st.lists(
        st.one_of(_attempts, st.sampled_from([*_PIECES, "†L", "–", "【3†L1", "【3†L1-L2】"])), max_size=20
    ).map("".join),
    pages=_pages,
    shown=_shown,
    cuts=_cuts,
    bounds=_BOUNDS,
)
def test_raw_pieces_of_both_families_split_anywhere(
    given_text: str, pages: dict[int, tuple[int, int]], shown: list[int], cuts: list[int], bounds: tuple[int, int]
) -> None:
    kwargs: dict[str, Any] = {
        "resolve_file": _files_resolver(shown),
        "max_mark_chars": bounds[0],
        "max_file_mark_chars": bounds[1],
    }
    resolve = _pages_resolver(pages)
    whole, whole_annotations = _rewrite(given_text, resolve, **kwargs)
    _check_all(whole, whole_annotations)
    for chunks in (list(given_text), _split(given_text, cuts)):
        assert _run(CitationWriter(resolve, **kwargs), chunks) == (whole, whole_annotations)
    if "】" not in given_text:
        assert whole == given_text


#: a prefix of a file mark, written independently of the module's table
_VIABLE_FILE = re.compile(r"【(?:[0-9]+(?::(?:[0-9]+(?:†[^】【\n]*)?)?)?)?")


@settings(max_examples=400, deadline=None)
@given(
    given_text=st.lists(st.one_of(_attempts, st.sampled_from([*_PIECES, "†L", "【3†L1"]))).map(
        lambda pieces: "".join(pieces).replace("】", "")
    ),
    cuts=_cuts,
    bounds=_BOUNDS,
    browser=st.booleans(),
)
def test_holds_back_a_prefix_of_either_family_only_within_its_bound(
    given_text: str, cuts: list[int], bounds: tuple[int, int], browser: bool
) -> None:
    max_mark_chars, max_file_mark_chars = bounds
    writer = CitationWriter(
        (lambda *_: Source("https://a.com/", "A")) if browser else None,
        resolve_file=lambda *_: FileSource("file-a", "a"),
        max_mark_chars=max_mark_chars,
        max_file_mark_chars=max_file_mark_chars,
    )
    fed, emitted = "", ""
    for chunk in _split(given_text, cuts):
        fed += chunk
        emitted += writer.feed(chunk)[0]
        assert fed.startswith(emitted)
        held = fed[len(emitted) :]
        assert (
            held == ""
            or (browser and _VIABLE.fullmatch(held) and len(held) < max_mark_chars)
            or (_VIABLE_FILE.fullmatch(held) and len(held) < max_file_mark_chars)
        )
    assert emitted + writer.finish()[0] == given_text


@pytest.mark.timeout(120)  # linear, as for browser marks
@pytest.mark.parametrize(
    "unit", ["【1:", "【1:2†", "【1:2†a†b", "【1:2†a】", "【1:2†" + "x" * 400, "【0:0†a】【3†L1】"]
)
def test_a_megabyte_of_file_marks_is_linear(unit: str) -> None:
    given_text = unit * (1_000_000 // len(unit))
    calls = 0

    def resolve_file(call: int, n: int) -> FileSource | None:
        nonlocal calls
        calls += 1
        return None

    writer = CitationWriter(lambda *_: None, resolve_file=resolve_file)
    text, annotations = _run(writer, [given_text])
    expected = "" if unit.endswith("】") else given_text
    assert text == expected and annotations == []
    assert calls == (given_text.count(":") if unit.endswith("】") else 0)  # each file mark read once
    part = given_text[: 200_000 - 200_000 % len(unit)]  # whole units: a cut mark would be released
    writer = CitationWriter(lambda *_: None, resolve_file=resolve_file)
    assert _run(writer, [part[i : i + 7] for i in range(0, len(part), 7)])[0] == expected[: len(part)]


@pytest.mark.parametrize(
    ("text", "cited"),
    [
        ("Yes.【0:0†a.md】", True),
        ("Yes.【0:0† A.MD 】", True),  # case and surrounding spaces
        ("Yes.【0:0†file-a】", True),  # the id
        ("Yes.【0:0†b.md】", False),  # the numbers name a.md: a stale mark from another response
        ("Yes.【0:0†a】", False),
    ],
)
def test_check_titles_cites_only_the_file_the_title_names(text: str, cited: bool) -> None:
    """``check_titles`` (file_search's): call numbers restart in every response, so a mark copied
    from an earlier one may resolve to another file now; its title must name the file resolved."""
    writer = CitationWriter(resolve_file=lambda call, n: FileSource("file-a", "a.md"), check_titles=True)
    shown, annotations = writer.feed(text)
    rest, _ = writer.finish()
    assert shown + rest == "Yes."
    expected = [{"type": "file_citation", "file_id": "file-a", "filename": "a.md", "index": 4}]
    assert annotations == (expected if cited else [])
    unchecked = CitationWriter(resolve_file=lambda call, n: FileSource("file-a", "a.md"))
    assert unchecked.feed(text)[1] == expected  # without the check, the numbers alone decide
