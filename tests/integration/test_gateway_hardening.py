"""Hostile and malformed input on a real SciFact index: every case answered with a 4xx and its code, or served.

Complements ``test_gateway_api.py`` (blank, k, width, unknown fields, bad JSON,
non-UTF-8, 413/415, 404/405) with: 100,000-character and far-beyond-max-tokens
queries, lone surrogates, emoji, control and format characters, NUL, integers
past any range (and past Python's 4300-digit int limit), NaN/Infinity,
deep nesting, chunked bodies over the limit, and echo limits.
"""

import json
import logging

import pytest

from tests.integration.conftest import post

pytestmark = pytest.mark.integration

Q = "Vitamin D deficiency is associated with multiple sclerosis."


def code_of(r):
    return r.json()["error"]["code"]


@pytest.mark.parametrize("body,status,code", [
    # length: 100,000 characters is past max_query_chars (20,000) but inside the body limit
    (json.dumps({"query": "a" * 100_000}), 413, "query_too_long"),
    (json.dumps({"query": "q " * 50_000}), 413, "query_too_long"),
    # 100,000 emoji is 400 kB of UTF-8: past the body limit
    (json.dumps({"query": "🧬" * 100_000}, ensure_ascii=False).encode(), 413, "body_too_large"),
    # lone surrogates: valid JSON escapes, not text
    (b'{"query": "caf\\ud800e"}', 422, "invalid_unicode"),
    (b'{"query": "\\udfff"}', 422, "invalid_unicode"),
    (b'{"query": "ok \\udc00\\ud800"}', 422, "invalid_unicode"),
    (b'{"query": "ok", "\\ud800": 1}', 422, "invalid_unicode"),
    (b'{"query": "ok", "width": "\\ud800"}', 422, "unknown_width"),
    # nothing visible: control, format and separator characters only
    ({"query": "\x00"}, 422, "blank_query"),
    ({"query": "\x00\x01\x1f\x7f"}, 422, "blank_query"),
    ({"query": "\u200b\u200d\ufeff"}, 422, "blank_query"),
    ({"query": "\u2028\u3000\u00a0"}, 422, "blank_query"),
    # integers past every range, and past Python's int() digit limit
    (b'{"query": "x", "k": ' + b"9" * 5000 + b"}", 422, "k_out_of_range"),
    (b'{"query": "x", "k": -' + b"9" * 100_000 + b"}", 422, "k_out_of_range"),
    (b'{"query": "x", "k": 99999999999999999999}', 422, "k_out_of_range"),
    (b'{"query": "x", "width": 100000000000000000000000000000}', 422, "width_out_of_range"),
    (b'{"query": "x", "k": 1e400}', 422, "invalid_type"),
    (b'{"query": "x", "k": null, "policy": "router", "rho": -0.0001}', 422, "rho_out_of_range"),
    # non-standard JSON constants
    # NaN and Infinity are not JSON, but many clients send them: the field they sit in answers its own 422
    (b'{"query": "x", "policy": "router", "rho": NaN}', 422, "rho_out_of_range"),
    (b'{"query": "x", "policy": "router", "rho": Infinity}', 422, "rho_out_of_range"),
    (b'{"query": "x", "policy": "router", "rho": -Infinity}', 422, "rho_out_of_range"),
    (b'{"query": "x", "k": NaN}', 422, "invalid_type"),
    # structure
    (b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json"),
    (b'{"query": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 400, "invalid_json"),
    ({"query": ["a", "b"]}, 422, "invalid_type"),
    ({"query": {"text": "a"}}, 422, "invalid_type"),
    (b"null", 422, "invalid_type"),
    (b'"just a string"', 422, "invalid_type"),
    (b"\xef\xbb\xbf{\"query\": \"bom\"}", 400, "invalid_json"),
    (b'{"query": "x"} trailing', 400, "invalid_json"),
])
def test_hostile_input_gets_4xx_with_code(app_client, body, status, code):
    r = post(app_client, body)
    assert r.status_code == status, r.text
    assert code_of(r) == code and r.json()["error"]["message"]


@pytest.mark.parametrize("query", [
    "🧬🧪",                                 # emoji only
    "\ud83e\uddec protein folding",         # a surrogate *pair* is one emoji, served
    "insulin\x00resistance",                # NUL inside text
    "tab\tnew\nline\rcarriage\x1b[31m",     # control characters and an ANSI escape
    "\u202eright-to-left override",
    "日本語の医学論文 ويكيبيديا",
])
def test_unusual_but_valid_text_is_served(app_client, query):
    r = post(app_client, json.dumps({"query": query, "k": 3}))
    assert r.status_code == 200, r.text
    assert len(r.json()["results"]) == 3


def test_query_length_boundary_is_max_query_chars(app_client):
    limit = app_client.app.state.gw.settings.max_query_chars
    assert post(app_client, {"query": "ab " * (limit // 3) + "c" * (limit % 3)}).status_code == 200
    r = post(app_client, {"query": "x" * (limit + 1)})
    assert r.status_code == 413 and code_of(r) == "query_too_long"


def test_query_beyond_max_tokens_is_truncated_as_the_manifest_says(app_client, encoder):
    """Accepted text longer than max_tokens is served exactly as its first max_tokens tokens."""
    state = app_client.app.state.gw
    manifest_max = state.live.manifest.encoder.max_tokens
    assert state.encoder.max_tokens == manifest_max == 256
    long_q = Q + " " + " ".join(f"marker{i} protein" for i in range(1000))  # ~ 4k tokens, < 20,000 chars
    assert len(long_q) <= state.settings.max_query_chars
    enc = encoder.tokenizer.encode(long_q)
    assert len(enc.ids) == manifest_max  # truncated (CLS + 254 + SEP)
    cut = long_q[:enc.offsets[-2][1]]  # text up to the last kept token
    assert len(cut) < len(long_q) // 10
    full = post(app_client, {"query": long_q, "k": 10, "width": "full"})
    short = post(app_client, {"query": cut, "k": 10, "width": "full"})
    assert full.status_code == short.status_code == 200
    assert [h["id"] for h in full.json()["results"]] == [h["id"] for h in short.json()["results"]]
    assert [h["score"] for h in full.json()["results"]] == pytest.approx(
        [h["score"] for h in short.json()["results"]], abs=1e-6)


def test_chunked_body_over_the_limit_is_refused(app_client):
    limit = app_client.app.state.gw.settings.max_body_bytes

    def chunks():  # no content-length: the gateway must count as it reads
        yield b'{"query": "'
        for _ in range(limit // 4096 + 2):
            yield b"a" * 4096
        yield b'"}'

    r = app_client.post("/v1/search", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and code_of(r) == "body_too_large"
    r = app_client.post("/v1/search", content=iter([b'{"query": ', b'"chunked ok"}']),
                        headers={"content-type": "application/json"})
    assert r.status_code == 200


def test_errors_never_echo_more_than_a_short_field_name(app_client):
    name = "x" * 10_000
    r = post(app_client, {"query": Q, name: 1})
    err = r.json()["error"]
    assert r.status_code == 422 and err["code"] == "unknown_field"
    assert len(err["field"]) <= 65 and len(err["message"]) < 120
    secret = "SECRET-BODY-MARKER-7731"
    r = post(app_client, b'{"query": "' + secret.encode() + b'", oops}')
    assert r.status_code == 400 and secret not in r.text


def test_query_text_and_raw_body_are_not_logged_by_default(app_client, caplog):
    caplog.set_level(logging.DEBUG)
    marker = "zebrafish-privacy-marker-5521"
    assert post(app_client, {"query": f"{marker} retina regeneration"}).status_code == 200
    assert post(app_client, b'{"query": "' + marker.encode() + b'", ]').status_code == 400
    assert post(app_client, {"query": marker, "k": 0}).status_code == 422
    assert post(app_client, {"query": marker * 1000}).status_code == 413
    assert marker not in caplog.text
    assert all(marker not in str(r.args) for r in caplog.records)


def test_sampled_query_logging_is_truncated_and_escaped(make_gateway, caplog):
    caplog.set_level(logging.INFO, logger="service.queries")
    with make_gateway(query_log_sample_rate=1.0, query_log_max_chars=24) as (client, _):
        query = "retina-regeneration-in-zebrafish\nFAKE LOG LINE " + "tail" * 100
        assert post(client, {"query": query}).status_code == 200
    records = [r for r in caplog.records if r.name == "service.queries"]
    assert len(records) == 1
    msg = records[0].getMessage()
    assert "retina-regeneration-in-z" in msg and "zebrafish" not in msg and "tail" not in msg
    assert "\n" not in msg and f"({len(query)} chars" in msg


def _raw_request(url: str, body: bytes, declared: int, request_line: str = "POST /v1/search", headers: str = ""):
    """A socket to the gateway that sent a request's headers (a search's by default) declaring ``declared``
    bytes and then ``body``; ``headers``: extra header lines, each ending in CRLF."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    s.sendall(f"{request_line} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}".encode()
              + f"Content-Length: {declared}\r\n\r\n".encode() + body)
    return s


def _read_response(s) -> str:
    """The whole HTTP response on socket ``s``: headers, then Content-Length bytes of body (or until closed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data.decode("latin-1")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), None)
    while length is not None and len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode("latin-1")


def test_a_stalled_body_is_answered_408_and_a_vanished_client_is_not_a_server_error(scifact_home):
    # a client that sends half its body and stalls gets 408 body_timeout at the request's deadline (it does not
    # hold its connection forever); one that hangs up mid-body is counted as client_disconnected, not as an
    # internal error that would page someone
    import re
    import time as _time

    import httpx

    from tests.conftest import serve_home

    with serve_home(scifact_home, "scifact", SEARCH_DEADLINE_S=1.5) as url:
        s = _raw_request(url, b'{"query": "x"', 100)
        t0 = _time.monotonic()
        head = _read_response(s)
        waited = _time.monotonic() - t0
        s.close()
        assert head.startswith("HTTP/1.1 408"), head[:200]
        assert '"code":"body_timeout"' in head.replace(" ", ""), head[-300:]
        assert 1.0 <= waited < 10.0
        s = _raw_request(url, b'{"query": "x"', 100)
        s.close()  # gone before its body arrived
        metrics = ""
        for _ in range(50):  # the server notices the closed socket on its next read
            metrics = httpx.get(f"{url}/metrics").text
            if 'code="client_disconnected"' in metrics:
                break
            _time.sleep(0.1)
        assert re.search(r'adawidth_errors_total\{code="client_disconnected"\} 1\.0', metrics), metrics[-2000:]
        assert re.search(r'adawidth_errors_total\{code="body_timeout"\} 1\.0', metrics)
        assert 'code="internal_error"' not in metrics
        # and the gateway still answers
        r = httpx.post(f"{url}/v1/search", json={"query": Q, "k": 3})
        assert r.status_code == 200 and len(r.json()["results"]) == 3


def test_a_stalled_write_body_is_answered_408_at_write_body_timeout_s(scifact_home, tmp_path):
    """A write (upsert or delete) whose body stalls mid-way gets 408 body_timeout at write_body_timeout_s rather
    than holding its connection; a whole write still gets its 202.  On a copy of the home without its log (the
    session's gateway holds that one)."""
    import shutil
    import time as _time

    import httpx

    from tests.conftest import serve_home
    from tests.live_support import AUTH, WRITE_KEY

    home = tmp_path / "home"
    shutil.copytree(scifact_home, home, symlinks=True, ignore=shutil.ignore_patterns("wal", "gateway-*.log"))
    auth = f"Authorization: {AUTH['authorization']}\r\n"
    with serve_home(home, "scifact", WRITE_API_KEY=WRITE_KEY, WRITE_BODY_TIMEOUT_S=1.5) as url:
        for line, body in (("PUT /v1/collections/scifact/documents", b'[{"id": "stalled", "te'),
                           ("POST /v1/collections/scifact/documents/delete", b'{"ids": ["sta')):
            s = _raw_request(url, body, 100, line, auth)
            t0 = _time.monotonic()
            head = _read_response(s)
            waited = _time.monotonic() - t0
            s.close()
            assert head.startswith("HTTP/1.1 408"), (line, head[:200])
            assert '"code":"body_timeout"' in head.replace(" ", ""), head[-300:]
            assert 1.0 <= waited < 10.0
        r = httpx.put(f"{url}/v1/collections/scifact/documents", json=[{"id": "whole", "text": Q}], headers=AUTH)
        assert r.status_code == 202, r.text
        r = httpx.get(f"{url}/v1/collections/scifact/documents/stalled", headers=AUTH)
        assert r.status_code == 404  # the stalled upsert wrote nothing
