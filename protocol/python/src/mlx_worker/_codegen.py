"""Generates ``_types.py`` from the protocol's JSON Schema (``protocol/schema.json``).

Every ``$defs`` entry becomes a ``TypedDict`` (objects), a ``Literal`` alias (string enums) or a
union alias; the schema's ``methods``, ``notifications`` and ``errors`` indexes become the tables
``METHODS``, ``NOTIFICATIONS`` and ``ERROR_DATA``. Run from the repository root::

    python protocol/python/src/mlx_worker/_codegen.py            # rewrites _types.py
    python protocol/python/src/mlx_worker/_codegen.py --check    # exit 1 when it is stale

``tests/test_types.py`` fails when the checked-in file differs from what this writes. Standard
library only; a schema construct it does not know is an error, never a silent ``Any``.
"""

from __future__ import annotations

import json
import keyword
import sys
from pathlib import Path
from typing import Any

HEADER = '''"""The protocol's types, generated from protocol/schema.json by _codegen.py: do not edit.

Objects are ``TypedDict``s (what the client sends and returns are plain JSON dicts), enums are
``Literal`` aliases. Regenerate with ``python protocol/python/src/mlx_worker/_codegen.py``.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, Union
'''


def _ref_name(ref: str) -> str:
    prefix = "#/$defs/"
    if not ref.startswith(prefix):
        raise ValueError(f"unsupported $ref {ref!r}")
    return ref[len(prefix) :]


# Keys that annotate a schema without constraining it.
_ANNOTATIONS = {"description", "default", "title", "format", "minimum", "maximum"}


def _scalar(kind: str, schema: dict[str, Any], where: str, alias: bool) -> str:
    if kind == "string":
        if "const" in schema:
            return f"Literal[{schema['const']!r}]"
        return "str"
    if kind == "integer":
        return "int"
    if kind == "number":
        return "float"
    if kind == "boolean":
        return "bool"
    if kind == "null":
        return "None"
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return f"dict[str, {type_of(extra, where, alias)}]"
        return "dict[str, Any]"
    if kind == "array":
        items = schema.get("items")
        return f"list[{type_of(items, where, alias) if items is not None else 'Any'}]"
    raise ValueError(f"{where}: unsupported type {kind!r}")


def _union(parts: list[str], alias: bool) -> str:
    unique = list(dict.fromkeys(parts))
    if len(unique) == 1:
        return unique[0]
    # A module-level alias is evaluated at import: `Union` takes forward references as strings.
    return f"Union[{', '.join(unique)}]" if alias else " | ".join(unique)


def type_of(schema: Any, where: str, alias: bool = False) -> str:
    """The Python annotation of a schema; `alias`: for a module-level alias, where names are
    quoted (forward references) and unions spelled `Union[...]`."""
    if schema is True or (isinstance(schema, dict) and set(schema) <= _ANNOTATIONS):
        return "Any"
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: unsupported schema {schema!r}")
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return repr(name) if alias else name
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _union([type_of(s, where, alias) for s in schema[key]], alias)
    if "const" in schema and "type" not in schema:
        return f"Literal[{schema['const']!r}]"
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union([_scalar(k, schema, where, alias) for k in kind], alias)
    if isinstance(kind, str):
        return _scalar(kind, schema, where, alias)
    raise ValueError(f"{where}: cannot type {schema!r}")


def _comment(text: str | None, indent: str) -> list[str]:
    if not text:
        return []
    return [f"{indent}#: {line}".rstrip() for line in text.splitlines()]


def _docstring(text: str | None, indent: str) -> list[str]:
    if not text:
        return []
    body = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = body.splitlines()
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return [f'{indent}"""{lines[0]}'] + [f"{indent}{l}".rstrip() for l in lines[1:]] + [f'{indent}"""']


def _typed_dict(name: str, schema: dict[str, Any]) -> list[str]:
    props: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    for field in props:
        if not field.isidentifier() or keyword.iskeyword(field):
            raise ValueError(f"{name}.{field}: not a Python identifier")
    fields_req = [f for f in props if f in required]
    fields_opt = [f for f in props if f not in required]

    def body(fields: list[str]) -> list[str]:
        out: list[str] = []
        for field in fields:
            prop = props[field]
            if not isinstance(prop, dict):
                prop = {}  # `true`: any value
            out += _comment(prop.get("description"), "    ")
            if "default" in prop:
                out.append(f"    #: default: {json.dumps(prop['default'])}")
            out.append(f"    {field}: {type_of(prop, f'{name}.{field}')}")
        return out

    lines: list[str] = []
    if fields_req and fields_opt:
        # Python 3.10 has no NotRequired: required members in a base, the rest total=False.
        lines += [f"class _{name}Required(TypedDict):"]
        lines += body(fields_req)
        lines += ["", ""]
        lines += [f"class {name}(_{name}Required, total=False):"]
        lines += _docstring(schema.get("description"), "    ")
        lines += body(fields_opt)
    else:
        total = "" if fields_req or not fields_opt else ", total=False"
        lines += [f"class {name}(TypedDict{total}):"]
        lines += _docstring(schema.get("description"), "    ")
        lines += body(fields_req or fields_opt)
        if len(lines) == 1:
            lines.append("    pass")
    return lines


def _variant_name(name: str, variant: dict[str, Any], i: int) -> str:
    if "title" in variant:
        return str(variant["title"])
    tag = variant.get("properties", {}).get("type", {}).get("const")
    if isinstance(tag, str):
        return name + "".join(part.capitalize() for part in tag.split("_"))
    return f"{name}{i}"


def _definition(name: str, schema: dict[str, Any]) -> list[str]:
    variants = schema.get("oneOf") or schema.get("anyOf")
    if variants is not None:
        if all(v.get("type") == "string" and "const" in v for v in variants):
            values = ", ".join(repr(v["const"]) for v in variants)
            return _comment(schema.get("description"), "") + [f"{name} = Literal[{values}]"]
        lines: list[str] = []
        members: list[str] = []
        for i, variant in enumerate(variants):
            if variant.get("type") == "object":
                vname = _variant_name(name, variant, i)
                lines += _typed_dict(vname, variant) + ["", ""]
                members.append(vname)
            else:
                members.append("")
        for i, variant in enumerate(variants):
            if variant.get("type") != "object":
                members[i] = type_of(variant, name, alias=True)
        union = f"{name} = {_union(members, alias=True)}"
        return lines + _comment(schema.get("description"), "") + [union]
    kind = schema.get("type")
    if kind == "object":
        return _typed_dict(name, schema)
    return _comment(schema.get("description"), "") + [f"{name} = {type_of(schema, name, True)}"]


def generate(schema: dict[str, Any]) -> str:
    """The text of ``_types.py`` for ``schema``."""
    out: list[str] = [HEADER]
    out.append(f"PROTOCOL_VERSION = {schema['protocol_version']!r}")
    for name, definition in schema["$defs"].items():
        out += ["", ""] + _definition(name, definition)
    methods = {
        m: (_ref_name(e["params"]["$ref"]), _ref_name(e["result"]["$ref"]))
        for m, e in schema["methods"].items()
    }
    notifications = {n: _ref_name(e["params"]["$ref"]) for n, e in schema["notifications"].items()}
    errors = {int(c): (_ref_name(d["$ref"]) if d else None) for c, d in schema["errors"].items()}
    out += ["", "", "#: Every method: its params' and its result's type names."]
    out.append("METHODS: dict[str, tuple[str, str]] = {")
    out += [f"    {m!r}: ({p!r}, {r!r})," for m, (p, r) in methods.items()]
    out += ["}", "", "#: Every notification: its params' type name."]
    out.append("NOTIFICATIONS: dict[str, str] = {")
    out += [f"    {n!r}: {p!r}," for n, p in notifications.items()]
    out += ["}", "", "#: Every error code of the contract: the type name of its `data`, if any."]
    out.append("ERROR_DATA: dict[int, str | None] = {")
    out += [f"    {c}: {d!r}," for c, d in errors.items()]
    out += ["}", ""]
    return "\n".join(out)


def default_paths() -> tuple[Path, Path]:
    """(schema.json, _types.py) in a checkout of the repository."""
    here = Path(__file__).resolve().parent
    return here.parents[2] / "schema.json", here / "_types.py"


def main(argv: list[str]) -> int:
    schema_path, types_path = default_paths()
    text = generate(json.loads(schema_path.read_text(encoding="utf-8")))
    if "--check" in argv:
        current = types_path.read_text(encoding="utf-8") if types_path.exists() else ""
        if current != text:
            print(f"{types_path} is stale: run {Path(__file__).name} to regenerate", file=sys.stderr)
            return 1
        return 0
    types_path.write_text(text, encoding="utf-8")
    print(f"wrote {types_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
