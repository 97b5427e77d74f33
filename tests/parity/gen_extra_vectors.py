"""Extra structured-output parity vectors, answered by the Python reference (pydantic v2).

The shared vectors cover the common cases; these pin the edges the runtime must also agree on:
lax coercions (numeric strings, underscores, booleans from strings), Python's json.loads
extensions (NaN, Infinity, big integers), float formatting thresholds, and string escaping.
The mapping from schema to model is the reference's own (../../shared/parity/gen_vectors.py).

usage: python tests/parity/gen_extra_vectors.py > tests/fixtures/parity/structured-extra.jsonl
(needs pydantic 2.14)
"""
import json
from typing import Literal, Optional
from pydantic import create_model, ValidationError, ConfigDict


def pyd_type(prop):
    t = prop.get("type")
    if "enum" in prop:
        return Literal[tuple(prop["enum"])]
    if t == "string": return str
    if t == "integer": return int
    if t == "number": return float
    if t == "boolean": return bool
    if t == "array":
        return list[pyd_type(prop.get("items", {"type": "string"}))]
    raise ValueError(f"not flat: {prop}")


def model_for(schema):
    fields = {}
    req = set(schema.get("required", []))
    for name, prop in schema["properties"].items():
        T = pyd_type(prop)
        fields[name] = (T, ...) if name in req else (Optional[T], None)
    return create_model("Out", __config__=ConfigDict(extra="ignore"), **fields)


def case(schema, raw):
    M = model_for(schema)
    try:
        obj = json.loads(raw)
    except Exception:
        return {"schema": schema, "raw": raw, "error": "invalid_json"}
    if not isinstance(obj, dict):
        return {"schema": schema, "raw": raw, "error": "schema_validation"}
    try:
        m = M.model_validate(obj)
    except ValidationError:
        return {"schema": schema, "raw": raw, "error": "schema_validation"}
    props = set(schema["properties"])
    out = {"schema": schema, "raw": raw, "compact": m.model_dump_json()}
    if props <= {"text", "message"}:
        d = m.model_dump()
        v = d.get("text") if "text" in props and d.get("text") is not None else d.get("message")
        if isinstance(v, str):
            out["unwrapped"] = v
    return out


def one(ty, **extra):
    """A one-property schema `{v: ty}`."""
    p = {"type": ty}
    p.update(extra)
    return {"type": "object", "properties": {"v": p}}


F, I, B, S = one("number"), one("integer"), one("boolean"), one("string")
LF, LI, LB = one("array", items={"type": "number"}), one("array", items={"type": "integer"}), one("array", items={"type": "boolean"})
E = {"type": "object", "properties": {"v": {"enum": ["a", "b"]}}, "required": ["v"]}
T = {"type": "object", "properties": {"text": {"type": "string"}}}

CASES = []
for raw in ['1', '"2.5"', '" 2.5 "', '"1e3"', '"inf"', '"-inf"', '"nan"', '"1_000"', 'true', 'false', '"abc"', '""',
            'NaN', 'Infinity', '-Infinity', '1e308', '1e309', '123456789012345678901234567890', '"0x10"', '"+3"', '".5"',
            '"5."', '1e16', '1e15', '0.0001', '0.00001', '0.000001', '2.5e-5', '-1.5e-7', '"1,5"', '[1]', '{}',
            '9999999999999998.0', '12345678901234567.0', '0.30000000000000004', '5e-324', '-0', '"1__0"', '"_1"', '"١٢"']:
    CASES.append((F, '{"v":%s}' % raw))
for raw in ['7.0', '7.5', '"7"', '" 7 "', '"7.0"', '"7.5"', 'true', '"1_000"', '"-3"', '1e3', '"1e3"',
            '123456789012345678901234567890', '-9223372036854775809', '9.2e18', '9.3e18', '-0.0', '"007"', '"7."', '"1.000"', 'NaN', '""']:
    CASES.append((I, '{"v":%s}' % raw))
for raw in ['0', '1', '2', '0.0', '1.0', '1.5', '"yes"', '"YES"', '"no"', '"on"', '"off"', '"y"', '"n"', '"t"', '"f"',
            '"True"', '"1"', '"0"', '"2"', '" yes "', '""', '"0.0"', '-0', '[]']:
    CASES.append((B, '{"v":%s}' % raw))
for raw in ['1', 'true', '[]', '"\\u0001\\b\\f\\t\\u001f\\u007f\\u2028"', '"\\/<>&\'"', '"\\ud83d\\ude00"', '"caf\\u00e9"']:
    CASES.append((S, '{"v":%s}' % raw))
for raw in ['"a"', '"c"', '"A"', '1', 'null']:
    CASES.append((E, '{"v":%s}' % raw))
for schema, raw in [(LF, '{"v":[1,"2",true]}'), (LI, '{"v":[1.0,"2"]}'), (LB, '{"v":["yes",0]}'), (LF, '{"v":[null]}'), (LF, '{"v":"1"}')]:
    CASES.append((schema, raw))
for raw in ['{"v":1,"v":"2"}', ' {"v":1} ', '{"v":1} x', '{"v":1,}', "{'v':1}", '', '[]', '"s"', '{"v":01}', '{"v":1e}', '\ufeff{"v":1}']:
    CASES.append((F, raw))
for raw in ['{"text":null}', '{"text":5}', '{"text":"a\\nb"}']:
    CASES.append((T, raw))

# A matrix of tricky values against every field type (a seeded half also gets a second key).
import random
random.seed(7)
TOKENS = ['0', '1', '-1', '2', '1.0', '0.5', '-0.0', '1e3', '1E3', '1e-7', '1.5e300', '1e400', '123456789012345678901234567890',
          'true', 'false', 'null', 'NaN', 'Infinity', '-Infinity', '""', '"a"', '" 1 "', '"1"', '"1.0"', '"1.5"', '"1e2"',
          '"yes"', '"no"', '"on"', '"Off"', '"t"', '"F"', '"inf"', '"-inf"', '"nan"', '"+1"', '"-1_0"', '"0x1"', '"\\u0661"',
          '"1_"', '" "', '"\\u00e9"', '"\\ud83d\\ude00"', '"\\u0000"', '[]', '[1]', '["a"]', '[1,"2",true]', '{}', '{"a":1}',
          '[null]', '"billing"', '"BILLING"']
MATRIX = [one("number"), one("integer"), one("boolean"), one("string"),
          {"type": "object", "properties": {"v": {"enum": ["billing", "other"]}}},
          {"type": "object", "properties": {"v": {"enum": [1, 2, "1"]}}},
          {"type": "object", "properties": {"v": {"enum": [True, "x"]}}},
          one("array", items={"type": "integer"}), one("array", items={"type": "number"}), one("array"),
          {"type": "object", "properties": {"text": {"type": "string"}, "message": {"type": "string"}}}]
for schema in MATRIX:
    keys = list(schema["properties"])
    for t in TOKENS:
        raw = '{"%s":%s}' % (keys[0], t)
        if len(keys) > 1 and random.random() < 0.5:
            raw = '{"%s":%s,"%s":%s}' % (keys[1], random.choice(TOKENS), keys[0], t)
        CASES.append((schema, raw))

for schema, raw in CASES:
    print(json.dumps(case(schema, raw), ensure_ascii=False))
