"""Schemathesis against the gateway's own OpenAPI document: no 5xx, responses as documented.

The in-process ASGI app serves the session's real SciFact index with an
admin key configured.  Two bounded, derandomised runs (schema-valid and
schema-invalid requests) over every operation; each generated request is sent
once without credentials and once with the admin key.

Checks: ``not_a_server_error`` (no 5xx), status codes, content types, headers
and bodies conform to the document, and schema-invalid requests are refused
with a 4xx of our table (``negative_data_rejection``, configured to accept 413).  ``positive_data_acceptance`` is not
used: a schema-valid body can still be refused on purpose (a query of spaces
is a string of length >= 1 but is ``blank_query``).
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from prometheus_client import CollectorRegistry
from schemathesis.checks import load_all_checks
from schemathesis.generation import GenerationMode

from service.app import create_app
from service.config import GatewaySettings
from tests.integration.conftest import STRONG_ADMIN_KEY

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 300  # per generation mode; each example is sent twice (without and with the admin key)


@pytest.fixture(scope="module")
def fuzz_schema(scifact_home):
    app = create_app(GatewaySettings(home=scifact_home, collection="scifact", admin_api_key=STRONG_ADMIN_KEY),
                     CollectorRegistry())
    # schema-invalid requests must get one of our 4xx; 413 (query_too_long for a query past maxLength,
    # body_too_large) is a refusal too, missing from schemathesis's default list
    config = schemathesis.Config.from_dict({"checks": {"negative_data_rejection": {
        "expected-statuses": [400, 401, 403, 404, 405, 409, 413, 415, 422, 429]}}})
    return schemathesis.openapi.from_asgi("/openapi.json", app, config=config)


def checks():
    load_all_checks()  # the checks' modules can be imported only once they are registered
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                                   response_headers_conformance, response_schema_conformance,
                                                   status_code_conformance)

    return [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
            response_schema_conformance, negative_data_rejection]


def run_mode(schema, mode):
    chosen = checks()
    statuses = []

    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=schema.as_strategy(mode))
    def fuzz(case):
        for headers in (None, {"Authorization": f"Bearer {STRONG_ADMIN_KEY}"}):
            response = case.call_and_validate(headers=headers, checks=chosen)
            statuses.append(response.status_code)

    fuzz()
    return statuses


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_openapi_fuzzing_finds_no_5xx(fuzz_schema, mode):
    statuses = run_mode(fuzz_schema, mode)
    assert len(statuses) >= MAX_EXAMPLES  # it really ran
    assert all(s < 500 for s in statuses)
    if mode == GenerationMode.POSITIVE:
        assert 200 in statuses  # real searches were served, not only refused
