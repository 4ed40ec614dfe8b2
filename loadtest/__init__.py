"""The load test: ``python -m loadtest.run`` drives a gateway with locust (``loadtest/locustfile.py``)."""

UPSERT_NAME = "PUT /v1/collections/{name}/documents"
"""Locust's request name of the writer users' upserts (``loadtest/locustfile.py``; importable without locust)."""
DELETE_NAME = "POST /v1/collections/{name}/documents/delete"
"""Locust's request name of the writer users' deletes."""
