"""Every operation of the gateway's OpenAPI document carries examples (issue 17 item 7), and they are right.

Walks the document of ``create_app(load=False)`` (a plain gateway, and one with a search key and the header
access policy, whose search routes add 401 and 403): each request body and each 2xx answer has an example
(``example``, named ``examples`` or the ``examples`` of its schema, ``$ref``s into ``components/schemas``
followed), every typed error answer has one whose code belongs to its status, and each example validates
against its media type's JSON schema and, where the route declares one, its pydantic model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from service.admin import PromoteBody, PublishBody, ReloadBody, RollbackBody
from service.app import create_app
from service.config import GatewaySettings
from service.errors import STATUS_OF_CODE
from service.examples import api_routes
from service.models import BatchSearchRequest, ErrorBody, SearchRequest
from service.parsing import check_keys

METHODS = ("get", "put", "post", "delete", "patch")
REQUEST_MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("post", "/v1/search"): SearchRequest, ("post", "/v1/collections/{name}/search"): SearchRequest,
    ("post", "/v1/search/batch"): BatchSearchRequest,
    ("post", "/v1/collections/{name}/search/batch"): BatchSearchRequest,
    ("post", "/admin/reload"): ReloadBody, ("post", "/admin/publish"): PublishBody,
    ("post", "/admin/promote"): PromoteBody, ("post", "/admin/rollback"): RollbackBody}


def settings_of(kind: str, home: Path) -> GatewaySettings:
    if kind == "plain":
        return GatewaySettings(home=home, collection="scifact", redis_url=None)
    return GatewaySettings(home=home, collection="scifact", redis_url=None,
                           search_api_key="Zq4-vT9pLx2mW7cR1yB8nK3sD6fH0jGe", access_policy="header")


@pytest.fixture(scope="module", params=["plain", "search_key_and_tenants"])
def app(request, tmp_path_factory):
    return create_app(settings_of(request.param, tmp_path_factory.mktemp("home")), load=False)


@pytest.fixture(scope="module")
def doc(app):
    return app.openapi()


def resolve(schema: dict, doc: dict) -> dict:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def schema_examples(schema: dict, doc: dict) -> list:
    """The ``examples`` of a schema, of its ``$ref`` target, or of the parts of its ``anyOf``/``oneOf``."""
    schema = resolve(schema, doc)
    out = list(schema.get("examples", []))
    for key in ("anyOf", "oneOf"):
        for part in schema.get(key, []):
            out += schema_examples(part, doc)
    return out


def examples(media: dict, doc: dict) -> list:
    """Every example of a media type object: ``example``, the values of ``examples``, its schema's."""
    out = [media["example"]] if "example" in media else []
    out += [e["value"] for e in media.get("examples", {}).values()]
    return out + schema_examples(media.get("schema") or {}, doc)


def operations(doc: dict):
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                yield method, path, item[method]


def validator(schema: dict, doc: dict) -> Draft202012Validator:
    return Draft202012Validator({**schema, "components": doc["components"]})


def response_models(app) -> dict[tuple[str, str, str], type[BaseModel]]:
    """(method, path, status) -> the pydantic model the route declares for that answer."""
    out = {}
    for route in api_routes(app):
        for method in route.methods:
            if route.response_model is not None:
                out[(method.lower(), route.path_format, str(route.status_code or 200))] = route.response_model
            for status, response in route.responses.items():
                if isinstance(response.get("model"), type):
                    out[(method.lower(), route.path_format, str(status))] = response["model"]
    return out


def test_the_document_has_every_route(doc):
    ops = {(m, p) for m, p, _ in operations(doc)}
    assert len(ops) == 17
    assert {("get", "/metrics"), ("put", "/v1/collections/{name}/documents"), ("get", "/readyz"),
            ("get", "/v1/collections/{name}/documents/{doc_id}"), ("post", "/admin/rollback")} <= ops


def test_every_request_body_has_an_example_that_its_schema_and_model_accept(doc):
    bodies = 0
    for method, path, op in operations(doc):
        if "requestBody" not in op:
            continue
        for ctype, media in op["requestBody"]["content"].items():
            found = examples(media, doc)
            assert found, f"{method.upper()} {path} ({ctype}): no request example"
            bodies += 1
            for example in found:
                if ctype == "application/json":
                    validator(media["schema"], doc).validate(example)
                model = REQUEST_MODELS.get((method, path))
                if model is not None:
                    check_keys(example)
                    model.model_validate(example)
                    if model is BatchSearchRequest:
                        assert all(isinstance(item, SearchRequest) for item in model.model_validate(example).items())
    assert bodies == 11  # 4 searches, 4 admin, upsert (JSON and NDJSON), delete


def test_the_upsert_body_shows_json_and_ndjson(doc):
    body = doc["paths"]["/v1/collections/{name}/documents"]["put"]["requestBody"]
    assert "NDJSON" in body["description"]
    lines = [line for line in body["content"]["application/x-ndjson"]["example"].split("\n") if line.strip()]
    assert len(lines) == 2
    json_ids = [d["id"] for d in body["content"]["application/json"]["example"]]
    assert "4983" in json_ids


def test_every_2xx_answer_has_an_example_that_its_schema_and_model_accept(app, doc):
    models = response_models(app)
    answers = typed = 0
    for method, path, op in operations(doc):
        ok = {s: r for s, r in op["responses"].items() if s.startswith("2")}
        assert ok, f"{method.upper()} {path}: no 2xx answer"
        for status, response in ok.items():
            assert response.get("content"), f"{method.upper()} {path} {status}: no content"
            for ctype, media in response["content"].items():
                found = examples(media, doc)
                assert found, f"{method.upper()} {path} {status} ({ctype}): no example"
                answers += 1
                model = models.get((method, path, status))
                for example in found:
                    if ctype == "application/json":
                        validator(media.get("schema") or {}, doc).validate(example)
                        assert isinstance(example, dict)
                    if model is not None:
                        model.model_validate(example)
                        typed += 1
    assert answers == 17
    assert typed >= 8  # searches (2 examples each), batches, collections, reload (2)


def test_every_typed_error_answer_has_an_example_of_its_status(doc):
    checked = set()
    for method, path, op in operations(doc):
        for status, response in op["responses"].items():
            media = (response.get("content") or {}).get("application/json")
            if media is None or media.get("schema") != {"$ref": "#/components/schemas/ErrorBody"}:
                continue
            found = examples(media, doc)
            assert found, f"{method.upper()} {path} {status}: no error example"
            for example in found:
                body = ErrorBody.model_validate(example)
                assert "field" in example["error"]  # the gateway always sends it (null when no field is at fault)
                assert STATUS_OF_CODE[body.error.code] == int(status), (method, path, status, body.error.code)
                checked.add((path, status, body.error.code))
    assert ("/v1/search", "422", "blank_query") in checked
    assert ("/v1/collections/{name}/search", "404", "unknown_collection") in checked
    assert ("/v1/search", "429", "overloaded") in checked
    assert ("/admin/publish", "403", "admin_disabled") in checked
    assert ("/v1/collections/{name}/writes", "403", "writes_disabled") in checked
    assert ("/v1/collections/{name}/documents/{doc_id}", "404", "unknown_document") in checked
    assert ("/admin/rollback", "409", "no_previous") in checked


def test_the_search_routes_with_tenants_show_tenant_required(tmp_path):
    doc = create_app(settings_of("search_key_and_tenants", tmp_path), load=False).openapi()
    for path in ("/v1/search", "/v1/collections/{name}/search/batch"):
        example = doc["paths"][path]["post"]["responses"]["403"]["content"]["application/json"]["example"]
        assert example["error"]["code"] == "tenant_required"


def test_the_examples_keep_their_nulls(doc):
    # FastAPI's exclude_none would drop them; the trace's router_score and an error's field are required keys
    trace = doc["components"]["schemas"]["SearchResponse"]["examples"][0]["trace"]
    assert "router_score" in trace and trace["router_score"] is None
    slot = doc["components"]["schemas"]["BatchSearchResponse"]["examples"][0]["results"][0]
    assert slot["trace"]["router_score"] is None
    document = doc["paths"]["/v1/collections/{name}/documents/{doc_id}"]["get"]["responses"]["200"]["content"]
    assert document["application/json"]["examples"]["version"]["value"]["seq"] is None


def test_the_metrics_example_is_prometheus_text(doc):
    content = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    (ctype, media), = content.items()
    assert ctype.startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(media["example"])}
    assert {"adawidth_http_requests", "adawidth_live_version_info", "adawidth_index_documents"} <= names


def test_the_client_reads_the_answer_examples(doc):
    from adawidth_client.models import ErrorDetail, ReloadResult, SearchResponse

    for example in doc["components"]["schemas"]["SearchResponse"]["examples"]:
        assert SearchResponse.from_json(example).trace.index_version == "20261201T155832Z-4a31a5ef"
    for example in doc["components"]["schemas"]["ReloadResponse"]["examples"]:
        ReloadResult.from_json(example)
    error = doc["paths"]["/v1/search"]["post"]["responses"]["422"]["content"]["application/json"]["example"]
    assert ErrorDetail.from_json(error["error"]).code == "blank_query"


def test_the_document_is_generated_once(app):
    assert app.openapi() is app.openapi()


def test_the_served_document_is_the_one_with_the_examples(tmp_path):
    from fastapi.testclient import TestClient

    app = create_app(settings_of("plain", tmp_path), load=False)
    with TestClient(app) as client:
        served = client.get("/openapi.json").json()
    assert served == app.openapi()
    error = served["paths"]["/v1/search"]["post"]["responses"]["429"]["content"]["application/json"]["example"]
    assert error == {"error": {"code": "overloaded", "message": "too many searches in progress; retry later",
                               "field": None}}
