"""``inference.renderer.PerToolSet``: what a renderer builds from a prelude's tools, once per tool set."""

from __future__ import annotations

import threading

from inference.harmony_core import ToolCatalog
from inference.renderer import PerToolSet

TOOLS = (
    {"type": "function", "name": "shell", "parameters": {"type": "object"}},
    {"type": "custom", "name": "apply_patch"},
)


def test_built_once_per_tuple_and_anew_for_an_equal_other_one():
    built: list[tuple] = []
    memo = PerToolSet(lambda tools: built.append(tools) or len(built))
    first = memo(TOOLS)
    assert memo(TOOLS) == first and len(built) == 1  # the same tuple: not built again
    other = tuple(dict(t) for t in TOOLS)
    assert other == TOOLS and memo(other) != first  # equal, not the same: built for itself
    assert memo(list(TOOLS)) != first and len(built) == 3  # a list is built every time
    assert memo(list(TOOLS)) and len(built) == 4


def test_bounded_oldest_out_and_an_id_is_not_reused_while_kept():
    memo = PerToolSet(lambda tools: object(), size=4)
    kept = [tuple([{"type": "function", "name": f"t{i}"}]) for i in range(6)]
    values = [memo(t) for t in kept]
    assert len(memo._memo) == 4
    assert memo(kept[5]) is values[5] and memo(kept[2]) is values[2]
    assert memo(kept[0]) is not values[0]  # evicted, built again
    for tools, _ in memo._memo.values():  # the memo holds each tuple it names
        assert any(tools is t for t in kept)


def test_threads_share_one_memo():
    memo = PerToolSet(ToolCatalog, size=8)
    sets = [tuple([{"type": "function", "name": f"t{i}", "parameters": {"type": "object"}}]) for i in range(32)]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(400):
                tools = sets[(i * (k + 1)) % len(sets)]
                assert memo(tools).function_names() == [(None, tools[0]["name"])]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(memo._memo) <= 8
