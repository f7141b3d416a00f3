"""gpt-oss's citation marks to Responses ``url_citation`` and ``file_citation`` annotations, on a
streamed text part.

gpt-oss cites what its ``browser`` showed as ``【{cursor}†L{start}-L{end}】`` (or ``【{cursor}†L{n}】``);
the Responses API wants the final ``output_text`` to carry ``url_citation`` annotations whose
``[start_index, end_index)`` cover a span of that text. As OpenAI's hosted web search does, each
resolvable mark becomes an inline Markdown link ``([domain](url))`` and the annotation covers exactly
that link. ``file_search`` shows its results headed ``【{call}:{n}†{filename}】`` (OpenAI's own
file-citation mark, e.g. ``【4:0†notes.md】``) and the model cites with that mark: each resolvable
one is removed from the text and becomes a ``file_citation`` annotation at the ``index`` where it
was (OpenAI's file citations carry no link text). :class:`CitationWriter` is sans-I/O: deltas in,
text to emit and annotations out. Each family is on only with its resolver (``resolve`` for the
browser's marks, ``resolve_file`` for the files'); without it its marks are ordinary text.

Why it holds back what it holds back: every emitted delta goes to the client at once, and a client
cannot take characters back, so a mark must never be emitted half-written; but holding more than a
mark delays the answer. So text is released at once up to a ``【``; from a ``【`` on, the text is held
only while it is still a prefix of a mark (``_NEXT`` and ``_FILE_NEXT``, the grammars as transition
tables) and shorter than the bound of its family (``max_mark_chars`` for a browser mark, ``max_file_mark_chars`` for a
file mark, whose filename makes it longer; the larger of the two while ``【{digits}`` could still be
either); the first character that breaks the grammar releases it verbatim (and is itself looked at
again: it may be the next ``【``). Nothing else is ever held, so memory is bounded by the larger bound
and each character costs O(1): ``str.find`` jumps over ordinary text, a held character is one table
step, a finished mark is parsed once. The decisions depend on the characters only, never on where
the deltas were cut, so any split of a stream gives the same text and annotations as the whole text
fed at once.

Decisions, and why:

* **The grammar is strict**: ``【`` ASCII digits ``†L`` digits, optionally ``-L`` or ``–L`` (en dash)
  digits, ``】``, no whitespace — the forms gpt-oss writes. Anything else that starts with ``【``
  (``【note】``, ``【3†x】``, a mark longer than ``max_mark_chars``; a file mark is the other family,
  below) is emitted verbatim: it is the
  model's text, not a citation, and rewriting text we do not understand would be worse.
* **The search-results form** ``【{id}†{title}†{domain}】`` (how the browser shows links) is verbatim
  too: it names a result the model did not open, so no lines were read to cite, and its title makes
  its length unbounded, so it could not be recognised within a bounded hold anyway.
* **A well-formed mark that does not resolve** (unknown cursor, lines off the page, a reversed range
  ``L20-L10``, which the writer rejects without asking) is removed, with no annotation: ``【9†L2】``
  would be noise in every client. The text around it is left as it is (``a 【9†L2】 b`` gives
  ``a  b``): the space before it is already sent, fixing it would mean holding back every space of
  the answer, and Markdown renders the two spaces as one.
* **Adjacent marks form one run** (nothing between them; a removed mark counts as nothing), and a run
  links each distinct URL once: ``【3†L1】【3†L4-L6】`` gives one link and one annotation (the first
  mark's title), ``【3†L1】【5†L2】`` two links, `` ([a.com](…)) ([b.org](…))``. Only adjacent marks
  merge, because merging across text would mean holding that text back.
* **The link**: `` ([domain](url))``, the leading space only when the text before it is non-empty and
  does not end in whitespace; the annotation covers ``([domain](url))``. ``domain`` is the URL's host
  (lower-cased by ``urlsplit``, an IDN host shown as it is, an IPv6 literal in brackets) without a
  leading ``www.``, with ``\\``, ``[`` and ``]`` escaped; a URL without a host shows ``source``. In
  the link target, whitespace, ASCII control characters, ``(``, ``)``, ``<``, ``>`` and ``\\`` are
  percent-encoded (each would end or corrupt a CommonMark link); the annotation's ``url`` is the raw
  URL, as the browser opened it.
* **The file mark's grammar**: ``【`` ASCII digits ``:`` ASCII digits ``†``, then a title of at least
  one character that is not ``】``, ``【`` or ``\\n``, then ``】``; the colon after the first digits
  is what tells it from a browser mark. The title may hold anything else (spaces, ``†``, ``:``), so
  its length is bounded only by ``max_file_mark_chars`` (the whole mark, ``【`` and ``】`` included):
  longer, it is released verbatim. A ``【`` in the title breaks the mark (released verbatim; the
  ``【`` may start the next mark), so released text never hides a mark start.
* **The file mark's title is not trusted**: the model may misspell it, and ``{call}:{n}`` alone names
  what it was shown; the annotation's ``file_id`` and ``filename`` are what ``resolve_file`` gives.
  With ``check_titles`` (what ``file_search`` uses) the title must still name the file its numbers
  resolve to (its name, ignoring case and surrounding spaces, or its id), else the mark is
  unresolvable: call numbers restart in each response, so a mark the model copies from an earlier
  response's passages could name a passage of this one, of another file; a wrong file cited is
  worse than none.
  An unresolvable file mark is removed with no annotation, as a browser mark is. A file mark writes
  nothing, so it leaves the run open: ``【4:0†a.md】【4:1†a.md】`` for two passages of one file gives
  one annotation (one per ``file_id`` in a run), and ``【3†L1】【4:0†a.md】【3†L2】`` one link.
* **Indices are Python ``str`` indices** (code points) from the start of the part, across calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit


class Source(NamedTuple):
    """What a citation links to: the page's URL and title."""

    url: str
    title: str


class FileSource(NamedTuple):
    """What a file citation names: the file's id and its name."""

    file_id: str
    filename: str


#: (cursor, first_line, last_line or None) -> the source the cited lines came from, or None
Resolve = Callable[[int, int, int | None], Source | None]
#: (call, n) -> the file of the ``n``-th result ``file_search`` call ``call`` showed, or None
ResolveFile = Callable[[int, int], FileSource | None]

#: the shortest mark, ``【0†L0】``: a smaller ``max_mark_chars`` could never recognise one
MIN_MARK_CHARS = 6
DEFAULT_MAX_MARK_CHARS = 64
#: the shortest file mark, ``【0:0†a】``
MIN_FILE_MARK_CHARS = 7
#: a 255-character filename and the call and result numbers fit
DEFAULT_MAX_FILE_MARK_CHARS = 300

_OPEN = "【"
_DIGITS = frozenset("0123456789")
_DASHES = frozenset("-–")
#: the characters the grammars name one by one; every other character is of class ``other``
_NAMED = frozenset("†L】:【\n")
#: the prefix both families share: ``open`` is the state right after ``【``
_SHARED: dict[tuple[str, str], str] = {
    ("open", "digit"): "cursor",
    ("cursor", "digit"): "cursor",
}
#: the browser mark's grammar as transitions: (state, character class) -> next state; a pair not in
#: the writer's table means the held text is not a mark.
_NEXT: dict[tuple[str, str], str] = {
    **_SHARED,
    ("cursor", "†"): "dagger",
    ("dagger", "L"): "first_l",
    ("first_l", "digit"): "first",
    ("first", "digit"): "first",
    ("first", "dash"): "dash",
    ("first", "】"): "closed",
    ("dash", "L"): "last_l",
    ("last_l", "digit"): "last",
    ("last", "digit"): "last",
    ("last", "】"): "closed",
}
#: what a title may hold: every class but ``】``, ``【`` and ``\n``
_TITLE_CLASSES = ("digit", "dash", "†", "L", ":", "other")
#: the file mark's grammar, the same way
_FILE_NEXT: dict[tuple[str, str], str] = {
    **_SHARED,
    ("cursor", ":"): "colon",
    ("colon", "digit"): "result",
    ("result", "digit"): "result",
    ("result", "†"): "file_dagger",
    **{("file_dagger", c): "title" for c in _TITLE_CLASSES},
    **{("title", c): "title" for c in _TITLE_CLASSES},
    ("title", "】"): "file_closed",
}
#: the states only a file mark reaches: the held text is bounded by ``max_file_mark_chars`` there
_FILE_STATES = frozenset(_FILE_NEXT.values()) - frozenset(_SHARED.values())
#: reads the numbers of a mark the table has closed (it always matches then)
_MARK = re.compile(r"【([0-9]+)†L([0-9]+)(?:[-–]L([0-9]+))?】")
_FILE_MARK = re.compile(r"【([0-9]+):([0-9]+)†([^】【\n]+)】")
#: what would end or corrupt a CommonMark link destination
_UNSAFE_IN_TARGET = re.compile(r"[\s\x00-\x1f\x7f()<>\\]")
_ESCAPE_IN_TEXT = str.maketrans({"\\": "\\\\", "[": "\\[", "]": "\\]"})


def _char_class(ch: str) -> str:
    if ch in _DIGITS:
        return "digit"
    if ch in _DASHES:
        return "dash"
    return ch if ch in _NAMED else "other"


def link_domain(url: str) -> str:
    """The link's text for ``url``: its host without ``www.``, Markdown-escaped."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        host = ""
    if ":" in host:
        host = f"[{host}]"
    return (host.removeprefix("www.") or "source").translate(_ESCAPE_IN_TEXT)


def link_target(url: str) -> str:
    """``url`` as a Markdown link destination: what would break the link percent-encoded."""
    return _UNSAFE_IN_TARGET.sub(lambda m: quote(m.group(), safe=""), url)


def _names(title: str, source: FileSource) -> bool:
    """Whether a file mark's title names ``source``."""
    title = title.strip().casefold()
    return title == source.filename.strip().casefold() or title == source.file_id.casefold()


class CitationWriter:
    """Rewrites one streamed text part: feed its deltas, then ``finish``; see the module docstring."""

    def __init__(
        self,
        resolve: Resolve | None = None,
        *,
        resolve_file: ResolveFile | None = None,
        max_mark_chars: int = DEFAULT_MAX_MARK_CHARS,
        max_file_mark_chars: int = DEFAULT_MAX_FILE_MARK_CHARS,
        check_titles: bool = False,
    ) -> None:
        """``check_titles``: a file mark resolves only when its title names the file (module docstring)."""
        if max_mark_chars < MIN_MARK_CHARS:
            raise ValueError(f"max_mark_chars must be at least {MIN_MARK_CHARS}")
        if max_file_mark_chars < MIN_FILE_MARK_CHARS:
            raise ValueError(f"max_file_mark_chars must be at least {MIN_FILE_MARK_CHARS}")
        self._resolve = resolve
        self._resolve_file = resolve_file
        self._check_titles = check_titles
        #: the grammar of the families that are on; empty: no 【 is ever held
        self._next: dict[tuple[str, str], str] = {
            **(_NEXT if resolve is not None else {}),
            **(_FILE_NEXT if resolve_file is not None else {}),
        }
        #: the bound on the held text in each state the table reaches: its family's, or while the
        #: text could still be either (``【{digits}``) the larger of those that are on
        either = max(
            max_mark_chars if resolve is not None else 0, max_file_mark_chars if resolve_file is not None else 0
        )
        self._max: dict[str, int] = {}
        for state in self._next.values():
            if state in _SHARED.values():
                self._max[state] = either
            else:
                self._max[state] = max_file_mark_chars if state in _FILE_STATES else max_mark_chars
        self._held = ""  # a prefix of a mark, starting with 【; "" when outside one
        self._state = ""  # the table state of the held text
        self._emitted = 0  # code points emitted so far
        self._last = ""  # the last character emitted
        #: ("url", url) and ("file", file_id) cited since the last emitted text: the open run
        self._run: set[tuple[str, str]] = set()
        self._annotations: list[dict[str, Any]] = []
        self._finished = False

    @property
    def annotations(self) -> list[dict[str, Any]]:
        """All annotations so far, in text order."""
        return list(self._annotations)

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """The text to emit now (may be "") and the annotations completed by it; start/end indices
        count from the start of the whole part (all text emitted so far, across calls)."""
        if self._finished:
            raise RuntimeError("feed after finish: a CitationWriter rewrites one part")
        out: list[str] = []
        new: list[dict[str, Any]] = []
        i, n = 0, len(text)
        while i < n:
            if not self._held:
                j = text.find(_OPEN, i) if self._next else -1
                if j < 0:
                    self._text(out, text[i:])
                    break
                self._text(out, text[i:j])
                self._held, self._state, i = _OPEN, "open", j + 1
                continue
            state = self._next.get((self._state, _char_class(text[i])))
            if state is None:
                self._release(out)  # text[i] is looked at again, outside a mark
                continue
            self._held += text[i]
            i += 1
            if state == "closed":
                self._close(out, new)
            elif state == "file_closed":
                self._close_file(new)
            elif len(self._held) >= self._max[state]:
                self._release(out)  # one more character would make it longer than a mark may be
            else:
                self._state = state
        return "".join(out), new

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """End of the part: release whatever is held (an unfinished mark is emitted verbatim)."""
        self._finished = True
        out: list[str] = []
        if self._held:
            self._release(out)
        return "".join(out), []

    def _write(self, out: list[str], piece: str) -> None:
        out.append(piece)
        self._emitted += len(piece)
        self._last = piece[-1]

    def _text(self, out: list[str], piece: str) -> None:
        if piece:
            self._write(out, piece)
            self._run.clear()

    def _release(self, out: list[str]) -> None:
        held, self._held, self._state = self._held, "", ""
        self._text(out, held)

    def _close(self, out: list[str], new: list[dict[str, Any]]) -> None:
        mark, self._held, self._state = self._held, "", ""
        m = _MARK.fullmatch(mark)
        assert m is not None and self._resolve is not None, mark  # the table accepts what _MARK matches
        first = int(m.group(2))
        last = None if m.group(3) is None else int(m.group(3))
        source = None if last is not None and last < first else self._resolve(int(m.group(1)), first, last)
        if source is None or ("url", source.url) in self._run:
            return
        if self._last and not self._last.isspace():
            self._write(out, " ")
        link = f"([{link_domain(source.url)}]({link_target(source.url)}))"
        start = self._emitted
        self._write(out, link)
        self._run.add(("url", source.url))
        annotation = {
            "type": "url_citation",
            "url": source.url,
            "title": source.title,
            "start_index": start,
            "end_index": start + len(link),
        }
        self._annotations.append(annotation)
        new.append(annotation)

    def _close_file(self, new: list[dict[str, Any]]) -> None:
        mark, self._held, self._state = self._held, "", ""
        m = _FILE_MARK.fullmatch(mark)
        assert m is not None and self._resolve_file is not None, mark  # as for _MARK
        source = self._resolve_file(int(m.group(1)), int(m.group(2)))
        if source is not None and self._check_titles and not _names(m.group(3), source):
            source = None  # the numbers name another file than the title: a stale or mixed-up mark
        if source is None or ("file", source.file_id) in self._run:
            return
        self._run.add(("file", source.file_id))
        annotation = {
            "type": "file_citation",
            "file_id": source.file_id,
            "filename": source.filename,
            "index": self._emitted,
        }
        self._annotations.append(annotation)
        new.append(annotation)
