"""Differential parity with the Python reference, checked against the reference libraries
themselves: generated flat JSON Schemas and raw replies through Pydantic (the model built as
`../shared/parity/gen_vectors.py` builds it: lax mode, extra keys ignored) and through the
runtime's `validate`, which must give the same bytes or the same failure class; and generated
model strings through LangChain's own `init_chat_model` parsing and the runtime's.

Seeded, so a failure reproduces: the same cases every run by default, or those of
`FABRIC_PARITY_SEED=N` (another set, to look further); `FABRIC_PARITY_EXAMPLES` sets the number of
cases per test (default 2000). Each test prints how many cases it compared.
"""

import json
import os
import string
import warnings
from typing import Literal, Optional

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from pydantic import ConfigDict, ValidationError, create_model

from fabric_runtime import ValidationError as Refused
from fabric_runtime import parse_model, validate

EXAMPLES = int(os.environ.get("FABRIC_PARITY_EXAMPLES", "2000"))
SEED = os.environ.get("FABRIC_PARITY_SEED")
_SETTINGS = settings(max_examples=EXAMPLES, derandomize=SEED is None, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def PARITY(test):
    return _SETTINGS(seed(int(SEED))(test) if SEED is not None else test)
PARITY_COUNTS = {}

# --- The reference, as gen_vectors.py builds it -------------------------------------------


def pyd_type(prop):
    t = prop.get("type")
    if "enum" in prop:
        return Literal[tuple(prop["enum"])]
    return {"string": str, "integer": int, "number": float, "boolean": bool}.get(t) or list[pyd_type(prop.get("items", {"type": "string"}))]


def reference(schema, raw):
    """What the Python runtime makes of `raw`: ("ok", the slot value) or ("error", class)."""
    fields = {}
    required = set(schema.get("required", []))
    for name, prop in schema["properties"].items():
        t = pyd_type(prop)
        fields[name] = (t, ...) if name in required else (Optional[t], None)
    model = create_model("Out", __config__=ConfigDict(extra="ignore"), **fields)
    try:
        obj = json.loads(raw)
    except Exception:
        return ("error", "invalid_json")
    if not isinstance(obj, dict):
        return ("error", "schema_validation")
    try:
        m = model.model_validate(obj)
    except ValidationError:
        return ("error", "schema_validation")
    props = set(schema["properties"])
    if props <= {"text", "message"}:
        d = m.model_dump()
        v = d.get("text") if "text" in props and d.get("text") is not None else d.get("message")
        if isinstance(v, str):
            return ("ok", v)
    return ("ok", m.model_dump_json())


def runtime(schema, raw):
    try:
        return ("ok", validate(schema, raw))
    except Refused as e:
        return ("error", e.reason_class)


# --- Generators ------------------------------------------------------------------------------

names = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=8)
enum_values = st.lists(st.text(alphabet=string.ascii_letters + "é☃ -", min_size=1, max_size=6), min_size=1, max_size=4, unique=True)
prop = st.one_of(
    st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}]),
    enum_values.map(lambda vs: {"type": "string", "enum": vs}),
    st.sampled_from(["string", "integer", "number", "boolean"]).map(lambda t: {"type": "array", "items": {"type": t}}),
)


@st.composite
def schemas(draw):
    if draw(st.integers(0, 9)) == 0:
        # A text envelope: the runtime unwraps it as the reference does.
        props = {k: {"type": "string"} for k in draw(st.sampled_from([["text"], ["message"], ["text", "message"]]))}
    else:
        props = draw(st.dictionaries(names, prop, min_size=1, max_size=5))
    required = [k for k in props if draw(st.booleans())]
    schema = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    return schema


odd_floats = st.sampled_from([0.1, -0.0, 1e-7, 1.5e-7, 1e20, 1e308, 2.5, 7.0, 3.0000000000000004, 123456789.125])
big_ints = st.sampled_from([10**18, -(2**63), 2**63, 2**64 + 1, 10**30, 123456789012345678])
huge_ints = st.sampled_from([10**308, 10**309, -(10**400), 2**1024])
unicode_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


def value_for(p):
    """A value that fits `p`, one Pydantic coerces in lax mode, or one that does not fit."""
    t = p.get("type")
    fits = {
        "string": st.sampled_from(p["enum"]) if "enum" in p else unicode_text,
        "integer": st.one_of(st.integers(-1000, 1000), big_ints),
        "number": st.one_of(st.integers(-1000, 1000), big_ints, huge_ints, st.floats(allow_nan=False, allow_infinity=False), odd_floats),
        "boolean": st.booleans(),
    }
    lax = {
        "string": st.just(None),
        "integer": st.one_of(st.integers(-99, 99).map(str), st.sampled_from([7.0, -2.0, 1e3, "7.0", " 8 ", "1_000"])),
        "number": st.one_of(st.sampled_from(["2.5", "1e3", " 4 ", "inf", "nan", "-0"]), st.integers(-9, 9).map(str)),
        "boolean": st.sampled_from(["true", "false", "yes", "no", "on", "off", "1", "0", 1, 0, "True", "t", "f", "y", "n"]),
    }
    wrong = st.sampled_from([None, [], {}, "x", 1.5, True, {"a": 1}])
    if t == "array":
        item = p.get("items", {"type": "string"})
        return st.one_of(st.lists(value_for(item), max_size=4), wrong)
    # Mostly values that fit, so that whole replies validate too; then lax ones, then wrong ones.
    return st.one_of(fits[t], fits[t], fits[t], fits[t], lax.get(t, wrong), lax.get(t, wrong), wrong)


@st.composite
def replies(draw, schema):
    kind = draw(st.integers(0, 19))
    props = schema["properties"]
    if kind == 0:
        return draw(st.sampled_from(["not json", "", "{", '{"a":1', "[1, 2]", "42", '"text"', "null", "true", "NaN", "{} {}", "\ufeff{}"]))
    obj = {}
    for name, p in props.items():
        if draw(st.integers(0, 4)) > 0:
            obj[name] = draw(value_for(p))
    if draw(st.booleans()):
        obj[draw(names)] = draw(st.one_of(st.integers(), unicode_text, st.none()))
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    if kind == 1 and obj:
        # A duplicate key: json.loads keeps the last.
        first = next(iter(obj))
        text = text[:-1] + (", " if len(obj) else "") + json.dumps(first) + ": " + json.dumps(draw(value_for(props.get(first, {"type": "string"})))) + "}"
    if kind == 2:
        text = "  \n" + text + "\n "
    return text


@st.composite
def cases(draw):
    schema = draw(schemas())
    return schema, draw(replies(schema))


@PARITY
@given(cases())
def test_validation_agrees_with_pydantic(case):
    schema, raw = case
    PARITY_COUNTS["validation"] = PARITY_COUNTS.get("validation", 0) + 1
    expected = reference(schema, raw)
    got = runtime(schema, raw)
    assert got == expected, f"schema={json.dumps(schema)} raw={raw!r}"


# --- Model strings ---------------------------------------------------------------------------

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from langchain.chat_models.base import _parse_model

PROVIDERS = ["openai", "anthropic", "ollama", "google_genai", "google_vertexai", "azure_openai", "bedrock", "cohere", "mistralai", "groq",
             "deepseek", "xai", "perplexity", "fireworks", "together", "huggingface", "nvidia", "upstage", "ibm", "openrouter"]
PREFIXES = ["gpt-", "o1", "o3", "chatgpt", "text-davinci", "claude", "command", "accounts/fireworks", "gemini", "amazon.", "anthropic.",
            "meta.", "mistral", "mixtral", "deepseek", "grok", "sonar", "solar", "llama", "qwen", "phi"]
pieces = st.text(alphabet=string.ascii_letters + string.digits + ".-_/:", max_size=10)


@st.composite
def model_strings(draw):
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.sampled_from(PROVIDERS)) + ":" + draw(pieces)
    if kind == 1:
        p = draw(st.sampled_from(PROVIDERS))
        return draw(st.sampled_from([p.upper(), p.replace("_", "-"), p.title(), " " + p])) + ":" + draw(pieces)
    if kind == 2:
        return draw(st.sampled_from(PREFIXES)) + draw(pieces)
    return draw(pieces)


def reference_model(s):
    try:
        with warnings.catch_warnings():
            # LangChain warns that bare `gemini` names will mean another provider one day.
            warnings.simplefilter("ignore")
            model, provider = _parse_model(s, None)
        return (provider, model)
    except Exception:
        return None


@PARITY
@given(model_strings())
def test_model_strings_agree_with_langchain(s):
    PARITY_COUNTS["model strings"] = PARITY_COUNTS.get("model strings", 0) + 1
    assert parse_model(s) == reference_model(s), repr(s)
