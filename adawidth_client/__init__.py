"""Python client of the adawidth gateway: sync :class:`Client` and async :class:`AsyncClient` (httpx).

Typed on the gateway's request and response models (:mod:`adawidth_client.models`), with retries on 429
and 503 that honour ``Retry-After`` (:class:`RetryPolicy`), timeouts, batch search, the admin calls and
the readiness wait.  It depends on httpx only; it never imports the gateway.
"""

from adawidth_client.client import AsyncClient, Client
from adawidth_client.errors import ApiError, ClientError, NotReadyError, ServerExited, TransportError
from adawidth_client.models import (BatchItemError, CollectionInfo, ErrorDetail, Hit, MalformedResponse, ReloadResult,
                                    SearchRequest, SearchResponse, Trace)
from adawidth_client.retry import NO_RETRY, RetryPolicy

__all__ = ["AsyncClient", "ApiError", "BatchItemError", "Client", "ClientError", "CollectionInfo", "ErrorDetail",
           "Hit", "MalformedResponse", "NO_RETRY", "NotReadyError", "ReloadResult", "RetryPolicy", "SearchRequest",
           "SearchResponse", "ServerExited", "Trace", "TransportError"]
