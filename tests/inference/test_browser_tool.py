"""The browser as function-calling families see it (``inference.browser_tool``): harmony's own three
functions, their arguments bounded so a call decoded under the schema is always short."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import xgrammar
from openai_harmony import ToolNamespaceConfig

from inference.browser_tool import BROWSER, browser_namespace

FUNCTIONS = {t["name"]: t for t in browser_namespace()["tools"]}


def _leaves(schema: dict[str, Any]) -> list[dict[str, Any]]:
    if "anyOf" in schema:
        return [leaf for branch in schema["anyOf"] for leaf in _leaves(branch)]
    return [schema]


def test_the_functions_and_arguments_are_harmonys_own() -> None:
    harmony = {t.name: t.parameters or {} for t in ToolNamespaceConfig.browser().tools}
    assert browser_namespace()["name"] == BROWSER and set(FUNCTIONS) == set(harmony)
    for name, params in harmony.items():
        ours = FUNCTIONS[name]["parameters"]
        assert set(ours["properties"]) == set(params["properties"]) and ours.get("required") == params.get("required")
        for prop, schema in params["properties"].items():
            assert ours["properties"][prop].get("default") == schema.get("default"), (name, prop)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_every_argument_is_bounded(name: str) -> None:
    """No string without a length, no number without a range, no property besides these: nothing a
    schema-constrained decoder could extend until the output budget ends."""
    params = FUNCTIONS[name]["parameters"]
    assert params["additionalProperties"] is False
    for prop, schema in params["properties"].items():
        for leaf in _leaves(schema):
            assert leaf["type"] in ("string", "integer", "boolean"), (name, prop, leaf)
            if leaf["type"] == "string":
                assert leaf["maxLength"] <= 2048, (name, prop)
            if leaf["type"] == "integer":
                assert "minimum" in leaf and leaf["maximum"] <= 99_999, (name, prop)


@pytest.mark.parametrize(
    ("name", "arguments", "valid"),
    [
        ("search", {"query": "harbor news"}, True),
        ("search", {"query": "harbor", "topn": 5}, True),
        ("search", {"query": "x" * 201}, False),
        ("search", {"query": "harbor", "topn": 2.5}, False),
        ("search", {"query": "harbor", "extra": 1}, False),
        ("open", {"id": 3}, True),
        ("open", {"id": "https://example.org/a", "cursor": 0, "loc": 10, "num_lines": 40}, True),
        ("open", {}, True),
        ("open", {"id": "https://example.org/" + "a" * 2048}, False),
        ("find", {"pattern": "reopened", "cursor": 1}, True),
        ("find", {"pattern": ""}, False),
    ],
)
def test_the_calls_the_browser_takes_pass_and_runaways_do_not(
    name: str, arguments: dict[str, Any], valid: bool
) -> None:
    schema = FUNCTIONS[name]["parameters"]
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(arguments))
    assert (not errors) == valid, errors


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_vllms_grammar_backend_compiles_each_schema_with_its_bounds(name: str) -> None:
    """xgrammar (vLLM's structured-output backend) turns ``maxLength`` into a bounded repetition: the
    bound reaches the decoder, not only the validator."""
    grammar = str(xgrammar.Grammar.from_json_schema(json.dumps(FUNCTIONS[name]["parameters"])))
    lengths = [
        leaf["maxLength"]
        for s in FUNCTIONS[name]["parameters"]["properties"].values()
        for leaf in _leaves(s)
        if "maxLength" in leaf
    ]
    for n in lengths:
        assert f",{n}}}" in grammar.replace(" ", ""), (n, grammar[:400])
