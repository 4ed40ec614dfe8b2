"""The load test: ``python -m loadtest.run`` drives a gateway with locust (``loadtest/locustfile.py``)."""

UPSERT_NAME = "PUT /v1/collections/{name}/documents"
"""Locust's request name of the writer users' upserts (``loadtest/locustfile.py``; importable without locust)."""
DELETE_NAME = "POST /v1/collections/{name}/documents/delete"
"""Locust's request name of the writer users' deletes."""


def acknowledged_state(records) -> tuple[dict[str, str], dict[str, str]]:
    """What the writer users' acknowledged writes leave (records of ``ADAWIDTH_LOCUST_WRITE_LOG``, any order:
    applied by ``seq``): ``(live, deleted)``, each id -> its last upserted text; ``live`` holds the ids whose last
    write is an upsert, ``deleted`` those whose last write is a delete."""
    live, deleted = {}, {}
    texts: dict[str, str] = {}
    for rec in sorted(records, key=lambda r: r["seq"]):
        for i in rec["ids"]:
            if rec["op"] == "upsert":
                live[i] = texts[i] = rec["texts"][i]
                deleted.pop(i, None)
            else:
                live.pop(i, None)
                deleted[i] = texts.get(i, "")
    return live, deleted
