"""The settings reference page is generated from ``gateway/base/settings.py`` and committed; these
tests fail when the two differ, so a setting cannot change without its documentation (issue 29 item 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.base.settings import Settings
from gateway.ops import settings_doc

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_the_generated_one():
    committed = (REPO / settings_doc.PAGE).read_text()
    assert committed == settings_doc.render(), (
        f"{settings_doc.PAGE} differs from gateway/base/settings.py: run `{settings_doc.COMMAND}` and commit it"
    )


def test_every_setting_is_on_the_page_with_its_variable():
    page = (REPO / settings_doc.PAGE).read_text()
    listed = [e.name for s in settings_doc.sections() for e in s.entries]
    assert sorted(listed) == sorted(Settings.model_fields)  # each once, none missing
    for name in Settings.model_fields:
        assert f"| `{name}` | `RESPGATE_{name.upper()}`" in page, name


def test_the_variables_the_page_names_are_the_ones_settings_read(monkeypatch):
    """Spot checks of the name mapping the page states, one per kind of value."""
    monkeypatch.setenv("RESPGATE_PORT", "9123")
    monkeypatch.setenv("RESPGATE_REMOTE_SESSION_HEADER", "x-chain")
    monkeypatch.setenv("RESPGATE_CLASSIFIERS", "secrets")
    monkeypatch.setenv("RESPGATE_ALLOWED_ORIGINS", '["https://a.example", "https://b.example"]')
    s = Settings.from_env()
    assert (s.port, s.remote_session_header) == (9123, "x-chain")
    assert s.classifiers == ["secrets"] and s.allowed_origins == ["https://a.example", "https://b.example"]


def test_the_flags_the_page_names_set_their_setting():
    import argparse

    from gateway.ops.cli import build_parser

    flags = settings_doc.serve_flags()
    assert flags["port"] == "--port" and flags["default_max_output_tokens"] == "--max-output-tokens"
    parser = build_parser()
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    action = {a.option_strings[0]: a for a in serve._actions if a.option_strings}
    for name, flag in flags.items():
        a = action[flag]
        value = [] if a.nargs == 0 else [str(next(iter(a.choices))) if a.choices else "1"]
        assert getattr(parser.parse_args(["serve", flag, *value]), name) not in (None, []), (name, flag)


def test_a_setting_without_a_doc_comment_is_refused():
    source = Path(settings_doc.settings_module.__file__).read_text()
    bare = source.replace("    port: int = 8000\n", "    port: int = 8000\n    undocumented_thing: int = 1\n", 1)
    assert bare != source
    with pytest.raises(settings_doc.UndocumentedSetting, match="undocumented_thing"):
        settings_doc.sections(bare)
    assert settings_doc.sections(source)  # the real file passes


def test_doc_comments_and_section_headings_are_read_from_the_source():
    source = """class Settings(BaseModel):
    # -- the first room (somewhere.py) ----
    #: one line
    #: and its second
    alpha: int = 1
    #: beta's doc
    beta: str = Field(default="b", ge=1)
"""
    (section,) = settings_doc.sections(source)
    assert section.title == "the first room (somewhere.py)"
    assert [(e.name, e.doc, e.default_source) for e in section.entries] == [
        ("alpha", "one line and its second", "1"),
        ("beta", "beta's doc", "'b'"),
    ]


def test_the_command_rewrites_the_page(tmp_path, capsys):
    assert settings_doc.main(["--root", str(tmp_path), "--check"]) == 1  # no page there yet
    assert "run `python -m gateway.ops.settings_doc`" in capsys.readouterr().err
    assert settings_doc.main(["--root", str(tmp_path)]) == 0
    assert (tmp_path / settings_doc.PAGE).read_text() == settings_doc.render()
    assert settings_doc.main(["--root", str(tmp_path), "--check"]) == 0
