"""The generated types, the error classes and the clients' methods against protocol/schema.json:
any drift fails here."""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path

import mlx_worker
from mlx_worker import AsyncClient, Client, _codegen, _types
from mlx_worker.errors import ERROR_CLASSES, LoadFailedError, WorkerError, error_from_response

# The checkout's schema, and the types of the package under test (installed or not).
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schema.json"
TYPES_PATH = Path(_types.__file__)
SCHEMA = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def test_generated_types_match_the_schema():
    assert TYPES_PATH.read_text(encoding="utf-8") == _codegen.generate(SCHEMA), (
        "mlx_worker/_types.py is stale: run `python protocol/python/src/mlx_worker/_codegen.py`"
    )


def test_every_type_of_the_schema_resolves():
    for name in SCHEMA["$defs"]:
        value = getattr(_types, name)
        if isinstance(value, type) and issubclass(value, dict):
            hints = typing.get_type_hints(value)
            properties = SCHEMA["$defs"][name].get("properties", {})
            assert set(hints) == set(properties), name
            required = set(SCHEMA["$defs"][name].get("required", []))
            assert value.__required_keys__ == frozenset(required), name
    assert _types.PROTOCOL_VERSION == SCHEMA["protocol_version"] == mlx_worker.PROTOCOL_VERSION


def test_every_method_has_a_call_on_both_clients():
    assert set(_types.METHODS) == set(SCHEMA["methods"])
    for method in SCHEMA["methods"]:
        assert callable(getattr(Client, method)), method
        assert inspect.iscoroutinefunction(getattr(AsyncClient, method)), method


def test_every_error_code_has_its_class():
    assert set(ERROR_CLASSES) == {int(code) for code in SCHEMA["errors"]} == set(_types.ERROR_DATA)
    e = error_from_response({"code": -32002, "message": "m", "data": {"kind": "not_found", "detail": "d"}})
    assert isinstance(e, LoadFailedError)
    assert (e.code, e.message, e.kind, e.detail) == (-32002, "m", "not_found", "d")
    unknown = error_from_response({"code": -1, "message": "x"})
    assert type(unknown) is WorkerError and unknown.data is None


def test_the_generator_reads_the_schema_beside_the_package_source():
    schema, types = _codegen.default_paths()
    if types.parent.parent.name == "src":  # run from the checkout, not from an install
        assert (schema, types) == (SCHEMA_PATH, TYPES_PATH)
