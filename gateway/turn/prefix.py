"""Full-history reuse: a request with no parent renders only what follows its longest known prefix.

Codex's HTTP transport and the AI SDK with ``store: false`` send the whole conversation every turn
and name no ``previous_response_id``: without this stage each such turn renders (and classifies)
its whole history, O(history) per turn. Here each request's items get a rolling digest

    d_0 = H(version ‖ tenant ‖ cache_salt ‖ prelude key)      d_i = H(d_{i-1} ‖ H(canonical(item_i)))

(blake2b, 128 bits; an item's own digest ``H(canonical(item))`` is kept with its check,
``gateway.turn.checks.ItemChecks``, so a re-sent conversation hashes only the items it had not sent
before, then 32 bytes an item), and the turn, once it ran, leaves its token view in a per-tenant cache
(``cache.prefix_cache``) under the digest of its whole input. The next request walks its own
digests from the longest down; the first one cached names a prefix whose tokens are known, and
only the items after it are rendered (``gateway.turn.render``) and classified
(``gateway.turn.classify``).

**A hit implies token-exact equality with a full render.** The seed holds everything before the
items that rendering depends on: the prelude key (``gateway.turn.render.prelude_key``: route,
renderer family and the renderer's own versioned key of instructions, tools, tool_choice and
reasoning effort), the tenant and the ``cache_salt``. ``canonical(item)`` is orjson with sorted
keys of the canonical item (``gateway.wire.items.canonical_item``) less ``id`` and ``status``,
which no renderer reads (the same two keys ``gateway.turn.resolve`` ignores when it matches re-sent
items; ids are random for items sent without one), and less null values, which every renderer
reads as absent. The chain covers every earlier item, so a tool
output's name — looked up from its call — is covered too; a request in which two calls share a
``call_id`` is not cached at all (which call names an output would then depend on where the render
starts). Where the cut is made, the renderer's append contract must hold: ``append_break`` is
asked at each boundary, as for a continuation.

**What a turn leaves, and the model's own tokens.** The entry under ``d(input)`` is the turn's
history view (``ResponseState.history_ids``): its first ``prompt_len`` tokens are the prompt
without the generation prompt (exact by induction: the prompt was a hit plus a rendered suffix, or
a full render); after them come the generation prompt and the model's sampled tokens, verbatim.
The next request re-sends the turn's output items, and a full render would put their *canonical*
rendering there, which equals the sampled tokens only when the model sampled canonically
(contract (c)/(d) of ``inference.harmony_render`` / ``inference.chat_template_render``). So the
decision is made at use, by tokens, not by trust: the lookup renders the re-sent output items
(O(output): ``respgate_prefix_cache_checked_tokens`` when they are not used in the prompt) and
compares them with the sampled tokens. Equal — the usual case — and the hit covers the outputs
too and uses the history view itself, which is the buffer's tip: the turn appends in place and the
engine's prefix cache holds every token of the prompt but the new input. Different (a real model's
non-canonical tokens, an AI SDK that drops reasoning or re-serializes arguments) and the hit ends
before the outputs: the prompt prefix is copied out of the history into a fresh buffer (O(history) copy, counted in
``respgate_prefix_cache_copied_tokens``; the public view API has no O(1) prefix view) and the
rendered outputs follow it — exactly what a full render gives, sharing with the engine's KV the
longest prefix any exact prompt can (up to where the sampled tokens and the canonical ones part).
Storing the sampled tokens under the digest of the output items instead would need that
comparison at the end of every turn, on the turn's own path, and would miss whenever a client
re-sends outputs differently.

**Classifiers and validation.** Items of the cached prefix entered the tenant's conversation in an
earlier turn: they were classified then (a block never leaves an entry: the turn did not run), or
they are the model's own output verified above — which a continuation never classifies either.
They are skipped, and a flag among them still counts for the conversation: the entry keeps the
turn's ``flagged``, and the new turn inherits it as a continuation inherits ``ResponseState.flagged``
(``TurnInput.flagged_before``). Wire validation (the request parse) still reads every item: the
digests are of canonical items, which only exist after it.

**Chained turns leave entries too.** A turn that continues a parent (WebSocket lanes, HTTP
``previous_response_id``) names the same digest a client re-sending that whole history would:
the parent's digest (``ResponseState.prefix_digest``) folded over the parent's output items and
the turn's new items — O(new input) (``PrefixReuse.extend``), folded when the turn's state is
built: after its terminal event, or before it for ``store=true`` (whose state is written first);
at resolve, in the prepare pool, for a body too big to prepare inline (``TurnInput.digest_later``).
Its entry is exact by
induction: the render stage appends only to a parent whose history is canonical, and a chain whose
turn was rendered in full for another reason (a changed prelude) stops leaving entries. This is what
makes a Codex whose WebSocket dropped cheap: it reconnects and re-sends the whole history without
``previous_response_id`` (tests/clients/test_codex_reconnect.py), and the lookup finds the last turn before
the drop, so only the tool output Codex had not sent yet is rendered.

**Bounds.** ``prefix_cache_bytes`` in all, ``prefix_cache_tenant_bytes`` per tenant, least recently
used conversation out (``cache.prefix_cache``); another tenant's entries are never read.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from cache.item_log import ItemLog
from cache.prefix_cache import PrefixCache
from cache.seq import TokenSeq
from gateway.base.metrics import Metrics
from gateway.turn.render import CallLookup, prelude_key
from gateway.turn.types import Item, PrefixMatch
from gateway.wire.kinds import CALL_TYPES
from inference.registry import ModelRoute
from inference.renderer import Prelude, Renderer

if TYPE_CHECKING:
    from cache.response_state import ResponseState
    from gateway.turn.finalize import Outcome
    from gateway.turn.types import PreparedTurn

log = logging.getLogger(__name__)

#: bumped whenever the serialization below changes meaning
VERSION = b"respgate-prefix-v3"
#: item keys no renderer reads (see the module docstring)
VOLATILE = frozenset({"id", "status"})
DIGEST_BYTES = 16


def seed(tenant: str | None, cache_salt: str | None, key: bytes) -> bytes:
    """``d_0``: what the items are rendered after (the prelude), and whose cache it is."""
    h = hashlib.blake2b(VERSION, digest_size=DIGEST_BYTES)
    for part in (
        b"-" if tenant is None else b"t" + tenant.encode(),
        b"-" if cache_salt is None else b"s" + cache_salt.encode(),
        key,
    ):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def canonical_bytes(item: Mapping[str, Any]) -> bytes:
    """The item as its rendering sees it: sorted keys, ``VOLATILE`` keys and keys whose value is
    null left out — null and absent read the same to every renderer (``item.get``), and the model's
    own output items carry nulls a client's re-send (``exclude_none``) does not (raises
    ``TypeError``/``orjson.JSONEncodeError`` for what JSON cannot hold)."""
    kept = dict(item)  # a copy and a deletion a volatile key, in C: cheaper than a comprehension
    for key in VOLATILE:
        kept.pop(key, None)
    if None in kept.values():
        kept = {k: v for k, v in kept.items() if v is not None}
    return orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)


def item_digest(item: Mapping[str, Any]) -> bytes:
    """``H(canonical(item))``: the item's link in the chain (raises as :func:`canonical_bytes`)."""
    return hashlib.blake2b(canonical_bytes(item), digest_size=DIGEST_BYTES).digest()


#: item digests already known, by the item object they were computed for: ``id(item) -> (item, digest)``
#: (the item is held, so an id is not reused while the mapping lives)
KnownDigests = Mapping[int, "tuple[Mapping[str, Any], bytes]"]


def digests(d0: bytes, items: Sequence[Mapping[str, Any]], known: KnownDigests | None = None) -> list[bytes]:
    """``[d_1 .. d_n]``: ``d_i`` names ``items[:i]`` after ``d0``."""
    out: list[bytes] = []
    d = d0
    blake2b = hashlib.blake2b
    for item in items:
        hit = known.get(id(item)) if known else None
        link = hit[1] if hit is not None and hit[0] is item else item_digest(item)
        d = blake2b(d + link, digest_size=DIGEST_BYTES).digest()
        out.append(d)
    return out


def _shared_call_ids(items: Sequence[Mapping[str, Any]]) -> bool:
    seen: set[Any] = set()
    for item in items:
        if item.get("type") in CALL_TYPES:
            cid = item.get("call_id")
            if cid in seen:
                return True
            seen.add(cid)
    return False


class PrefixReuse:
    """The lookup (``match``, CPU: may run in the prepare pool) and the record after a turn (``record``,
    on the event loop: O(1))."""

    def __init__(self, cache: PrefixCache, metrics: Metrics) -> None:
        self.cache = cache
        self.metrics = metrics

    def match(
        self,
        items: Sequence[Item],
        new_calls: Mapping[str, Item],
        route: ModelRoute,
        prelude: Prelude,
        tenant: str | None,
        cache_salt: str | None,
        known: KnownDigests | None = None,
    ) -> PrefixMatch | None:
        """The longest cached prefix of ``items`` (a request with no parent), or a miss carrying the
        request's digest; None when the request cannot be cached (empty, unserializable, shared call ids)."""
        lookups = self.metrics.prefix_lookups
        if not items or _shared_call_ids(items):
            lookups.labels("ineligible").inc()
            return None
        try:
            ds = digests(seed(tenant, cache_salt, prelude_key(route, prelude)), items, known)
        except (TypeError, orjson.JSONEncodeError):
            lookups.labels("ineligible").inc()
            return None
        calls = CallLookup(ItemLog(), new_calls)
        for i in range(len(items), 0, -1):
            entry = self.cache.get(tenant, ds[i - 1])
            if entry is None:
                continue
            try:
                hit = self._continue(entry, ds[-1], items, i, route.renderer, calls)
            except ValueError:  # the renderer refuses these items: the render stage says why (a 400)
                hit = None
            if hit is not None:
                self.cache.touch(entry)
                lookups.labels("hit").inc()
                self.metrics.prefix_reused_tokens.inc(len(hit.ids) if hit.ids is not None else 0)
                return hit
        lookups.labels("miss").inc()
        return PrefixMatch(ds[-1])

    def _continue(
        self, entry: Any, digest: bytes, items: Sequence[Item], i: int, renderer: Renderer, calls: CallLookup
    ) -> PrefixMatch | None:
        """The hit ``entry`` (cached for ``items[:i]``) gives, or None when no exact cut exists there."""
        n, ids, plen = len(items), entry.ids, entry.prompt_len
        j = i + entry.outputs
        lead: list[int] | None = None
        if entry.outputs and j <= n and len(ids) > plen and renderer.append_break(items[:i], items[i:j]) is None:
            # the re-sent output items: are they the tokens the model sampled?
            mid = renderer.render_items(items[i:j], calls=calls)
            ends = j == n or renderer.append_break(items[:j], items[j:]) is None
            if ends and len(mid) == len(ids) - plen and mid == ids[plen:]:
                self.metrics.prefix_checked_tokens.inc(len(mid))
                return PrefixMatch(
                    digest, ids=ids, covered=j, seen=j, flagged=entry.flagged, chain=entry.chain, root_id=entry.root_id
                )
            if ends:
                lead = mid  # canonical, not sampled: the prompt prefix, then these (rendered tokens)
            else:
                self.metrics.prefix_checked_tokens.inc(len(mid))
        if lead is None and i < n and renderer.append_break(items[:i], items[i:]) is not None:
            return None
        if plen == len(ids):
            base, chain = ids, entry.chain
        else:  # the sampled tokens after the prompt are not what a full render has there
            base, chain = TokenSeq(ids[:plen]), None
            self.metrics.prefix_copied_tokens.inc(plen)
        return PrefixMatch(
            digest,
            ids=base,
            covered=i if lead is None else j,
            seen=i,
            lead=tuple(lead or ()),
            flagged=entry.flagged,
            chain=chain,
            root_id=entry.root_id,
        )

    def extend(self, parent: ResponseState, new_items: Sequence[Item]) -> bytes | None:
        """The digest of a chained turn's input: the parent's, extended by the parent's output items
        and the turn's new items — what a client re-sending the whole history sends (a Codex that
        lost its WebSocket reconnects so). None when the parent has none or a call id repeats."""
        if parent.prefix_digest is None:
            return None
        n_out = len(parent.response.get("output") or ())
        context = parent.context
        outputs = context[len(context) - n_out :] if n_out else []
        for item in outputs:  # already in the parent's context: each must be the first with its id
            if item.get("type") in CALL_TYPES:
                cid = item.get("call_id")
                if not isinstance(cid, str) or context.call(cid) is not item:
                    return None
        seen: set[Any] = set()
        for item in new_items:
            if item.get("type") in CALL_TYPES:
                cid = item.get("call_id")
                if cid in seen or (isinstance(cid, str) and context.call(cid) is not None):
                    return None
                seen.add(cid)
        try:
            ds = digests(parent.prefix_digest, [*outputs, *new_items])
        except (TypeError, orjson.JSONEncodeError):
            return None
        return ds[-1] if ds else parent.prefix_digest

    def record(self, turn: PreparedTurn, outcome: Outcome, state: ResponseState) -> None:
        """Keep what the finished turn left (``Finalizer``'s state hook): its history view, under the
        digest of its input. Only a turn whose prompt is the exact rendering of its input items
        qualifies (``ResponseState.prefix_digest`` is set: no truncation, no compaction; a parentless
        request, or an append to a parent that qualified) and only one that can be continued."""
        digest = state.prefix_digest
        rendered = turn.rendered
        if digest is None:
            return
        ids = state.history_ids
        # from the lengths fixed at render time: the run stage may have grown ``rendered.new_ids``
        # in place (a full render's list becomes the history's buffer)
        prompt_len = (len(rendered.base_ids) if rendered.base_ids is not None else 0) + rendered.stats.new_tokens
        if outcome.history is None or prompt_len <= 0 or len(ids) < prompt_len:
            return
        match, parent = turn.input.prefix, turn.input.parent
        near = match.chain if match is not None else None
        if match is None and parent is not None and parent.prefix_digest is not None:
            above = self.cache.get(turn.ctx.tenant, parent.prefix_digest)
            near = above.chain if above is not None else None
        try:
            self.cache.put(
                turn.ctx.tenant,
                digest,
                ids,
                prompt_len,
                len(outcome.output),
                turn.flagged,
                near=near,
                root_id=state.root,
            )
        except Exception:  # a bug here must not fail the turn: the next one only renders more
            log.exception("prefix cache: recording response %s failed", turn.id)
