"""gateway.tools.documents: files to text (each type, refusals, encodings, bounds, hostile PDFs)
and text to token chunks (exact sizes and overlaps under o200k_base, offsets, coverage)."""

from __future__ import annotations

import gzip
import io
import json
import sys
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.tools.documents import (
    AUTO_CHUNK_TOKENS,
    AUTO_OVERLAP_TOKENS,
    ExtractionFailed,
    Limits,
    UnsupportedFile,
    chunk_text,
    count_tokens,
    extract,
    extract_chunks,
    kind_for,
    readable_kind,
    sizes_for,
)
from gateway.tools.documents import chunking as chunking_mod
from gateway.tools.documents.chunking import encoding

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
sys.path.insert(0, str(CORPUS))
from make_pdfs import pdf_bytes, text_pdf  # noqa: E402

QUERIES = json.loads((CORPUS / "queries.json").read_text())


# --- each type, from the corpus ------------------------------------------------------------------

EXPECTED = [
    ("greenhouse_irrigation.md", "markdown", "E-417 | valve stuck open"),
    ("sourdough_starter.txt", "text", "A grey liquid layer on top, called hooch"),
    ("karnholm_lighthouse.html", "html", "The keeper Ingrid Solvang kept the light for twenty-six years"),
    ("rooftop_solar.html", "html", "installer’s logbook: “measure twice, drill once”"),
    ("bicycle_maintenance.md", "markdown", "turn\nthe barrel adjuster on the rear derailleur"),
    ("rate_limiter.py", "code", "def try_acquire(self, cost: float = 1.0) -> tuple[bool, float]:"),
    ("backoff.go", "code", 'var ErrGiveUp = errors.New("backoff: attempts exhausted")'),
    ("orchard_sync_config.json", "json", '"max_backoff_ms": 30000'),
    ("payment_api_errors.json", "json", '"code": "QX-2207"'),
    ("incident_2024_checkout_outage.txt", "text", "ERR_CONN_RESET_4412"),
    ("beekeeping_inspection.pdf", "pdf", "More than nine mites in 300 bees"),
    ("tide_pool_ecology.pdf", "pdf", "Beadlet anemones look like blobs of red jelly"),
    ("hot_composting.pdf", "pdf", "Aim for a carbon-"),
]


@pytest.mark.parametrize(("name", "kind", "needle"), EXPECTED)
def test_each_type_extracts_its_text(name: str, kind: str, needle: str) -> None:
    got = extract(CORPUS / name, name)
    assert got.kind == kind
    assert " ".join(needle.split()) in " ".join(got.text.split())  # PDF lines wrap where the page did
    assert not got.truncated
    # bytes and a path read the same
    assert extract((CORPUS / name).read_bytes(), name).text == got.text


def test_pdf_text_spans_its_pages_in_order() -> None:
    got = extract(CORPUS / "beekeeping_inspection.pdf", "beekeeping_inspection.pdf")
    assert got.pages == 1
    many = extract(text_pdf("\n\n".join(f"Paragraph number {i} of the long file." for i in range(200))), "long.pdf")
    assert many.pages is not None and many.pages > 3
    positions = [many.text.index(f"Paragraph number {i} ") for i in (0, 60, 120, 199)]
    assert positions == sorted(positions)


def test_html_keeps_the_article_and_drops_the_page_chrome() -> None:
    text = extract(CORPUS / "karnholm_lighthouse.html", "karnholm_lighthouse.html").text
    assert text.lstrip("# ").startswith("Karnholm Light: a short history")
    assert text.count("Karnholm Light: a short history") == 1  # the title is not repeated
    for chrome in ("window.analytics", "font-family", "Coastal Towers Society", "Contact"):
        assert chrome not in text


def test_html_declared_charset_is_honoured() -> None:
    raw = (CORPUS / "rooftop_solar.html").read_bytes()
    assert b"\x93measure" in raw  # the file really is windows-1252
    assert "Café owners" in extract(raw, "page.htm").text


def test_every_corpus_document_extracts_and_chunks() -> None:
    names = QUERIES["documents"]
    assert 12 <= len(names) <= 20
    assert sum(p.stat().st_size for p in CORPUS.iterdir()) < 300_000
    kinds = set()
    for name in names:
        got = extract(CORPUS / name, name)
        kinds.add(got.kind)
        chunks = list(chunk_text(got.text, 100, 50))
        assert chunks and chunks[-1].end == len(got.text)
    assert kinds == {"text", "markdown", "html", "pdf", "code", "json"}


def test_queries_name_corpus_documents() -> None:
    names = set(QUERIES["documents"])
    queries = QUERIES["queries"]
    assert len(queries) >= 40
    assert {q["style"] for q in queries} == {"keyword", "paraphrase", "mixed"}
    for q in queries:
        assert q["answers"] and set(q["answers"]) <= names, q
    assert len({q["id"] for q in queries}) == len(queries)


# --- kinds and refusals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ctype", "kind"),
    [
        ("a.TS", None, "code"),
        ("main.rs", None, "code"),
        ("x.cpp", None, "code"),
        ("Makefile", None, "text"),
        ("notes", "text/markdown; charset=utf-8", "markdown"),
        ("data", "application/json", "json"),
        ("blob", "text/x-python", "code"),
        ("x.docx", None, None),
        ("x", "application/octet-stream", None),
    ],
)
def test_kind_for(name: str, ctype: str | None, kind: str | None) -> None:
    assert kind_for(name, ctype) == kind


def _zip_bomb() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("zeros.txt", "w") as f:
            piece = b"\0" * (1 << 20)
            for _ in range(64):
                f.write(piece)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("data", "name", "type_name"),
    [
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "notes.txt", "image/png"),
        (_zip_bomb(), "notes.txt", "application/zip"),
        (gzip.compress(b"hello " * 1000, mtime=0), "readme.md", "application/gzip"),
        (b"\x7fELF\x02\x01\x01" + b"\0" * 100, "run.sh", "application/x-elf"),
        (b"MZ\x90\x00\x03\x00\x00\x00" + b"\0" * 100, "a.txt", "application/x-msdownload"),
        (b"%!PS-Adobe-3.0\n", "print.txt", "application/postscript"),
        (b"some text\x00with a nul", "a.json", "application/octet-stream"),
        (b"PK\x03\x04" + b"x" * 10, "report.docx", "application/zip"),
        (b"hello", "report.docx", ".docx"),
        (b"hello", "picture", "image/png"),
        (b"\x01\x02hello", "blob", "unknown (no extension, no content type)"),
        (b"caf\xe9 not UTF-8", "notes.dat", ".dat"),
        (b"hello", "setup.exe", ".exe"),
    ],
)
def test_refusals_name_the_type(data: bytes, name: str, type_name: str) -> None:
    ctype = "image/png" if name == "picture" else None
    with pytest.raises(UnsupportedFile) as caught:
        extract(data, name, ctype)
    assert caught.value.type_name == type_name
    assert type_name in caught.value.message
    assert repr(name) in caught.value.message


@pytest.mark.parametrize(
    ("name", "ctype"), [("blob", None), ("notes.dat", None), ("x.weird", "application/octet-stream"), ("empty", None)]
)
def test_text_under_a_name_that_says_nothing_is_read_as_text(name: str, ctype: str | None) -> None:
    """An unknown extension (or none) and a type that says nothing: UTF-8 bytes are plain text,
    here and at upload (``readable_kind``, what ``POST /v1/files`` checks with)."""
    data = b"" if name == "empty" else "Plain words, caf\u00e9 and \u2603.\n".encode() * 1000
    assert readable_kind(name, ctype, data[:8192]) == "text"  # a character cut at 8 KiB is fine
    assert extract(data, name, ctype).text == data.decode()


@pytest.mark.parametrize(
    ("data", "name", "ctype", "type_name"),
    [
        (b"PK\x03\x04" + b"\0" * 100, "notes.txt", "text/plain", "application/zip"),
        (gzip.compress(b"a" * 100_000, mtime=0), "notes.txt", None, "application/gzip"),
        (b"words", "photo", "image/png", "image/png"),
        (b"words", "app.exe", None, ".exe"),
        (b"PK\x03\x04" + b"\0" * 100, "paper.pdf", "application/pdf", "application/zip"),
    ],
)
def test_readable_kind_refuses_by_the_head_alone(data: bytes, name: str, ctype: str | None, type_name: str) -> None:
    with pytest.raises(UnsupportedFile) as caught:
        readable_kind(name, ctype, data[:8192])
    assert caught.value.type_name == type_name and type_name in caught.value.message


def test_readable_kind_leaves_a_broken_pdf_to_extraction() -> None:
    assert readable_kind("paper.pdf", None, b"just words") == "pdf"
    assert readable_kind("notes.txt", None, b"%PDF-1.7\n garbage") == "pdf"


def test_text_that_starts_like_a_signature_is_still_text() -> None:
    for text in ("BMW made the car.", "MZ is a postcode prefix.", "ID3 tags hold the title.", "RIFF on this."):
        assert extract(text.encode(), "a.txt").text == text


def test_pdf_bytes_are_read_as_pdf_whatever_the_name() -> None:
    got = extract(text_pdf("A PDF uploaded under a text name."), "oops.txt", "text/plain")
    assert got.kind == "pdf" and "under a text name" in got.text


def test_a_pdf_name_without_a_pdf_header_fails() -> None:
    with pytest.raises(ExtractionFailed, match="no PDF header"):
        extract(b"just words", "paper.pdf")


def test_an_unreadable_path_fails_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(ExtractionFailed, match="could not be read"):
        extract(tmp_path / "missing.txt", "missing.txt")


# --- encodings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "ctype", "text"),
    [
        ("naïve café\n".encode("utf-16"), None, "naïve café\n"),
        ("naïve café".encode("utf-16-be").join([b"\xfe\xff", b""]), None, "naïve café"),
        ("naïve".encode("utf-32"), None, "naïve"),
        (b"\xef\xbb\xbfBOM then text", None, "BOM then text"),
        ("café ☕".encode(), None, "café ☕"),
        ("café “quoted”".encode("cp1252"), None, "café “quoted”"),  # not UTF-8: windows-1252
        ("Grüße".encode("iso-8859-15"), "text/plain; charset=ISO-8859-15", "Grüße"),
        ("Grüße".encode(), "text/plain; charset=no-such-codec", "Grüße"),
        (b"a\r\nb\rc\n", None, "a\nb\nc\n"),
    ],
)
def test_encodings(data: bytes, ctype: str | None, text: str) -> None:
    assert extract(data, "f.txt", ctype).text == text


def test_invalid_utf8_late_in_a_large_file_falls_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "late.txt"
    path.write_bytes(b"x" * 3_000_000 + "é".encode("cp1252") + b"\r\n")
    got = extract(path, "late.txt")
    assert got.text.endswith("é\n") and len(got.text) == 3_000_002


def test_crlf_split_across_read_pieces(tmp_path: Path) -> None:
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"a" * ((1 << 20) - 1) + b"\r\nb")
    assert extract(path, "crlf.txt").text == "a" * ((1 << 20) - 1) + "\nb"


# --- bounds ----------------------------------------------------------------------------------------


def test_max_chars_cuts_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "big.md"
    path.write_bytes(b"word " * 400_000)
    got = extract(path, "big.md", limits=Limits(max_chars=10_000))
    assert got.truncated and got.text == ("word " * 2000)
    whole = extract(path, "big.md")
    assert not whole.truncated and len(whole.text) == 2_000_000


def test_a_huge_text_file_is_read_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "huge.txt"
    with open(path, "wb") as f:
        line = b"the same line of ordinary text, again and again\n"
        for _ in range(40 << 20 >> 6):  # ~32 MB
            f.write(line)
    tracemalloc.start()
    try:
        got = extract(path, "huge.txt", limits=Limits(max_chars=1_000_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.truncated and len(got.text) == 1_000_000
    assert peak < 12_000_000, peak  # a few copies of the kept text, never the 32 MB file


def test_html_over_its_byte_cap_fails() -> None:
    with pytest.raises(ExtractionFailed, match="larger than 1000 bytes"):
        extract(b"<html><body>" + b"<p>x</p>" * 200 + b"</body></html>", "a.html", limits=Limits(max_html_bytes=1000))


def test_html_with_no_text_fails() -> None:
    with pytest.raises(ExtractionFailed, match="No text"):
        extract(b"<html><body><script>1</script></body></html>", "a.html")


def test_pdf_pages_and_chars_are_capped() -> None:
    pages = [f"BT /F1 10 Tf 50 700 Td (Page {i} says hello.) Tj ET".encode() for i in range(30)]
    data = pdf_bytes(pages)
    got = extract(data, "p.pdf", limits=Limits(max_pdf_pages=5))
    assert got.truncated and got.pages == 30
    assert "Page 4 says" in got.text and "Page 5 says" not in got.text
    cut = extract(data, "p.pdf", limits=Limits(max_chars=50))
    assert cut.truncated and len(cut.text) <= 50
    assert not extract(data, "p.pdf").truncated


def test_pdf_over_its_byte_cap_fails() -> None:
    with pytest.raises(ExtractionFailed, match="larger than 100 bytes"):
        extract(text_pdf("x"), "a.pdf", limits=Limits(max_pdf_bytes=100))


def test_pdf_past_its_deadline_is_stopped() -> None:
    # 10 ms: the worker cannot even start its interpreter and import pypdf in that time
    with pytest.raises(ExtractionFailed, match="longer than 0.01 s and was stopped"):
        extract(CORPUS / "hot_composting.pdf", "hot_composting.pdf", limits=Limits(pdf_timeout_s=0.01))


def _deflated_zeros(n: int) -> bytes:
    c = zlib.compressobj(9)
    piece = b"\0" * (1 << 20)
    return b"".join([*(c.compress(piece) for _ in range(n >> 20)), c.flush()])


def _raw_pdf(streams: list[bytes]) -> bytes:
    """A PDF whose page contents are the given already-deflated streams."""
    return pdf_bytes(streams, deflated=True)


def test_a_pdf_stream_that_inflates_to_200_mb_is_refused() -> None:
    bomb = _raw_pdf([_deflated_zeros(200 << 20)])
    assert len(bomb) < 300_000
    with pytest.raises(ExtractionFailed, match="inflates past the reader's cap"):
        extract(bomb, "bomb.pdf")


def test_many_large_streams_hit_the_worker_memory_cap() -> None:
    bomb = _raw_pdf([_deflated_zeros(60 << 20)] * 6)
    with pytest.raises(ExtractionFailed) as caught:
        extract(bomb, "bomb.pdf", limits=Limits(pdf_memory_bytes=256 << 20, pdf_timeout_s=60))
    assert "needed more than 256 MiB" in caught.value.reason or "killed" in caught.value.reason


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (text_pdf("hello world " * 50)[:300], "malformed"),
        (b"%PDF-1.7\n" + bytes(range(256)) * 100, "malformed"),
        (b"%PDF-", "malformed"),
        (pdf_bytes([b"BT /F1 10 Tf 50 700 Td (hi) Tj ET"]).replace(b"/Kids [4 0 R]", b"/Kids [2 0 R]"), "cyclic"),
        (pdf_bytes([b"0 0 m 10 10 l S"]), "no extractable text"),
    ],
)
def test_malformed_pdfs_fail_with_a_reason(data: bytes, why: str) -> None:
    with pytest.raises(ExtractionFailed) as caught:
        extract(data, "bad.pdf")
    assert why in caught.value.reason


def test_an_encrypted_pdf_fails_with_a_reason() -> None:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf("secret text"))))
    writer.encrypt("hunter2", algorithm="RC4-128")
    buf = io.BytesIO()
    writer.write(buf)
    with pytest.raises(ExtractionFailed, match="encrypted with a password"):
        extract(buf.getvalue(), "locked.pdf")


def test_a_pdf_with_an_empty_user_password_is_read() -> None:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf("owner-locked but readable"))))
    writer.encrypt("", owner_password="owner", algorithm="RC4-128")
    buf = io.BytesIO()
    writer.write(buf)
    assert "owner-locked but readable" in extract(buf.getvalue(), "open.pdf").text


# --- chunking --------------------------------------------------------------------------------------


def test_sizes_for_strategies() -> None:
    assert sizes_for(None) == sizes_for({"type": "auto"}) == (AUTO_CHUNK_TOKENS, AUTO_OVERLAP_TOKENS) == (800, 400)
    static = {"type": "static", "static": {"max_chunk_size_tokens": 4096, "chunk_overlap_tokens": 2048}}
    assert sizes_for(static) == (4096, 2048)
    for size, overlap in ((99, 0), (4097, 0), (100, 51), (100, -1), (True, 0), (100, 1.5)):
        with pytest.raises(ValueError, match="chunk"):
            sizes_for({"type": "static", "static": {"max_chunk_size_tokens": size, "chunk_overlap_tokens": overlap}})
    with pytest.raises(ValueError, match="chunking_strategy"):
        sizes_for({"type": "other"})
    with pytest.raises(ValueError, match="max_chunk_size_tokens"):
        list(chunk_text("x", 50, 0))


def _token_offsets(text: str) -> list[int]:
    enc = encoding()
    _, offsets = enc.decode_with_offsets(enc.encode_ordinary(text))
    return offsets


@pytest.mark.parametrize(("size", "overlap"), [(800, 400), (100, 0), (100, 50), (333, 77), (4096, 2048)])
def test_chunk_sizes_and_overlaps_are_exact(size: int, overlap: int) -> None:
    text = "\n\n".join(extract(CORPUS / n, n).text for n in QUERIES["documents"])
    offsets = _token_offsets(text)
    n = len(offsets)
    chunks = list(chunk_text(text, size, overlap))
    step = size - overlap
    for k, c in enumerate(chunks):
        first = k * step
        assert c.index == k
        assert c.start == offsets[first]
        last = first + size
        if k < len(chunks) - 1:
            assert c.tokens == size and c.end == offsets[last]
        else:
            assert last >= n and c.end == len(text) and c.tokens == n - first
        assert text[c.start : c.end] == c.text
        assert count_tokens(c.text) <= size + 2  # re-encoding a slice alone may differ at its edges
    assert (len(chunks) - 2) * step + size < n  # no extra window past the one reaching the end


def test_chunk_text_empty_and_short() -> None:
    assert list(chunk_text("")) == []
    (only,) = chunk_text("a short text")
    assert (only.start, only.end, only.text, only.tokens) == (0, 12, "a short text", count_tokens("a short text"))


_PIECES = [*"ab yz\n\t.,'-0123", "é", "日本", "😀", "\u200b", "  ", "word ", "\r\n", "Wörter ", "\n\n", "’"]
_TEXTS = st.lists(st.sampled_from(_PIECES), max_size=1500).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXTS, size=st.integers(100, 160), overlap_frac=st.floats(0, 0.5))
def test_chunks_cover_the_text(text: str, size: int, overlap_frac: float) -> None:
    overlap = int(size * overlap_frac)
    chunks = list(chunk_text(text, size, overlap))
    if not text:
        assert chunks == []
        return
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    for prev, cur in zip(chunks, chunks[1:], strict=False):
        assert prev.start < cur.start <= prev.end  # in order, no gap
    for c in chunks:
        assert c.start < c.end and text[c.start : c.end] == c.text
        assert 0 < c.tokens <= size


_SPACY = st.lists(
    st.sampled_from(
        [
            *_PIECES,
            " ",
            "\n",
            "\n ",
            " \n",
            "\t\n",
            "x\n",
            ".\n\n",
            "(a)",
            "}",
            "//",
            "/",
            "5",
            "12 ",
            "\u0301",
            "'s",
            "²",
        ]
    ),
    max_size=400,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=_SPACY, seg=st.integers(8, 120))
def test_segment_cuts_keep_the_whole_text_tokens(pieces: list[str], seg: int) -> None:
    """Streaming cuts the text only where the pre-split cuts anyway: the segments' tokens are the
    whole text's tokens (a cut forced at ``seg`` characters, where no such place exists, aside)."""
    text = "".join(pieces)
    enc = encoding()
    try:
        chunking_mod.SEGMENT_CHARS = seg
        segments = [s for _, s in chunking_mod._segments(text)]
    finally:
        chunking_mod.SEGMENT_CHARS = 1 << 16
    assert "".join(segments) == text
    if all(len(s) < seg for s in segments[:-1]):
        assert [t for s in segments for t in enc.encode_ordinary(s)] == enc.encode_ordinary(text)


def test_segmented_chunks_equal_one_pass() -> None:
    text = "\n".join(extract(CORPUS / n, n).text for n in QUERIES["documents"])
    whole = list(chunk_text(text, 120, 40))
    try:
        chunking_mod.SEGMENT_CHARS = 1000
        assert max(len(s) for _, s in list(chunking_mod._segments(text))[:-1]) < 1000  # no forced cut
        parts = list(chunk_text(text, 120, 40))
    finally:
        chunking_mod.SEGMENT_CHARS = 1 << 16
    assert parts == whole


def test_a_window_edge_inside_a_character() -> None:
    enc = encoding()
    rare = "\U0001f9ec"  # a character o200k_base spells in more than one token
    assert len(enc.encode_ordinary(rare)) > 1
    text = "a" + rare * 400
    chunks = list(chunk_text(text, 100, 0))
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    for prev, cur in zip(chunks, chunks[1:], strict=False):
        assert prev.end == cur.start
    assert "".join(c.text for c in chunks) == text
    assert all(c.tokens == 100 for c in chunks[:-1])


def test_a_long_text_streams_in_bounded_memory() -> None:
    text = "A line of an ordinary document that goes on.\n" * 200_000  # 9 MB, 2M tokens
    tracemalloc.start()
    try:
        count = 0
        last_end = 0
        for c in chunk_text(text):
            count += 1
            last_end = c.end
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert last_end == len(text) and count == -(-(count_tokens(text) - 800) // 400) + 1
    assert peak < 8_000_000, peak  # one segment's arrays, not the text's 2M tokens as a list


def test_extract_chunks_reads_and_cuts_a_stored_file(tmp_path: Path) -> None:
    got, chunks = extract_chunks(CORPUS / "karnholm_lighthouse.html", "karnholm_lighthouse.html", 100, 20)
    assert got.kind == "html" and len(chunks) > 3
    assert all(got.text[c.start : c.end] == c.text for c in chunks)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"  \n\n ")
    with pytest.raises(ExtractionFailed, match="no text"):
        extract_chunks(empty, "empty.txt")
    with pytest.raises(ValueError, match="chunk_overlap_tokens"):
        extract_chunks(empty, "empty.txt", 100, 60)
