"""An uploaded file to its text: plain text, Markdown, HTML, PDF, source code, JSON.

``extract(source, filename, content_type)`` takes the file's bytes or its path (read in bounded
pieces, never whole) and returns :class:`Extracted`; a file it does not read raises
:class:`UnsupportedFile` (its ``type_name`` names the type: the HTTP layer's 400
``unsupported_file``), a file it cannot read raises :class:`ExtractionFailed` (its ``reason`` is
the file's ``last_error``). Nothing else escapes.

**Which reader.** The name's extension, then the declared content type, pick the kind; the first
bytes are sniffed and win over both: a PDF header is read as a PDF whatever the name, and a known
binary signature (PNG, JPEG, GIF, zip, gzip, ELF, PE, ...) or a NUL byte in the first 8 KiB of a
"text" file is refused, naming what the bytes are. So a zip bomb named ``notes.txt`` is refused
before one byte of it is inflated. A name and type that say nothing (an unknown extension, none,
``application/octet-stream``) are plain text when the bytes are (a BOM, or UTF-8 without control
bytes); an extension of a binary format (``.docx``, ``.exe``, ...) is refused by that name.
:func:`readable_kind` makes this choice from the first 8 KiB alone: the upload's check.

**Encodings** (text, Markdown, code, JSON): a byte-order mark (UTF-8, UTF-16, UTF-32) wins; then
a ``charset`` parameter of the declared type, if Python knows it; then strict UTF-8; a file that
is not valid UTF-8 is read again as windows-1252 (what "latin-1" means on the web; its five
undefined bytes become U+FFFD). Newlines are normalised to ``\\n``.

**Bounds** (:class:`Limits`, each with a default): ``max_chars`` extracted characters (the rest is
dropped, ``truncated`` says so); ``max_html_bytes`` of HTML (trafilatura needs the whole page);
``max_pdf_bytes``, ``max_pdf_pages`` (the rest dropped, ``truncated``), and a PDF is parsed in a
child process (``python -I`` running this file) under a wall-clock deadline (``pdf_timeout_s``,
then it is killed), an address-space cap (``pdf_memory_bytes``: a PDF whose streams inflate to
gigabytes fails with ``MemoryError`` there) and a CPU-seconds cap, so a pathological PDF can
neither stall nor exhaust the caller. Starting the worker costs ~0.1 s (interpreter + pypdf import).

**PDF library.** pypdf (BSD-3, pure Python): measured on two real PDFs (libtasn1's manual, 36
pages, and the shared-mime-info spec, 17 pages) it took 0.47 s / 0.21 s against pdfminer.six's
0.81 s / 0.36 s, with the same text; pypdfium2 took 0.03 s / 0.02 s but is a C++ parser of
untrusted input with a binary wheel. Pure Python keeps a hostile PDF's worst case to an exception
or the worker's caps, not memory corruption, and pypdf caps each stream's inflated size itself.
"""

from __future__ import annotations

import codecs
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

__all__ = [
    "DocumentError",
    "ExtractionFailed",
    "Extracted",
    "Kind",
    "Limits",
    "UnsupportedFile",
    "extract",
    "kind_for",
    "readable_kind",
]

Kind = Literal["text", "markdown", "html", "pdf", "code", "json"]

#: what the refusal message lists as readable
SUPPORTED = "plain text, Markdown, HTML, PDF, source code and JSON"

_TEXT_EXT = {".txt", ".text", ".log", ".csv", ".tsv", ".rst", ".tex", ".ini", ".cfg", ".conf", ".toml", ".yaml", ".yml"}
_MD_EXT = {".md", ".markdown", ".mdx"}
_HTML_EXT = {".html", ".htm", ".xhtml"}
_JSON_EXT = {".json", ".jsonl", ".ndjson"}
_CODE_EXT = {
    ".py", ".pyi", ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".go", ".rs", ".java", ".kt", ".scala",
    ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".cs", ".rb", ".php", ".sh", ".bash", ".zsh",
    ".swift", ".m", ".pl", ".lua", ".r", ".sql", ".css", ".scss", ".vue", ".dart", ".ex", ".exs",
    ".erl", ".hs", ".ml", ".clj", ".groovy", ".ps1", ".bat", ".proto", ".xml", ".gradle", ".zig",
}  # fmt: skip
#: extensions of formats this module does not read: refused by name even when the bytes look like text
_BINARY_EXT = {
    ".png", ".jpg", ".jpeg", ".gif", ".bmp", ".tif", ".tiff", ".ico", ".webp", ".heic", ".avif", ".psd",
    ".zip", ".gz", ".tgz", ".bz2", ".xz", ".zst", ".7z", ".rar", ".tar", ".jar", ".war", ".whl", ".apk",
    ".exe", ".dll", ".so", ".dylib", ".o", ".a", ".bin", ".class", ".pyc", ".wasm", ".iso", ".dmg", ".msi",
    ".doc", ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".odt", ".ods", ".odp", ".epub", ".rtf", ".ps",
    ".mp3", ".wav", ".ogg", ".flac", ".m4a", ".aac", ".mp4", ".mkv", ".mov", ".avi", ".webm",
    ".sqlite", ".sqlite3", ".db", ".parquet", ".npy", ".pkl", ".pickle", ".ttf", ".otf", ".woff", ".woff2",
}  # fmt: skip
#: names without an extension that are text
_TEXT_NAMES = {"makefile", "dockerfile", "readme", "license", "copying", "changelog", "authors", "notice"}

_TYPE_KINDS: dict[str, Kind] = {
    "text/plain": "text",
    "text/csv": "text",
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "text/html": "html",
    "application/xhtml+xml": "html",
    "application/pdf": "pdf",
    "application/json": "json",
    "application/x-ndjson": "json",
    "application/javascript": "code",
    "application/typescript": "code",
    "application/x-sh": "code",
    "application/x-python": "code",
    "application/xml": "code",
    "text/xml": "code",
}
#: declared types that say nothing about the content
_VAGUE_TYPES = {"", "application/octet-stream", "binary/octet-stream", "application/unknown"}

#: leading bytes of formats that are not text, and the type each one names
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
    (b"\x00\x00\x01\x00", "image/x-icon"),
    (b"PK\x03\x04", "application/zip"),
    (b"PK\x05\x06", "application/zip"),
    (b"PK\x07\x08", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
    (b"BZh", "application/x-bzip2"),
    (b"\xfd7zXZ\x00", "application/x-xz"),
    (b"(\xb5/\xfd", "application/zstd"),
    (b"7z\xbc\xaf\x27\x1c", "application/x-7z-compressed"),
    (b"Rar!\x1a\x07", "application/vnd.rar"),
    (b"\x7fELF", "application/x-elf"),
    (b"MZ", "application/x-msdownload"),
    (b"\xcf\xfa\xed\xfe", "application/x-mach-binary"),
    (b"\xfe\xed\xfa\xcf", "application/x-mach-binary"),
    (b"\xca\xfe\xba\xbe", "application/java-vm"),
    (b"\x00asm", "application/wasm"),
    (b"SQLite format 3\x00", "application/vnd.sqlite3"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "application/x-ole-storage"),
    (b"OggS", "audio/ogg"),
    (b"fLaC", "audio/flac"),
    (b"ID3", "audio/mpeg"),
    (b"RIFF", "application/x-riff"),
    (b"\x1aE\xdf\xa3", "video/webm"),
    (b"%!PS", "application/postscript"),
    (b"{\\rtf", "application/rtf"),
)
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_SNIFF_BYTES = 8192
#: a PDF header may follow some junk (the spec's readers look within the first 1024 bytes)
_PDF_HEADER_WITHIN = 1024
_READ_PIECE = 1 << 20
_KIB = 1024
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """What one extraction may take; every bound says what happens past it."""

    #: characters of text kept; past it the text is cut and ``truncated`` is set
    max_chars: int = 5_000_000
    #: an HTML file larger than this fails (trafilatura parses the whole page at once)
    max_html_bytes: int = 16 * _MIB
    #: a PDF larger than this fails
    max_pdf_bytes: int = 256 * _MIB
    #: pages read from a PDF; the rest are dropped and ``truncated`` is set
    max_pdf_pages: int = 2000
    #: wall-clock seconds the PDF worker may run before it is killed (the file fails)
    pdf_timeout_s: float = 60.0
    #: the PDF worker's address-space cap (RLIMIT_AS): what a decompression bomb runs into
    pdf_memory_bytes: int = 1024 * _MIB


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Extracted:
    """A file's text, the kind it was read as, whether a bound cut it, and its page count (PDF)."""

    text: str
    kind: Kind
    truncated: bool = False
    pages: int | None = None


class DocumentError(Exception):
    """Base of the two outcomes that are not text; ``message`` is fit to show the client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnsupportedFile(DocumentError):
    """A type the extractor does not read; ``type_name`` names it (a MIME type or an extension)."""

    def __init__(self, filename: str, type_name: str, why: str = "") -> None:
        self.type_name = type_name
        self.filename = filename
        detail = f" ({why})" if why else ""
        super().__init__(
            f"The file {_shown(filename)} is of type {type_name}{detail}, which cannot be read; "
            f"supported types are {SUPPORTED}."
        )


class ExtractionFailed(DocumentError):
    """A supported type that could not be read (malformed, too big, too slow); ``reason`` is the
    file's ``last_error``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _shown(filename: str) -> str:
    return repr(filename if len(filename) <= 120 else filename[:117] + "...")


def _media_type(content_type: str | None) -> tuple[str, str | None]:
    """``text/plain; charset=UTF-8`` -> (``text/plain``, ``UTF-8``)."""
    if not content_type:
        return "", None
    head, _, params = content_type.partition(";")
    charset = None
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip().strip("\"'") or None
    return head.strip().lower(), charset


def kind_for(filename: str, content_type: str | None = None) -> Kind | None:
    """The kind a file's name (then its declared type) says it is; ``None`` if neither says one
    this module reads. The content is not looked at (``extract`` sniffs it)."""
    name = os.path.basename(filename).lower()
    ext = os.path.splitext(name)[1]
    if ext == ".pdf":
        return "pdf"
    if ext in _HTML_EXT:
        return "html"
    if ext in _MD_EXT:
        return "markdown"
    if ext in _JSON_EXT:
        return "json"
    if ext in _CODE_EXT:
        return "code"
    if ext in _TEXT_EXT or (not ext and name in _TEXT_NAMES):
        return "text"
    media, _ = _media_type(content_type)
    if media in _TYPE_KINDS:
        return _TYPE_KINDS[media]
    if media.startswith("text/x-") or media == "text/javascript":
        return "code"
    if media.startswith("text/"):
        return "text"
    return None


def readable_kind(filename: str, content_type: str | None, head: bytes) -> Kind:
    """The kind :func:`extract` reads a file as, from its name, its declared type and its first
    bytes (``head``: the first 8 KiB, or all of a shorter file), without reading the rest: what an
    upload is checked with before it is kept. Raises :class:`UnsupportedFile` naming the type for
    a file ``extract`` would refuse; a file it would read but might fail on (a truncated PDF, a
    ``.pdf`` with no PDF header) is not refused here.

    The bytes win: a PDF header makes a PDF whatever the name; a known binary signature (zip,
    gzip, PNG, ELF, ...) or a NUL byte refuses a file named as text. A name and type that say
    nothing this module reads (an unknown extension, no extension, ``application/octet-stream``)
    are read as plain text when the bytes are text (a BOM, or UTF-8 without control bytes); an
    extension of a known binary format (``.docx``, ``.exe``, ``.png``, ...) or a declared type
    that is not text (``image/png``) is refused by that name."""
    head = head[:_SNIFF_BYTES]
    media, _ = _media_type(content_type)
    kind = kind_for(filename, content_type)
    if b"%PDF-" in head[:_PDF_HEADER_WITHIN]:
        return "pdf"
    sniffed = _sniff_binary(head)
    if sniffed is not None:  # a zip named paper.pdf too: it is a zip
        raise UnsupportedFile(filename, sniffed, "by its content")
    if kind is not None:
        return kind
    ext = os.path.splitext(os.path.basename(filename))[1].lower()
    if media in _VAGUE_TYPES and ext not in _BINARY_EXT and _looks_like_text(head):
        return "text"
    named = media if media not in _VAGUE_TYPES else (ext or "unknown (no extension, no content type)")
    raise UnsupportedFile(filename, named)


def _looks_like_text(head: bytes) -> bool:
    """A BOM, or UTF-8 (a character cut at the end of ``head`` allowed) without control bytes."""
    if any(head.startswith(bom) for bom, _ in _BOMS):
        return True
    if _is_binaryish(head):
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < _SNIFF_BYTES)
    except UnicodeDecodeError:
        return False
    return True


def _is_binaryish(head: bytes) -> bool:
    return any(b < 0x09 or 0x0E <= b < 0x20 for b in head[:512])


def _sniff_binary(head: bytes) -> str | None:
    """The type a known binary signature names (``application/octet-stream`` for NUL bytes outside
    a UTF-16/32 text); ``None`` when the bytes can be text. Signatures made only of printable
    letters ("BM", "MZ", "ID3", ...) count only when control bytes follow, so a text that happens
    to begin "BMW" or "MZ" is still text."""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            printable = all(0x20 <= b < 0x7F for b in magic)
            if not printable or name in ("application/postscript", "application/rtf") or _is_binaryish(head):
                return name
    if len(head) > 262 and head[257:262] == b"ustar":
        return "application/x-tar"
    if any(head.startswith(bom) for bom, name in _BOMS if name != "utf-8-sig"):
        return None
    if b"\x00" in head:
        return "application/octet-stream"
    return None


class _Source:
    """The file's bytes or its path, read in pieces; ``open`` starts again from the beginning."""

    def __init__(self, source: bytes | bytearray | memoryview | str | os.PathLike[str]) -> None:
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.data: bytes | None = bytes(source)
            self.path: Path | None = None
        else:
            self.data = None
            self.path = Path(source)

    def open(self) -> BinaryIO:
        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.path is not None
        return open(self.path, "rb")

    def head(self, n: int) -> bytes:
        with self.open() as f:
            return f.read(n)

    def size(self) -> int:
        if self.data is not None:
            return len(self.data)
        assert self.path is not None
        return self.path.stat().st_size

    def read_at_most(self, n: int) -> bytes | None:
        """All the bytes if there are at most ``n``, else ``None`` (never more than n + 1 read)."""
        with self.open() as f:
            data = f.read(n + 1)
        return None if len(data) > n else data


def extract(
    source: bytes | bytearray | memoryview | str | os.PathLike[str],
    filename: str,
    content_type: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Extracted:
    """The text of a file (its bytes, or a path read in pieces). Raises :class:`UnsupportedFile`
    or :class:`ExtractionFailed`, nothing else (an unreadable path is an ``ExtractionFailed``)."""
    src = _Source(source)
    try:
        head = src.head(_SNIFF_BYTES)
    except OSError as exc:
        raise ExtractionFailed(f"The file could not be read: {exc.strerror or type(exc).__name__}.") from None
    _, charset = _media_type(content_type)
    kind = readable_kind(filename, content_type, head)
    if kind == "pdf" and b"%PDF-" not in head[:_PDF_HEADER_WITHIN]:
        raise ExtractionFailed("The file is named or typed as a PDF but has no PDF header (%PDF-).")
    try:
        if kind == "pdf":
            return _extract_pdf(src, limits)
        if kind == "html":
            return _extract_html(src, charset, limits)
        text, truncated = _read_text(src, head, charset, limits.max_chars)
        return Extracted(text=text, kind=kind, truncated=truncated)
    except DocumentError:
        raise
    except OSError as exc:
        raise ExtractionFailed(f"The file could not be read: {exc.strerror or type(exc).__name__}.") from None
    except Exception as exc:  # a reader's bug must fail the file, not the caller
        raise ExtractionFailed(f"The file could not be read ({type(exc).__name__}).") from None


def _encodings(head: bytes, declared: str | None) -> Iterator[tuple[str, str]]:
    """(codec, errors) to try in order: the BOM's, the declared one, strict UTF-8, windows-1252."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            yield name, "replace"
            return
    if declared:
        try:
            yield codecs.lookup(declared).name, "replace"
            return
        except LookupError:
            pass
    yield "utf-8", "strict"
    yield "cp1252", "replace"


def _read_text(src: _Source, head: bytes, declared: str | None, max_chars: int) -> tuple[str, bool]:
    """Decode in pieces, keeping at most ``max_chars`` characters (newlines normalised)."""
    for codec, errors in _encodings(head, declared):
        try:
            with io.TextIOWrapper(src.open(), encoding=codec, errors=errors, newline=None) as reader:
                parts: list[str] = []
                kept = 0
                while kept <= max_chars:
                    part = reader.read(min(_READ_PIECE, max_chars + 1 - kept))
                    if not part:
                        break
                    parts.append(part)
                    kept += len(part)
        except UnicodeDecodeError:
            continue
        text = "".join(parts)
        truncated = len(text) > max_chars
        return (text[:max_chars] if truncated else text), truncated
    raise AssertionError("windows-1252 with errors='replace' decodes any bytes")  # pragma: no cover


def _extract_html(src: _Source, charset: str | None, limits: Limits) -> Extracted:
    from gateway.tools.pages.extract import CUT_MARKER, Fetched, read
    from gateway.tools.pages.page import PageFailed

    body = src.read_at_most(limits.max_html_bytes)
    if body is None:
        raise ExtractionFailed(f"The HTML file is larger than {limits.max_html_bytes} bytes.")
    try:
        page = read(Fetched(url="", media_type="text/html", charset=charset, body=body), limits.max_chars)
    except PageFailed:
        raise ExtractionFailed("No text could be read from the HTML file.") from None
    text = page.text
    if page.cut:
        text = text.removesuffix(CUT_MARKER.format(n=limits.max_chars)).rstrip()
    title = page.title.strip()
    if title and title not in text[: len(title) + 8]:  # trafilatura may open with '# title'
        text = f"{title}\n\n{text}"
    return Extracted(text=text[: limits.max_chars], kind="html", truncated=page.cut or len(text) > limits.max_chars)


# --- PDF: a child process with a deadline and caps ------------------------------------------------


def _extract_pdf(src: _Source, limits: Limits) -> Extracted:
    size = src.size()
    if size > limits.max_pdf_bytes:
        raise ExtractionFailed(f"The PDF is larger than {limits.max_pdf_bytes} bytes.")
    args = [
        sys.executable,
        "-I",
        __file__,
        "-" if src.path is None else str(src.path),
        str(limits.max_pdf_pages),
        str(limits.max_chars),
        str(limits.pdf_memory_bytes),
        str(max(1, int(limits.pdf_timeout_s) + 1)),
    ]
    try:
        done = subprocess.run(
            args,
            input=src.data if src.path is None else None,
            stdin=subprocess.DEVNULL if src.path is not None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=limits.pdf_timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ExtractionFailed(
            f"Reading the PDF took longer than {limits.pdf_timeout_s:g} s and was stopped."
        ) from None
    header, _, body = done.stdout.partition(b"\n")
    try:
        meta = json.loads(header)
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        why = f"was killed by signal {-done.returncode}" if done.returncode < 0 else f"exited {done.returncode}"
        raise ExtractionFailed(f"Reading the PDF failed: its reader {why} (a resource cap, or a malformed file).")
    if "error" in meta:
        raise ExtractionFailed(str(meta["error"]))
    text = body.decode("utf-8", errors="replace")
    return Extracted(text=text, kind="pdf", truncated=bool(meta.get("truncated")), pages=int(meta.get("pages", 0)))


def _pdf_worker(argv: list[str]) -> int:  # pragma: no cover (runs in the child; tested through extract)
    """The child's side: caps itself, reads the PDF, writes a JSON header line then the text."""
    import resource

    where, max_pages, max_chars, memory, cpu = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    out = sys.stdout.buffer

    def fail(reason: str) -> int:
        out.write(json.dumps({"error": reason}).encode() + b"\n")
        return 0

    import logging

    logging.disable(logging.CRITICAL)  # pypdf warns on every damaged object
    try:
        from pypdf import PdfReader
        from pypdf.errors import FileNotDecryptedError, LimitReachedError, PdfReadError
    except ImportError:
        return fail("PDF files cannot be read here: the PDF reader (pypdf) is not installed.")
    try:
        stream = io.BytesIO(sys.stdin.buffer.read()) if where == "-" else open(where, "rb")
        reader = PdfReader(stream, strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            return fail("The PDF is encrypted with a password.")
        n = len(reader.pages)
        parts: list[str] = []
        kept = 0
        truncated = n > max_pages
        for i in range(min(n, max_pages)):
            page_text = reader.pages[i].extract_text() or ""
            parts.append(page_text)
            kept += len(page_text) + 2
            if kept > max_chars:
                truncated = True
                break
        text = "\n\n".join(p.strip("\n") for p in parts).strip()[:max_chars]
    except MemoryError:
        return fail(f"Reading the PDF needed more than {memory // _MIB} MiB (a decompression bomb?).")
    except LimitReachedError as exc:
        return fail(f"The PDF is refused: a part of it inflates past the reader's cap ({str(exc)[:120]}).")
    except FileNotDecryptedError:
        return fail("The PDF is encrypted with a password.")
    except PdfReadError as exc:
        return fail(f"The PDF is malformed: {str(exc)[:200]}")
    except RecursionError:
        return fail("The PDF is malformed: its objects nest too deeply.")
    except Exception as exc:
        return fail(f"The PDF is malformed ({type(exc).__name__}: {str(exc)[:200]}).")
    if not text.strip():
        return fail(f"The PDF's {n} page(s) hold no extractable text (scanned images need OCR, which is not done).")
    out.write(json.dumps({"pages": n, "truncated": truncated}).encode() + b"\n")
    out.write(text.encode("utf-8", errors="replace"))
    return 0


if __name__ == "__main__":  # pragma: no cover (the PDF worker: python -I extract.py ...)
    sys.exit(_pdf_worker(sys.argv[1:]))
