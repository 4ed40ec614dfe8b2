"""Compare the client's dataclass models with the gateway's OpenAPI document: field names, required fields,
JSON types and enum values.  Used against the document of ``create_app`` (unit) and of a live gateway."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from adawidth_client.models import MODELS_BY_SCHEMA, SearchRequest

_PY_TO_JSON = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object", list: "array",
               type(None): "null"}


def client_types(tp) -> tuple[set[str], set | None]:
    """JSON types and enum values (None: no enum) an annotation admits."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        out, enum = set(), None
        for arg in get_args(tp):
            t, e = client_types(arg)
            out |= t
            if e is not None:
                enum = (enum or set()) | e
        return out, enum
    if origin is Literal:
        values = set(get_args(tp))
        return {_PY_TO_JSON[type(v)] for v in values}, values
    if origin in (dict, list):
        return {_PY_TO_JSON[origin]}, None
    if dataclasses.is_dataclass(tp):
        return {"object"}, None
    if tp is Any:
        return {"any"}, None
    return {_PY_TO_JSON[tp]}, None


def schema_types(schema: dict, components: dict) -> tuple[set[str], set | None]:
    """JSON types and enum values of an OpenAPI schema (``$ref`` and ``anyOf`` followed)."""
    if "$ref" in schema:
        return schema_types(components[schema["$ref"].rsplit("/", 1)[1]], components)
    if "anyOf" in schema:
        out, enum = set(), None
        for part in schema["anyOf"]:
            t, e = schema_types(part, components)
            out |= t
            if e is not None:
                enum = (enum or set()) | e
        return out, enum
    enum = set(schema["enum"]) if "enum" in schema else None
    if "type" in schema:
        return {schema["type"]}, enum
    return ({"object"} if "properties" in schema else {"any"}), enum


def _norm(t: set[str]) -> set[str]:
    return t - {"integer"} if "number" in t else t  # an integer is a JSON number


def model_mismatches(model, schema: dict, components: dict, *, request: bool = False) -> list[str]:
    """Every disagreement between a client model and its schema (empty when they agree).

    ``request``: the client's ``None`` means "not sent", so nullability of optional fields is not compared.
    """
    problems = []
    hints = typing.get_type_hints(model)
    fields = {f.name: f for f in dataclasses.fields(model) if f.name != "extra"}
    props = schema.get("properties", {})
    for name in sorted(set(props) - set(fields)):
        problems.append(f"{model.__name__}: the gateway has field {name!r}, the client does not")
    for name in sorted(set(fields) - set(props)):
        problems.append(f"{model.__name__}: the client has field {name!r}, the gateway does not")
    required = set(schema.get("required", []))
    for name, f in fields.items():
        if name not in props:
            continue
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if (name in required) == has_default:
            problems.append(f"{model.__name__}.{name}: required by the gateway: {name in required}, "
                            f"by the client: {not has_default}")
        ct, ce = client_types(hints[name])
        st, se = schema_types(props[name], components)
        if request and name not in required:
            ct, st = ct - {"null"}, st - {"null"}
        if "any" not in ct and _norm(ct) != _norm(st):
            problems.append(f"{model.__name__}.{name}: JSON types {sorted(_norm(ct))} in the client, "
                            f"{sorted(_norm(st))} in the gateway")
        if ce is not None and ce != se:
            problems.append(f"{model.__name__}.{name}: values {sorted(map(str, ce))} in the client, "
                            f"{sorted(map(str, se or ()))} in the gateway")
    return problems


def openapi_mismatches(doc: dict) -> list[str]:
    """Mismatches of every client model with an OpenAPI document of the gateway."""
    components = doc["components"]["schemas"]
    body = doc["paths"]["/v1/search"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    problems = model_mismatches(SearchRequest, body, components, request=True)
    for name, model in MODELS_BY_SCHEMA.items():
        if name not in components:
            problems.append(f"the gateway's OpenAPI document has no schema {name!r}")
            continue
        problems += model_mismatches(model, components[name], components)
    return problems
