"""Pure parts of the gateway hardening: secret policy, key comparison, the error table and its docs,
body parsing helpers, query-log sampling and the limiter's admission/deadline logic."""

import asyncio
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import unicodedata

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import SecretStr, ValidationError

from engine.plan import has_lone_surrogate, is_blank
from service.parsing import _bounded_int, log_query_sample
from service.auth import key_matches
from service.config import GatewaySettings, placeholder_reason
from service.errors import STATUS_OF_CODE, ApiError, safe_text
from service.limits import SearchLimiter

ROOT = Path(__file__).resolve().parents[2]
STRONG = "k3Y-9vQ2mX7rT4wL8pN1zB6c"


@pytest.mark.parametrize("secret", ["", "changeme", "secret", "password", "short-Key1", "CHANGEME-CHANGEME-CHANGEME",
                                    "secretsecretsecretsecret", "aaaaaaaaaaaaaaaaaaaaaaaa", "abababababababababab",
                                    "please-changeme-in-prod-9", "my-api-key-placeholder-42", "0000000000000000000"])
def test_placeholder_secrets_refused_outside_local_mode(secret):
    assert placeholder_reason(secret) is not None
    for field in ("admin_api_key", "search_api_key", "write_api_key"):
        with pytest.raises(ValidationError) as info:
            GatewaySettings(**{field: secret})
        assert field in str(info.value)
        GatewaySettings(**{field: secret}, mode="local")  # allowed for development


def test_strong_secrets_accepted_and_never_shown():
    assert placeholder_reason(STRONG) is None
    s = GatewaySettings(admin_api_key=STRONG, search_api_key=STRONG[::-1])
    assert isinstance(s.admin_api_key, SecretStr)
    assert STRONG not in repr(s) and STRONG not in str(s) and STRONG not in s.model_dump_json()
    with pytest.raises(ValidationError, match="must differ"):
        GatewaySettings(admin_api_key=STRONG, search_api_key=STRONG)
    for other in ("admin_api_key", "search_api_key"):  # the write key differs from both
        with pytest.raises(ValidationError, match="write_api_key must differ"):
            GatewaySettings(write_api_key=STRONG, **{other: STRONG})
    assert GatewaySettings(write_api_key=STRONG).write_api_key.get_secret_value() == STRONG


def test_a_reranking_default_tier_without_rerank_workers_is_refused_at_start():
    # every request without a tier would get 409 tier_unavailable: refused when the settings are read
    for tier in ("maxsim", "cross_encoder"):
        with pytest.raises(ValidationError, match="max_concurrent_reranks"):
            GatewaySettings(default_tier=tier, max_concurrent_reranks=0)
        assert GatewaySettings(default_tier=tier).max_concurrent_reranks == 1
    assert GatewaySettings(default_tier="auto", max_concurrent_reranks=0).default_tier == "auto"  # serves mips


def test_gateway_refuses_to_start_with_a_placeholder_key_and_does_not_print_it():
    env = {"ADAWIDTH_ADMIN_API_KEY": "changeme-now", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "service", "--port", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "admin_api_key" in proc.stderr and "changeme-now" not in proc.stderr + proc.stdout


def test_key_matches_is_exact():
    key = SecretStr(STRONG)
    assert key_matches(STRONG, key)
    for other in ("", STRONG[:-1], STRONG + " ", STRONG.upper(), "\ud800", "ключ"):
        assert not key_matches(other, key)


def test_error_table_in_docs_equals_the_code_table():
    """docs/API.md has one row per code with the same status: the table the clients read is the one we serve."""
    text = (ROOT / "docs" / "API.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\|\s*`([a-z0-9_]+)`\s*\|\s*(\d{3})\s*\|", text, flags=re.M)
    assert len(rows) == len({code for code, _ in rows})  # each code once
    assert {code: int(status) for code, status in rows} == STATUS_OF_CODE


def test_api_error_bodies_are_safe():
    with pytest.raises(ValueError):
        ApiError("no_such_code", "x")
    body = ApiError("unknown_field", "unknown field '\ud800'", "\ud800" + "f" * 500).body()["error"]
    body_text = str(body).encode("utf-8")  # encodable: no lone surrogate survives
    assert len(body["field"]) <= 65 and b"\\ud800" in body_text
    assert safe_text("abc", 2) == "ab…" and safe_text("x\udfffy") == "x\\udfffy"


def test_parse_helpers():
    assert _bounded_int("123") == 123 and _bounded_int("-7") == -7
    assert _bounded_int("9" * 19) == 10 ** 19 and _bounded_int("-" + "9" * 10_000) == -10 ** 19
    assert is_blank("") and is_blank(" \t\n\x00\u200b\u3000\ufeff") and not is_blank("\x00a") and not is_blank("🧬")
    assert has_lone_surrogate("a\ud800") and has_lone_surrogate("\udc00") and not has_lone_surrogate("🧬 é")


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.text(
    alphabet=st.sampled_from(" \t\n\x00\x7f\u00a0\u200b\u2028\u3000\ufeff\u0301a\u00e9\U0001f9ec!"), max_size=8))
def test_is_blank_fast_path_agrees_with_its_definition(text):
    # the printable fast path must answer exactly as the per-character definition (only whitespace, control and
    # format characters: no visible one)
    slow = all(ch.isspace() or unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"} for ch in text)
    assert is_blank(text) == slow


def test_query_log_sampling(caplog):
    caplog.set_level("INFO", logger="service.queries")
    off = GatewaySettings()
    assert not log_query_sample(off, "never logged", 64, draw=lambda: 0.0)
    half = GatewaySettings(query_log_sample_rate=0.5, query_log_max_chars=5)
    assert not log_query_sample(half, "not this one", 64, draw=lambda: 0.7)
    assert log_query_sample(half, "abcdefgh", 64, draw=lambda: 0.2)
    assert [r.getMessage() for r in caplog.records] == ["query sample (8 chars, width 64): 'abcde…'"]


# ---------------------------------------------------------------- limiter (no HTTP, no clock races)

def test_limiter_admits_up_to_concurrency_plus_queue_then_refuses():
    async def scenario():
        limiter = SearchLimiter(max_concurrent=2, max_queued=1, retry_after_s=7)
        gate = threading.Event()
        far = time.monotonic() + 300
        tasks = [asyncio.create_task(limiter.run(lambda d: gate.wait(60) and "done", far)) for _ in range(3)]
        while limiter.admitted < 3 or limiter.running < 2:
            await asyncio.sleep(0.001)
        assert (limiter.running, limiter.queued) == (2, 1)
        with pytest.raises(ApiError) as info:
            await limiter.run(lambda d: "never", far)
        assert info.value.code == "overloaded" and info.value.headers == {"Retry-After": "7"}
        gate.set()
        assert await asyncio.gather(*tasks) == ["done"] * 3
        assert limiter.admitted == 0 and limiter.running == 0
        limiter.close()
        assert await limiter.run(lambda d: "again", far) == "again"  # a closed limiter starts a fresh pool
        limiter.close()

    asyncio.run(scenario())


def test_limiter_deadline_and_errors():
    async def scenario():
        limiter = SearchLimiter(max_concurrent=1, max_queued=0)
        with pytest.raises(ApiError) as info:  # already past: refused without running
            await limiter.run(lambda d: pytest.fail("must not run"), time.monotonic() - 1)
        assert info.value.code == "deadline_exceeded" and info.value.status == 503

        def boom(deadline):
            raise KeyError("bug")

        with pytest.raises(KeyError):  # the work's own errors propagate unchanged
            await limiter.run(boom, time.monotonic() + 300)
        while limiter.admitted:
            await asyncio.sleep(0.001)
        limiter.close()

    asyncio.run(scenario())


def test_served_collections_setting(monkeypatch):
    assert GatewaySettings().collections == ("scifact",)  # default: just the default collection
    assert GatewaySettings(collection="nfcorpus").collections == ("nfcorpus",)
    monkeypatch.setenv("ADAWIDTH_COLLECTIONS", " scifact , nfcorpus ")  # comma-separated in the environment
    assert GatewaySettings().collections == ("scifact", "nfcorpus")
    monkeypatch.setenv("ADAWIDTH_COLLECTIONS", "")
    assert GatewaySettings().collections == ("scifact",)
    monkeypatch.delenv("ADAWIDTH_COLLECTIONS")
    for collections, message in (("nfcorpus,fiqa", "default collection 'scifact' is not among"),
                                 ("scifact,scifact", "scifact more than once"),
                                 ("scifact,,fiqa", "invalid collection name ''"),
                                 ("scifact,../etc", "invalid collection name '../etc'")):
        with pytest.raises(ValidationError) as info:
            GatewaySettings(collections=collections)
        assert message in str(info.value)
    with pytest.raises(ValidationError, match="invalid collection name"):
        GatewaySettings(collection="a b")


def test_gateway_refuses_to_start_with_an_invalid_collections_setting():
    env = {"ADAWIDTH_COLLECTIONS": "nfcorpus", "ADAWIDTH_COLLECTION": "scifact", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "service"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "default collection 'scifact' is not among collections nfcorpus" in r.stderr


@pytest.mark.parametrize("values", [[], list(range(101))])
def test_a_filter_list_of_the_wrong_length_names_the_limit(values):
    """pydantic's first error for such a list is the union's other member ('should be a valid string'); the
    answer names the 1..100 values a list may hold."""
    from service.models import SearchRequest
    from service.parsing import validation_error
    with pytest.raises(ValidationError) as info:
        SearchRequest.model_validate({"query": "q", "filter": {"tenant": values}})
    err = validation_error(info.value)
    assert (err.code, err.field) == ("invalid_filter", "filter")
    assert "1 to 100 values" in err.message and "valid string" not in err.message
