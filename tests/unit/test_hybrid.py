"""Lexical/hybrid lanes, filters and access control on a synthetic version written by the real artifact code."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydantic import ValidationError

from adawidth import hybrid
from adawidth.prefix import prefix_normalize, top_k
from engine.index import IndexVersion
from engine.pipeline import Pipeline, capabilities
from engine.plan import PlanDefaults, PlanError, SearchSpec, resolve_plan
from engine.version.manifest import IndexVersionError, verify
from service.config import GatewaySettings
from service.errors import ApiError
from tests.hybrid_support import GROUPS, TENANTS, WORDS, synthetic_corpus, write_synthetic_version

N, DIM = 240, 32


@pytest.fixture(scope="module")
def version(tmp_path_factory) -> IndexVersion:
    return IndexVersion.load(write_synthetic_version(tmp_path_factory.mktemp("synth"), n=N, dim=DIM))


@pytest.fixture(scope="module")
def old_version(tmp_path_factory) -> IndexVersion:
    """A version as the trainer wrote them before the lexical lane existed."""
    return IndexVersion.load(write_synthetic_version(tmp_path_factory.mktemp("old"), n=N, dim=DIM, lexical=False))


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)




def retrieve(version, query: str, k: int, width, embedding: np.ndarray, *, mode: str = "dense", filter=None,
             fusion: str = "rrf", principal=None, depth: int = 100):
    """One search as the gateway runs it: plan (its errors as the gateway's ApiError), then the pipeline.
    ``fusion`` is sent in mode 'hybrid' only (elsewhere the gateway answers 422 policy_conflict)."""
    try:
        plan = resolve_plan(SearchSpec(query=query, k=k, width=width, mode=mode, filter=filter,
                                       fusion=fusion if mode == "hybrid" else None),
                            PlanDefaults(hybrid_depth=depth), capabilities(version), principal)
    except PlanError as e:
        raise ApiError(e.code, e.message, e.field) from None
    return Pipeline().run([plan], version, embeddings=embedding[None, :])[0]


# ------------------------------------------------------------------------------------------ pure parts


def test_normalisation_and_phrases():
    assert hybrid.normalize_text("  ＡＢＣ\tStraße\n x ") == "abc strasse x"  # NFKC full-width, casefold ß
    assert hybrid.analyze("ERR_SSL_5417: v1.2!") == ["err_ssl_5417", "v1", "2"]
    pq = hybrid.parse_query('fix “ERR_SSL_5417” on "  Login  Page " and "" or "unclosed')
    assert pq.phrases == ("err_ssl_5417", "login page")
    assert pq.text == 'fix ERR_SSL_5417 on   Login  Page  and  or "unclosed'
    doc = hybrid.normalize_text("See err_ssl_5417, then the LOGIN   page.")
    assert hybrid.contains_phrases(doc, ["err_ssl_5417", "login page"])
    assert not hybrid.contains_phrases(hybrid.normalize_text("ERR_SSL_54170"), ["err_ssl_5417"])
    assert not hybrid.contains_phrases(hybrid.normalize_text("xerr_ssl_5417"), ["err_ssl_5417"])
    assert hybrid.parse_query("no quotes").phrases == ()


def test_rrf_by_hand():
    rows, scores = hybrid.rrf_fuse([np.array([5, 3, 9]), np.array([3, 7])], k=60)
    # 3: 1/62 + 1/61; 5: 1/61; 7: 1/62; 9: 1/63
    assert rows.tolist() == [3, 5, 7, 9]
    assert scores == pytest.approx([1 / 62 + 1 / 61, 1 / 61, 1 / 62, 1 / 63])
    assert hybrid.rrf_fuse([]) [0].size == 0


def test_convex_by_hand():
    rows, fused = hybrid.convex_fuse(np.array([1, 2, 3]), np.array([0.9, 0.5, 0.1]), np.array([0.0, 4.0, 2.0]), 0.5)
    # minmax dense: 1, .5, 0 ; lexical: 0, 1, .5  -> .5, .75, .25
    assert rows.tolist() == [2, 1, 3] and fused == pytest.approx([0.75, 0.5, 0.25])
    with pytest.raises(ValueError):
        hybrid.convex_fuse(np.array([1]), np.array([1.0]), np.array([1.0]), 1.5)


def test_field_index_and_access_rules():
    fields = [{"tenant": "a"}, {"tenant": "a", "acl": ["eng"]}, {"tenant": "b", "acl": []}, {},
              {"tenant": "a", "acl": "hr", "n": 1.5}, {"tenant": 1}]
    idx = hybrid.FieldIndex(fields, len(fields))
    assert idx.field_names == ["acl", "tenant"]  # 1.5 is not a keyword
    assert hybrid.access_mask(idx, hybrid.Principal("a", ("eng",))).tolist() == [1, 1, 0, 0, 0, 0]
    assert hybrid.access_mask(idx, hybrid.Principal("a", ("hr",))).tolist() == [1, 0, 0, 0, 1, 0]
    assert hybrid.access_mask(idx, hybrid.Principal("b")).tolist() == [0, 0, 1, 0, 0, 0]
    assert hybrid.access_mask(idx, hybrid.Principal("1")).tolist() == [0] * 6  # "1" is not 1
    assert hybrid.access_mask(idx, None).all()
    assert idx.filter_mask({"tenant": ["a", "b"], "acl": "eng"}).tolist() == [0, 1, 0, 0, 0, 0]


# ------------------------------------------------------------------------------------------ served path


def reference_allowed(fields: list[dict], texts: list[str], principal, flt, phrases) -> np.ndarray:
    """Brute force from the raw corpus fields, independent of FieldIndex/access_mask."""
    out = []
    for f, t in zip(fields, texts):
        ok = True
        if principal is not None:
            acl = f.get("acl")
            acl = [acl] if isinstance(acl, str) else (acl or [])
            ok = f.get("tenant") == principal.tenant and (not acl or bool(set(acl) & set(principal.groups)))
        for name, want in (flt or {}).items():
            want = want if isinstance(want, list) else [want]
            have = f.get(name)
            have = have if isinstance(have, list) else [have]
            ok = ok and any(type(w) is type(h) and w == h for w in want for h in have)
        nt = hybrid.normalize_text(t)
        ok = ok and all(f" {p} " in f" {nt} " for p in phrases)  # words of WORDS have no punctuation
        out.append(ok)
    return np.array(out)


principals = st.one_of(st.none(), st.builds(hybrid.Principal, st.sampled_from(TENANTS + ("nobody",)),
                                            st.lists(st.sampled_from(GROUPS), max_size=3).map(tuple)))
filters = st.one_of(st.none(), st.fixed_dictionaries({}, optional={
    "topic": st.one_of(st.sampled_from("xyz"), st.lists(st.sampled_from("xyzw"), min_size=1, max_size=3)),
    "year": st.sampled_from([2000, 2001, 2004, "2001"])}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(principal=principals, flt=filters, mode=st.sampled_from(["dense", "lexical", "hybrid"]),
       fusion=st.sampled_from(["rrf", "convex"]), width=st.one_of(st.integers(1, DIM), st.just("full")),
       k=st.integers(1, 80), words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
       quote=st.booleans(), seed=st.integers(0, 10_000))
def test_no_result_crosses_tenants_and_k_results_come_back(version, principal, flt, mode, fusion, width, k, words,
                                                           quote, seed):
    texts, fields = synthetic_corpus(N)
    query = " ".join(words[:-1] + [f'"{words[-1]}"' if quote else words[-1]])
    got = retrieve(version, query, k, width, unit(seed), mode=mode, filter=flt, fusion=fusion, principal=principal,
                   depth=30)
    allowed = reference_allowed(fields, texts, principal, flt, [words[-1]] if quote else [])
    rows = [int(i[1:]) for i in got.ids]
    assert len(set(rows)) == len(rows)
    for r in rows:
        assert allowed[r], (r, fields[r])
        if principal is not None:
            assert fields[r].get("tenant") == principal.tenant
    if mode == "lexical":
        matching = allowed & np.array([bool(set(hybrid.analyze(t)) & set(words)) for t in texts])
        assert len(rows) == min(k, int(matching.sum()))
    else:  # no shortfall: filtering happens before the top-k
        assert len(rows) == min(k, int(allowed.sum()))


@pytest.mark.parametrize("width", [4, 8, 16, "full"])
def test_filtered_dense_equals_funnel_over_the_allowed_subset(version, width):
    """Congruence with a numpy reference: stage 1 over the allowed rows only, then rescoring."""
    texts, fields = synthetic_corpus(N)
    allowed = np.array([f.get("topic") == "y" and f.get("year") in (2001, 2003) for f in fields])
    assert allowed.sum() > 20
    q = unit(7)
    got = retrieve(version, "beta", 15, width, q, filter={"topic": "y", "year": [2001, 2003]})
    X = np.asarray(version.docs)
    sub = np.flatnonzero(allowed)
    if width == "full":
        want = sub[top_k(X[sub] @ q, 15)]
    else:
        s1 = prefix_normalize(X[sub], version.m0) @ prefix_normalize(q[None], version.m0)[0]
        short = sub[top_k(s1, max(version.shortlist, 15))]
        cos = (X[short, :width] @ q[:width]) / (np.linalg.norm(X[short, :width], axis=1) * np.linalg.norm(q[:width]))
        want = short[top_k(cos, 15)]
    assert [int(i[1:]) for i in got.ids] == want.tolist()


def test_k_results_when_enough_pass_even_beyond_the_shortlist(version):
    """The shortlist is 20; a filter passing 80 documents still gives k = 60 results in every dense policy."""
    for width in (8, 32, "full"):
        for mode in ("dense", "hybrid"):
            got = retrieve(version, "alpha", 60, width, unit(3), mode=mode, filter={"topic": "x"})
            assert len(got.ids) == 60 and got.trace["allowed_documents"] == 80


def test_lexical_ranks_by_bm25_and_phrase_is_exact(version):
    got = retrieve(version, '"err_ssl_5417"', 500, 16, unit(0), mode="lexical")
    texts, _ = synthetic_corpus(N)
    want = {i for i, t in enumerate(texts) if "err_ssl_5417" in t.split()}
    assert {int(i[1:]) for i in got.ids} == want
    assert list(got.scores) == sorted(list(got.scores), reverse=True) and min(list(got.scores)) > 0


def test_old_version_still_serves_dense_and_refuses_the_rest(old_version):
    got = retrieve(old_version, "alpha", 5, "full", unit(1))
    assert len(got.ids) == 5
    for opts, query in [(dict(mode="lexical"), "alpha"), (dict(mode="hybrid"), "alpha"),
                        (dict(filter={"topic": "x"}), "alpha"), ({}, '"alpha"'),
                        (dict(principal=hybrid.Principal("acme")), "alpha")]:
        with pytest.raises(ApiError) as e:
            retrieve(old_version, query, 5, "full", unit(1), **opts)
        assert e.value.code == "lexical_unavailable" and e.value.status == 409


def test_unknown_filter_field_is_refused(version):
    with pytest.raises(ApiError) as e:
        retrieve(version, "alpha", 5, 8, unit(1), filter={"colour": "red"})
    assert e.value.code == "unknown_filter_field" and e.value.status == 422


def test_lexical_files_are_checksummed(version, tmp_path):
    path = write_synthetic_version(tmp_path, n=30, dim=DIM)
    manifest = verify(path)
    assert {"bm25_data.npy", "bm25_vocab.json", "doc_text.json", "doc_fields.json"} <= set(manifest.files)
    (path / "doc_fields.json").write_text("[]")
    with pytest.raises(IndexVersionError) as e:
        IndexVersion.load(path)
    assert e.value.code == "checksum"


def test_access_settings_are_validated():
    digest = hashlib.sha256(b"some-long-random-key-123").hexdigest()
    ok = GatewaySettings(access_policy="api_key", principals={digest: {"tenant": "acme", "groups": ["eng"]}})
    assert ok.principals[digest]["tenant"] == "acme"
    for bad in [dict(access_policy="api_key", search_api_key="Zq8-long-random-search-key"),
                dict(principals={"not-a-digest": {"tenant": "acme"}}),
                dict(principals={digest: {"groups": ["eng"]}})]:
        with pytest.raises(ValidationError):
            GatewaySettings(**bad)
