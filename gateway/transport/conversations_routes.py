"""HTTP routes of the Conversations API: conversations and their items (``gateway.turn.conversation``).

    POST   /v1/conversations                          create (initial ``items``, ``metadata``)
    GET    /v1/conversations/{id}                     retrieve
    POST   /v1/conversations/{id}                     update ``metadata``
    DELETE /v1/conversations/{id}                     delete (with its items)
    GET    /v1/conversations/{id}/items               list: ``after``, ``limit``, ``order``, ``include``
    POST   /v1/conversations/{id}/items               add items (at most 20)
    GET    /v1/conversations/{id}/items/{item_id}     retrieve an item
    DELETE /v1/conversations/{id}/items/{item_id}     delete an item (returns the conversation)

Thin adapters, authenticated and rate-limited like the responses routes (writes are admitted as
requests, reads only authenticated, as ``GET /v1/responses/{id}`` is). Everything a conversation
holds is the tenant's: another tenant's id is a 404 indistinguishable from an unknown one. A turn
on a conversation (``conversation`` on a create) is the responses routes' business.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from cache.conversations import Conversation
from gateway.transport.http_routes import read_json_body
from gateway.transport.resource_routes import json_answer, resource_route
from gateway.transport.services import GatewayState
from gateway.turn.checks import no_call_for, orphan_outputs
from gateway.turn.conversation import Conversations
from gateway.turn.types import TurnContext
from gateway.wire.conversations import (
    CreateBody,
    ItemsBody,
    UpdateBody,
    conversation_not_found,
    conversation_object,
    deleted_object,
    item_list,
    item_not_found,
    item_object,
    parse_body,
)
from gateway.wire.errors import unknown_parameter
from gateway.wire.items import new_id
from gateway.wire.kinds import CALL_TYPES
from gateway.wire.listing import check_include, parse_list_query
from gateway.wire.request import parse_items

router = APIRouter()


_route = resource_route(router, "conversations")


_json = json_answer


def _conversation_json(
    conv: Conversation | None, conversation_id: str, headers: dict[str, str] | None = None
) -> Response:
    """The conversation object answer (create, retrieve, update, an item's delete): one place
    shapes it, and answers 404 where the store found none (another tenant's id is one too), so
    that the routes cannot drift apart in either."""
    if conv is None:
        raise conversation_not_found(conversation_id)
    return _json(conversation_object(conv.id, conv.created_at, conv.metadata), headers)


def _conversations(request: Request) -> tuple[GatewayState, Conversations]:
    gw: GatewayState = request.app.state.gateway
    return gw, gw.pipeline.conversations


async def _reader(request: Request) -> tuple[Conversations, str | None]:
    """A read: authenticated."""
    gw, convs = _conversations(request)
    return convs, (await gw.auth.authenticate(request.headers)).tenant


async def _writer(request: Request) -> tuple[GatewayState, Conversations, str | None, dict[str, str], Any]:
    """A write: authenticated, admitted (429 before the body is read), and its JSON body."""
    gw, convs = _conversations(request)
    principal = await gw.auth.authenticate(request.headers)
    admitted = await gw.access.admit(principal)
    body = await read_json_body(request, gw, principal.tenant)
    return gw, convs, principal.tenant, gw.access.headers(admitted), body


def _only(request: Request, *allowed: str) -> list[str]:
    """The query's ``include`` values; any other parameter is a 400."""
    for key in request.query_params:
        if key not in allowed:
            raise unknown_parameter(key)
    values = [v for k, v in request.query_params.multi_items() if k in ("include", "include[]")]
    check_include(values)
    return values


async def _added(
    request: Request, convs: Conversations, raw_items: list[Any], tenant: str | None, conversation_id: str | None = None
) -> list[Any]:
    """Items a client adds: canonical, checked as a create's input is, then classified once as they
    enter the conversation (a turn on it treats them as history, as it treats a parent's items).

    Checked: every tool output answers a call before it — among the items, or already in the
    conversation ``conversation_id`` names (read only when an output's call is not among the
    items). An orphan output would be stored, and no turn on the conversation could render it."""
    gw: GatewayState = request.app.state.gateway
    items = await convs.new_items(raw_items, tenant)
    orphans = orphan_outputs(items)
    if orphans and conversation_id is not None:
        _, stored = await convs.call("items", conversation_id, convs.store.items, conversation_id, tenant)
        calls = {it.get("call_id") for it in stored if it.get("type") in CALL_TYPES}
        orphans = [o for o in orphans if o[1] not in calls]
    if orphans:
        raise no_call_for(orphans[0], "items")
    await gw.pipeline.classify.classify_added(items, TurnContext(transport="http", tenant=tenant))
    return items


@_route("POST", "/conversations")
async def create_conversation(request: Request) -> Response:
    _, convs, tenant, headers, body = await _writer(request)
    req: CreateBody = parse_body(CreateBody, body)
    items = await _added(request, convs, parse_items(req.items or [], "items"), tenant)
    conversation_id = new_id("conv")
    conv = await convs.call(
        "create", conversation_id, convs.store.create, conversation_id, tenant, req.metadata or {}, items
    )
    return _conversation_json(conv, conversation_id, headers)


@_route("GET", "/conversations/{conversation_id}")
async def get_conversation(request: Request, conversation_id: str) -> Response:
    convs, tenant = await _reader(request)
    _only(request)
    conv = await convs.call("get", conversation_id, convs.store.get, conversation_id, tenant)
    return _conversation_json(conv, conversation_id)


@_route("POST", "/conversations/{conversation_id}")
async def update_conversation(request: Request, conversation_id: str) -> Response:
    _, convs, tenant, headers, body = await _writer(request)
    req: UpdateBody = parse_body(UpdateBody, body)
    conv = await convs.call("update", conversation_id, convs.store.update, conversation_id, tenant, req.metadata or {})
    return _conversation_json(conv, conversation_id, headers)


@_route("DELETE", "/conversations/{conversation_id}")
async def delete_conversation(request: Request, conversation_id: str) -> Response:
    convs, tenant = await _reader(request)
    _only(request)
    if not await convs.call("delete", conversation_id, convs.store.delete, conversation_id, tenant):
        raise conversation_not_found(conversation_id)
    convs.tips.discard(conversation_id)
    return _json(deleted_object(conversation_id))


@_route("GET", "/conversations/{conversation_id}/items")
async def list_items(request: Request, conversation_id: str) -> Response:
    convs, tenant = await _reader(request)
    q = parse_list_query(request.query_params, request.query_params.multi_items())
    page = await convs.call(
        "page", conversation_id, convs.store.page, conversation_id, tenant, after=q.after, limit=q.limit, order=q.order
    )
    return _json(item_list(page.items, page.has_more))


@_route("POST", "/conversations/{conversation_id}/items")
async def create_items(request: Request, conversation_id: str) -> Response:
    _, convs, tenant, headers, body = await _writer(request)
    _only(request, "include", "include[]")
    req: ItemsBody = parse_body(ItemsBody, body)
    items = await _added(request, convs, parse_items(req.items, "items"), tenant, conversation_id)
    appended = await convs.call("append", conversation_id, convs.store.append, conversation_id, tenant, items)
    return _json(item_list(list(appended.items), False), headers)


@_route("GET", "/conversations/{conversation_id}/items/{item_id}")
async def get_item(request: Request, conversation_id: str, item_id: str) -> Response:
    convs, tenant = await _reader(request)
    _only(request, "include", "include[]")
    item = await convs.call("item", conversation_id, convs.store.item, conversation_id, tenant, item_id)
    if item is None:
        raise item_not_found(item_id)
    return _json(item_object(item))


@_route("DELETE", "/conversations/{conversation_id}/items/{item_id}")
async def delete_item(request: Request, conversation_id: str, item_id: str) -> Response:
    convs, tenant = await _reader(request)
    _only(request)
    conv = await convs.call("delete_item", conversation_id, convs.store.delete_item, conversation_id, tenant, item_id)
    if conv is None:
        raise item_not_found(item_id)
    return _conversation_json(conv, conversation_id)
