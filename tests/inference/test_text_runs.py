"""``inference.text_runs.segments``: neither the window prefilter nor the run-start guard of the
search changes the cut.

The reference is the plain search (what ``segments`` did before both: quadratic on runs just under
the limit, so the texts here stay small enough for it).
Texts are random runs of each class — letters, combining marks, ASCII and Unicode whitespace,
digits, symbols, CJK — with lengths around the window and ``MAX_RUN`` boundaries, so a long run
starts and ends at every offset a window can have.
"""

from __future__ import annotations

import base64
import random

import regex

from inference import text_runs
from inference.text_runs import MAX_RUN, segments

CLASSES = {
    "letters": "abcdefghijXYZ\u00e9\u03bb\u0416",
    "marks": "\u0301\u0308",  # combining: in the letter class
    "space": " \t\n\r\u00a0\u3000\u2028\u0085\u200a",
    "digits": "0123456789\u0663",
    "symbols": "-_=+*/\\|!?.,;:'\"()[]{}<>@#$%^&~`\u2014",
    "cjk": "\u4e2d\u6587\u5b57",
}


_N = MAX_RUN + 1
_PLAIN = regex.compile(r"[\p{L}\p{M}]{%d,}|\s{%d,}|[^\s\p{L}\p{N}]{%d,}" % (_N, _N, _N))


def reference(text: str) -> list[str]:
    return [text] if len(text) <= MAX_RUN else text_runs.cut(text, _PLAIN.finditer(text))


def _text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.choice(list(CLASSES))
        if rng.random() < 0.25:
            n = rng.choice(
                [
                    MAX_RUN - 1,
                    MAX_RUN,
                    MAX_RUN + 1,
                    MAX_RUN + 2,
                    2 * MAX_RUN + 1,
                    text_runs._WINDOW - 1,
                    text_runs._WINDOW,
                    text_runs._WINDOW + 1,
                ]
            ) + rng.randint(-3, 3)
        else:
            n = rng.choice([1, 2, 5, 40, 300])
        chars = CLASSES[kind] if kind != "marks" else CLASSES["letters"] + CLASSES["marks"]
        pattern = "".join(rng.choices(chars, k=17))  # a run of the class, built at C speed
        parts.append((pattern * (n // 17 + 1))[: max(1, n)])
        if rng.random() < 0.5:
            parts.append(rng.choice(["hello world ", "x = 1\n", "  ", "."]))
    return "".join(parts)


def test_segments_equal_the_full_search_on_random_runs():
    rng = random.Random(15)
    long_runs = 0
    for _ in range(150):
        text = _text(rng)
        got = segments(text)
        assert got == reference(text)
        assert "".join(got) == text
        long_runs += len(got) > 1
    assert long_runs > 20  # the long-run path was taken, not only the prefilter's


def test_a_long_run_at_every_window_offset_is_found():
    base = "plain words, 12 numbers; and more.\n" * 130
    for cls in ("letters", "space", "symbols"):
        for offset in range(0, 2 * text_runs._WINDOW + 2, 293):
            for length in (MAX_RUN + 1, MAX_RUN + 2, 3 * text_runs._WINDOW):
                text = base[:offset] + CLASSES[cls][0] * length + base
                assert segments(text) == reference(text) and len(segments(text)) > 1, (cls, offset, length)


def test_runs_of_two_classes_that_share_marks_and_runs_just_under_the_limit():
    """Combining marks belong to the letter class and to the symbol class: a symbol run may start
    right after a letter run that ended in marks (the search's ``\\G``), and a run may begin with
    marks; runs one short of the limit are read once each (the input that was quadratic)."""
    cases = [
        base64.b64encode(random.Random(1).randbytes(9000)).decode() + "A" * _N,
        "a" * 5000 + "\u0301" + "-" * 5000,
        "-" * 3000 + "\u0301" * 3000 + "a" * 5000,
        "x" + "\u0301" * MAX_RUN,
        "-" + "\u0301" * MAX_RUN + "a" * _N,
        " " * 5000 + "a" * _N + "!" * _N,
        ("a" * MAX_RUN + " ") * 3,
        ("-" * MAX_RUN + "a") * 3,
        ("\u3000" * MAX_RUN + "z") * 3,
    ]
    for text in cases:
        assert segments(text) == reference(text), text[:20]
    hostile = ("a" * MAX_RUN + " ") * 40  # 160 KB that took the plain search 5 s
    assert segments(hostile) == [hostile]


def test_real_text_is_not_searched(monkeypatch):
    """The point of the prefilter: a long real text is handed over whole without the full search."""
    calls = []

    class Spy:
        def finditer(self, text, **kw):
            calls.append(len(text))
            return iter(())

    monkeypatch.setattr(text_runs, "_LONG_RUN", Spy())
    code = "def f(x):\n    return x + 1  # a comment\n" * 2000
    blob = base64.b64encode(random.Random(3).randbytes(60_000)).decode()  # no whitespace at all
    minified = '{"a":[1,2,{"b":"xyz"}],"c":"hello_world"},' * 2000
    for text in (code, blob, minified):
        assert segments(text) == [text]
    assert calls == []
