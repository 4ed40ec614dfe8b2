"""Sync and async clients of the gateway over httpx (``Client``, ``AsyncClient``).

Both take the same arguments and offer the same calls; only the async ones are awaited::

    from adawidth_client import Client

    with Client("http://127.0.0.1:8000") as c:
        c.wait_ready(timeout_s=60)
        hits = c.search("vitamin D and multiple sclerosis", k=5, width="auto").results

Every call raises :class:`~adawidth_client.errors.ApiError` (status, ``code``, message, field) for an error
answer, after the retries of its :class:`~adawidth_client.retry.RetryPolicy` for 429 and 503,
:class:`~adawidth_client.errors.TransportError` when no answer came, and
:class:`~adawidth_client.errors.ClientError` naming the field, before sending, for a request that JSON cannot
carry (a NaN or infinite number, e.g. ``rho=float("nan")``, bytes, a lone surrogate).  numpy numbers and arrays are sent as JSON numbers
and lists (``k=numpy.int64(10)``).  Sleeping and the clock are injectable
(``sleep``, ``clock``), so tests measure the waits without waiting.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from adawidth_client.errors import ApiError, ClientError, NotReadyError, ServerExited, TransportError
from adawidth_client.models import (BatchItemError, CollectionInfo, ReloadResult, SearchRequest, SearchResponse,
                                    batch_path, batch_request_json, parse_batch_response, parse_collections,
                                    search_path)
from adawidth_client.retry import RetryPolicy

DEFAULT_TIMEOUT_S = 10.0


def _json_body(value: Any, where: str = "") -> Any:
    """``value`` as a JSON body carries it, in one pass: every numpy scalar or array (anything with ``tolist()``,
    e.g. ``numpy.float32(0.5)``, ``numpy.int64(10)``, an embedding) turned into Python numbers and lists.

    Raises:
        ClientError: naming the field (``rho``, ``queries[1].alpha``) that JSON cannot carry: a NaN or infinite
            number, bytes, a string with a lone UTF-16 surrogate (``"\\ud800"``, which UTF-8 cannot encode);
            nothing is sent.
    """
    if isinstance(value, dict):
        return {key: _json_body(item, f"{where}.{key}" if where else str(key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_body(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, (str, bytes, bytearray, int, float)) and value is not None and hasattr(value, "tolist"):
        return _json_body(value.tolist(), where)
    shown = repr(where or "(body)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ClientError(f"field {shown} is {value!r}: JSON has no NaN or infinity; send a finite number")
    if isinstance(value, (bytes, bytearray)):
        raise ClientError(f"field {shown} is bytes: send str (decode it first)")
    if isinstance(value, str) and any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        raise ClientError(f"field {shown} holds a lone UTF-16 surrogate, which UTF-8 cannot carry: fix the "
                          "text's decoding")
    return value


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    json: Any = None
    admin: bool = False
    idempotent: bool = True
    timeout_s: float | None = None

    def __post_init__(self):
        # httpx's json.dumps would raise a bare TypeError (numpy), ValueError (NaN) or UnicodeEncodeError
        object.__setattr__(self, "json", _json_body(self.json))


class _Base:
    """What the sync and async clients share: paths, headers, request building, the retry decision."""

    def __init__(self, base_url: str, *, collection: str | None = None, api_key: str | None = None,
                 admin_key: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retry: RetryPolicy | None = None, rng: random.Random | None = None,
                 headers: dict[str, str] | None = None):
        self.base_url = base_url.rstrip("/")
        self.collection = collection
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._api_key, self._admin_key = api_key, admin_key
        self._rng = rng or random.Random()
        self._headers = dict(headers or {})
        self._default_collection: str | None = None

    def _headers_for(self, call: _Call) -> dict[str, str]:
        h = dict(self._headers)
        key = self._admin_key if call.admin else self._api_key
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def _timeout(self, call: _Call) -> httpx.Timeout:
        return httpx.Timeout(call.timeout_s if call.timeout_s is not None else self.timeout_s)

    def _search_call(self, request: SearchRequest, collection: str | None, timeout_s: float | None) -> _Call:
        return _Call("POST", search_path(collection or self.collection), request.to_json(), timeout_s=timeout_s)

    @staticmethod
    def _requests(queries: Sequence[str | dict | SearchRequest], fields: dict) -> list[SearchRequest]:
        """Each query as a request: a text gets ``fields``; a dict is a whole search body (``{"query": ...,
        "k": ...}``, the shared ``fields`` under it); a :class:`SearchRequest` is sent as it is."""
        out = []
        for q in queries:
            if isinstance(q, SearchRequest):
                out.append(q)
            elif isinstance(q, dict):
                body = {**{k: v for k, v in fields.items() if v is not None}, **q}
                if "query" not in body:
                    raise ClientError("a batch item given as a dict needs a 'query'")
                out.append(SearchRequest.build(body.pop("query"), **body))
            else:
                out.append(SearchRequest.build(q, **fields))
        return out

    @staticmethod
    def _batch_call(name: str, requests: list[SearchRequest], timeout_s: float | None) -> _Call:
        return _Call("POST", batch_path(name), batch_request_json(requests), timeout_s=timeout_s)

    def _decide(self, call: _Call, attempt: int, waited: float, response: httpx.Response | None,
                exc: httpx.TransportError | None) -> tuple[float | None, ClientError | None]:
        """After a failed request: (seconds to wait, None) to retry, or (None, the error to raise)."""
        if exc is not None:
            err: ClientError = TransportError(f"{call.method} {call.path}: {type(exc).__name__}: {exc}", attempt)
            if not (call.idempotent and self.retry.retry_transport_errors):
                return None, err
            return self.retry.next_wait(attempt, waited, None, self._rng), err
        err = ApiError.from_parts(response.status_code, response.content, response.headers, attempts=attempt)
        if response.status_code not in self.retry.retry_statuses:
            return None, err
        return self.retry.next_wait(attempt, waited, err.retry_after_s, self._rng), err

    @staticmethod
    def _ready_body(response: httpx.Response) -> tuple[dict | None, str]:
        """(the /readyz body when 200 and an object, else None; a description of the answer)."""
        last = f"{response.status_code} {response.text[:300]}"
        if response.status_code != 200:
            return None, last
        try:
            body = response.json()
        except ValueError:
            return None, last
        return (body, last) if isinstance(body, dict) else (None, last)


class Client(_Base):
    """Synchronous client.

    Args:
        base_url: the gateway, e.g. ``http://127.0.0.1:8000``.
        collection: collection searched by default (None: the gateway's default collection, ``POST /v1/search``).
        api_key: search key (``Authorization: Bearer``), when the gateway requires one.
        admin_key: admin key of the ``/admin/*`` calls.
        timeout_s: per-request timeout in seconds (connect, read, write and pool each); calls take ``timeout_s``.
        retry: :class:`RetryPolicy` (default: 4 attempts, at most 30 s of waiting).
        sleep: ``sleep(seconds)`` used between retries and polls (default ``time.sleep``).
        clock: monotonic clock in seconds used by :meth:`wait_ready` (default ``time.monotonic``).
        rng: jitter source (default a fresh ``random.Random``).
        transport: an httpx transport (e.g. ``httpx.MockTransport``), for tests.
        headers: extra headers on every request.
    """

    def __init__(self, base_url: str, *, collection: str | None = None, api_key: str | None = None,
                 admin_key: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, transport: httpx.BaseTransport | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(base_url, collection=collection, api_key=api_key, admin_key=admin_key, timeout_s=timeout_s,
                         retry=retry, rng=rng, headers=headers)
        self._sleep, self._clock = sleep, clock
        self._http = httpx.Client(base_url=self.base_url, transport=transport)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, call: _Call) -> httpx.Response:
        attempt, waited = 0, 0.0
        while True:
            attempt += 1
            response = exc = None
            try:
                response = self._http.request(call.method, call.path, json=call.json, headers=self._headers_for(call),
                                              timeout=self._timeout(call))
            except httpx.TransportError as e:
                exc = e
            if response is not None and response.status_code < 400:
                return response
            wait, err = self._decide(call, attempt, waited, response, exc)
            if wait is None:
                raise err from exc
            self._sleep(wait)
            waited += wait

    # ---------------------------------------------------------------- search

    def search(self, query: str, k: int | None = None, width=None, *, collection: str | None = None,
               timeout_s: float | None = None, **fields: Any) -> SearchResponse:
        """Search one query.

        Args:
            query: query text.
            k: results wanted (gateway default 10).
            width: ``"auto"``, ``"full"`` or a prefix width in coordinates (gateway default ``"auto"``).
            collection: collection to search (default: the client's, else the gateway's default).
            timeout_s: this call's per-request timeout, seconds.
            **fields: any other request field (``policy``, ``recall_target``, ``rho``, ``mode``, ``filter``,
                ``fusion``, ``alpha``, ``tier``, or one this client does not model yet).

        Returns:
            :class:`SearchResponse` (hits best first, trace).

        Raises:
            ApiError: an error answer (e.g. 422 ``blank_query``), after retries for 429 / 503.
            TransportError: no answer after retries.
        """
        return self.search_request(SearchRequest.build(query, k=k, width=width, **fields), collection=collection,
                                   timeout_s=timeout_s)

    def search_request(self, request: SearchRequest, *, collection: str | None = None,
                       timeout_s: float | None = None) -> SearchResponse:
        """Send a prepared :class:`SearchRequest`; see :meth:`search`."""
        return SearchResponse.from_json(self._send(self._search_call(request, collection, timeout_s)).json())

    def search_batch(self, queries: Sequence[str | dict | SearchRequest], k: int | None = None, width=None, *,
                     collection: str | None = None, timeout_s: float | None = None,
                     **fields: Any) -> list[SearchResponse | BatchItemError]:
        """Search many queries in one request (``POST /v1/collections/{name}/search/batch``): one admission
        slot, one deadline and one encoder call on the gateway (docs/API.md).

        Args:
            queries: 1..``max_batch`` (gateway default 256) items: query texts (each sent with ``k``, ``width``
                and ``fields``), search bodies as dicts (``{"query": ..., "width": 64}``; ``k``, ``width`` and
                ``fields`` fill what a dict leaves out) or prepared :class:`SearchRequest` s.
            collection: collection (default: the client's, else the gateway's default collection, read from
                ``/readyz``).

        Returns:
            One slot per query, in request order: a :class:`SearchResponse`, or the :class:`BatchItemError` of
            that query alone (its ``code``, e.g. ``blank_query``, and the HTTP ``status`` a single search would
            have got); a bad query does not fail the batch.

        Raises:
            ApiError: the batch as a whole was refused (413 ``batch_too_large`` or ``body_too_large``, 422
                ``empty_batch``, 404 ``unknown_collection``, 429 after retries, ...).
            ClientError: a dict item without ``query``.
        """
        requests = self._requests(queries, {"k": k, "width": width, **fields})
        name = collection or self.collection or self._default_collection_name()
        return parse_batch_response(self._send(self._batch_call(name, requests, timeout_s)).json(), len(requests))

    def _default_collection_name(self) -> str:
        if self._default_collection is None:
            body = self._send(_Call("GET", "/readyz")).json()
            if not isinstance(body, dict) or not body.get("collection"):
                raise ClientError("the gateway did not name its collection on /readyz; pass collection=...")
            self._default_collection = str(body["collection"])
        return self._default_collection

    def collections(self) -> list[CollectionInfo]:
        """The gateway's collections (``GET /v1/collections``): name, live version, documents, policies."""
        return parse_collections(self._send(_Call("GET", "/v1/collections")).json())

    # ---------------------------------------------------------------- health

    def health(self) -> dict:
        """``GET /healthz`` (liveness)."""
        return self._send(_Call("GET", "/healthz")).json()

    def ready(self, timeout_s: float = 2.0) -> dict | None:
        """One ``GET /readyz``, no retry: its body when 200 (status ``ready`` or ``degraded``), else None
        (503 not ready, or no answer within ``timeout_s`` seconds)."""
        return self._probe(timeout_s)[0]

    def _probe(self, timeout_s: float) -> tuple[dict | None, str]:
        try:
            return self._ready_body(self._http.get("/readyz", timeout=timeout_s))
        except httpx.TransportError as e:
            return None, f"{type(e).__name__}: {e}"

    def wait_ready(self, timeout_s: float = 60.0, *, poll_s: float = 0.25,
                   alive: Callable[[], bool] | None = None) -> dict:
        """Poll ``/readyz`` until it answers 200; the one readiness wait of tests, benchmarks and deploy scripts.

        Args:
            timeout_s: give up after this many seconds (by ``clock``).
            poll_s: seconds between polls.
            alive: called before each poll; when it returns False (e.g. the gateway process exited) waiting
                stops at once with :class:`ServerExited`.

        Returns:
            The ``/readyz`` body (``collection``, ``index_version``, ``documents``, ...).

        Raises:
            ServerExited: ``alive()`` returned False.
            NotReadyError: not ready within ``timeout_s``.
        """
        deadline = self._clock() + timeout_s
        while True:
            if alive is not None and not alive():
                raise ServerExited(f"{self.base_url} exited before it was ready")
            body, last = self._probe(max(0.1, min(2.0, deadline - self._clock())))
            if body is not None:
                return body
            if self._clock() >= deadline:
                raise NotReadyError(f"{self.base_url} not ready after {timeout_s:g} s (last answer: {last})", last)
            self._sleep(poll_s)

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text exposition."""
        return self._send(_Call("GET", "/metrics")).text

    # ---------------------------------------------------------------- admin (admin_key)

    def reload(self, collection: str | None = None) -> ReloadResult:
        """``POST /admin/reload``: reconcile ``collection`` (default: every collection served) with the version
        registry now."""
        body = None if collection is None else {"collection": collection}
        return ReloadResult.from_json(self._send(_Call("POST", "/admin/reload", body, admin=True,
                                                       idempotent=False)).json())

    def publish(self, version: str) -> dict:
        """``POST /admin/publish``: verify a built version and register it as a candidate; ``{"state": ...}``."""
        return self._send(_Call("POST", "/admin/publish", {"version": version}, admin=True, idempotent=False)).json()

    def promote(self, version: str | None = None, *, skip_gate: bool = False) -> dict:
        """``POST /admin/promote``: quality gate, then make a candidate (default the newest) live on every
        replica; ``{"state": ..., "gate": ...}``.  Raises :class:`ApiError` 409 ``gate_refused`` and the like."""
        return self._send(_Call("POST", "/admin/promote", {"version": version, "skip_gate": skip_gate}, admin=True,
                                idempotent=False)).json()

    def rollback(self, reason: str | None = None) -> dict:
        """``POST /admin/rollback``: swap live and previous on every replica; ``{"state": ...}``."""
        return self._send(_Call("POST", "/admin/rollback", {"reason": reason}, admin=True, idempotent=False)).json()

    def status(self) -> dict:
        """``GET /admin/registry``: ``{"kind", "state", "history", "replicas"}`` of the collection."""
        return self._send(_Call("GET", "/admin/registry", admin=True)).json()


class AsyncClient(_Base):
    """Asynchronous client: the same arguments and calls as :class:`Client`, awaited (``sleep`` default
    ``asyncio.sleep``)."""

    def __init__(self, base_url: str, *, collection: str | None = None, api_key: str | None = None,
                 admin_key: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], Any] = asyncio.sleep, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 headers: dict[str, str] | None = None, limits: httpx.Limits | None = None):
        super().__init__(base_url, collection=collection, api_key=api_key, admin_key=admin_key, timeout_s=timeout_s,
                         retry=retry, rng=rng, headers=headers)
        self._sleep, self._clock = sleep, clock
        self._http = httpx.AsyncClient(base_url=self.base_url, transport=transport,
                                       **({"limits": limits} if limits is not None else {}))

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _send(self, call: _Call) -> httpx.Response:
        attempt, waited = 0, 0.0
        while True:
            attempt += 1
            response = exc = None
            try:
                response = await self._http.request(call.method, call.path, json=call.json,
                                                    headers=self._headers_for(call), timeout=self._timeout(call))
            except httpx.TransportError as e:
                exc = e
            if response is not None and response.status_code < 400:
                return response
            wait, err = self._decide(call, attempt, waited, response, exc)
            if wait is None:
                raise err from exc
            await self._sleep(wait)
            waited += wait

    async def search(self, query: str, k: int | None = None, width=None, *, collection: str | None = None,
                     timeout_s: float | None = None, **fields: Any) -> SearchResponse:
        """See :meth:`Client.search`."""
        return await self.search_request(SearchRequest.build(query, k=k, width=width, **fields),
                                         collection=collection, timeout_s=timeout_s)

    async def search_request(self, request: SearchRequest, *, collection: str | None = None,
                             timeout_s: float | None = None) -> SearchResponse:
        """See :meth:`Client.search_request`."""
        return SearchResponse.from_json((await self._send(self._search_call(request, collection, timeout_s))).json())

    async def search_batch(self, queries: Sequence[str | dict | SearchRequest], k: int | None = None, width=None, *,
                           collection: str | None = None, timeout_s: float | None = None,
                           **fields: Any) -> list[SearchResponse | BatchItemError]:
        """See :meth:`Client.search_batch`."""
        requests = self._requests(queries, {"k": k, "width": width, **fields})
        name = collection or self.collection or await self._default_collection_name()
        response = await self._send(self._batch_call(name, requests, timeout_s))
        return parse_batch_response(response.json(), len(requests))

    async def _default_collection_name(self) -> str:
        if self._default_collection is None:
            body = (await self._send(_Call("GET", "/readyz"))).json()
            if not isinstance(body, dict) or not body.get("collection"):
                raise ClientError("the gateway did not name its collection on /readyz; pass collection=...")
            self._default_collection = str(body["collection"])
        return self._default_collection

    async def collections(self) -> list[CollectionInfo]:
        """See :meth:`Client.collections`."""
        return parse_collections((await self._send(_Call("GET", "/v1/collections"))).json())

    async def health(self) -> dict:
        """See :meth:`Client.health`."""
        return (await self._send(_Call("GET", "/healthz"))).json()

    async def ready(self, timeout_s: float = 2.0) -> dict | None:
        """See :meth:`Client.ready`."""
        return (await self._probe(timeout_s))[0]

    async def _probe(self, timeout_s: float) -> tuple[dict | None, str]:
        try:
            return self._ready_body(await self._http.get("/readyz", timeout=timeout_s))
        except httpx.TransportError as e:
            return None, f"{type(e).__name__}: {e}"

    async def wait_ready(self, timeout_s: float = 60.0, *, poll_s: float = 0.25,
                         alive: Callable[[], bool] | None = None) -> dict:
        """See :meth:`Client.wait_ready`."""
        deadline = self._clock() + timeout_s
        while True:
            if alive is not None and not alive():
                raise ServerExited(f"{self.base_url} exited before it was ready")
            body, last = await self._probe(max(0.1, min(2.0, deadline - self._clock())))
            if body is not None:
                return body
            if self._clock() >= deadline:
                raise NotReadyError(f"{self.base_url} not ready after {timeout_s:g} s (last answer: {last})", last)
            await self._sleep(poll_s)

    async def metrics(self) -> str:
        """See :meth:`Client.metrics`."""
        return (await self._send(_Call("GET", "/metrics"))).text

    async def reload(self, collection: str | None = None) -> ReloadResult:
        """See :meth:`Client.reload`."""
        body = None if collection is None else {"collection": collection}
        return ReloadResult.from_json((await self._send(_Call("POST", "/admin/reload", body, admin=True,
                                                              idempotent=False))).json())

    async def publish(self, version: str) -> dict:
        """See :meth:`Client.publish`."""
        return (await self._send(_Call("POST", "/admin/publish", {"version": version}, admin=True,
                                       idempotent=False))).json()

    async def promote(self, version: str | None = None, *, skip_gate: bool = False) -> dict:
        """See :meth:`Client.promote`."""
        return (await self._send(_Call("POST", "/admin/promote", {"version": version, "skip_gate": skip_gate},
                                       admin=True, idempotent=False))).json()

    async def rollback(self, reason: str | None = None) -> dict:
        """See :meth:`Client.rollback`."""
        return (await self._send(_Call("POST", "/admin/rollback", {"reason": reason}, admin=True,
                                       idempotent=False))).json()

    async def status(self) -> dict:
        """See :meth:`Client.status`."""
        return (await self._send(_Call("GET", "/admin/registry", admin=True))).json()
