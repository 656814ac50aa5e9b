"""test_structured.py - structured output through the official openai client: response_format
json_schema (strict and not), the "grammar" extension (GBNF), and their errors.

On the fixture model (random weights, token-level sampling at temperature 1, so every branch of the
grammar is exercised) every answer that ends by itself ("stop") is valid JSON that validates against
its schema with the `jsonschema` package, and a max_tokens cut answers finish_reason "length" with a
prefix of a valid document; client.chat.completions.parse with a pydantic model (the openai library
builds a strict schema with $defs) parses; unsupported keywords, strict rule breaks, bad $refs and
bad grammars are 400s naming the keyword or rule, its JSON path (or line and column) and the param.
With "models" as the 4th argument it runs on the real models instead (label slow): SmolLM2 and
Qwen2.5-Coder answer a strict schema and a grammar with valid documents.
usage: test_structured.py CKV_BINARY FIXTURES_DIR TMP_DIR [models]"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import QWEN_CODER, SMOLLM2, Checks, Server, skip, preamble  # noqa: E402

ckv, fixtures, tmp, _ = preamble()
real = len(sys.argv) > 4 and sys.argv[4] == "models"
try:
    import jsonschema
except ImportError:
    skip("the `jsonschema` Python package is not installed (tools/test.sh installs it into .venv-test from PyPI)")
import openai  # noqa: E402

t = Checks()

PERSON = {  # strict: every property required, no extra ones (OpenAI's rules)
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "home": {"$ref": "#/$defs/place"},
        "alive": {"type": ["boolean", "null"]},
    },
    "required": ["name", "age", "tags", "home", "alive"],
    "additionalProperties": False,
    "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                           "zip": {"anyOf": [{"type": "string", "format": "date"},
                                                                             {"type": "null"}]}},
                        "required": ["city", "zip"], "additionalProperties": False}},
}
LOOSE = {  # not strict: optional properties, extra properties of a schema, prefixItems, const, patterns, recursion
    "type": "object",
    "properties": {
        "kind": {"const": "node"},
        "score": {"type": "number"},
        "rank": {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 40},
        "code": {"type": "string", "pattern": "^[a-z]{2}-[0-9]{1,3}$"},
        "memo": {"pattern": "ok|fine"},
        "pair": {"prefixItems": [{"type": "string", "maxLength": 4}, {"type": "integer"}], "items": False},
        "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
    },
    "required": ["kind"],
    "additionalProperties": {"type": "boolean"},
}


def fmt(schema, strict, name="doc"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}


def valid_prefix(txt):
    """A cut document: still a prefix the decoder allowed (opens as an object, no invalid UTF-8)."""
    return txt.startswith("{")


def many(c, model, schema, strict, what, rounds, max_tokens, messages):
    stops = cuts = bad = 0
    detail = ""
    for seed in range(rounds):
        r = c.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=1.0, seed=seed,
                                      response_format=fmt(schema, strict))
        ch = r.choices[0]
        txt = ch.message.content
        if ch.finish_reason == "stop":
            try:
                jsonschema.validate(json.loads(txt), schema)
                stops += 1
            except (ValueError, jsonschema.ValidationError) as e:
                bad += 1
                detail = f"seed {seed}: {txt!r}: {str(e).splitlines()[0]}"
        elif ch.finish_reason == "length" and valid_prefix(txt):
            cuts += 1
        else:
            bad += 1
            detail = f"seed {seed}: finish {ch.finish_reason}: {txt!r}"
    t.check(bad == 0 and stops >= rounds // 2, f"{what}: {stops} of {rounds} answers validate against the schema, {cuts} cut by "
            f"max_tokens, none invalid", detail or f"only {stops} complete")


def refused(c, model, rf, needle, param="response_format", extra=None):
    try:
        c.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=4, response_format=rf,
                                  extra_body=extra)
    except openai.BadRequestError as e:
        err = e.body if isinstance(e.body, dict) else {}
        msg = err.get("message", "")
        return t.check(needle in msg and err.get("param") == param, f"400 naming {needle!r} (param {param})",
                       f"{err.get('param')}: {msg}")
    return t.check(False, f"400 naming {needle!r}", "the request was accepted")


def fixture_cases():
    fixture = os.path.join(fixtures, "models", "llama_gqa")
    s = Server(ckv, fixture, tmp, "--model-name", "llama_gqa", "--max-tokens-limit", "512", "--template", "chatml", name="fixture")
    c = s.client()
    ask = [{"role": "user", "content": "hello there"}]
    many(c, "llama_gqa", PERSON, True, "strict schema, temperature 1", 16, 256, ask)
    many(c, "llama_gqa", LOOSE, False, "non-strict schema, temperature 1", 16, 256, ask)

    r = c.chat.completions.create(model="llama_gqa", messages=ask, max_tokens=5, temperature=1.0, seed=1,
                                  response_format=fmt(PERSON, True))
    ch = r.choices[0]
    t.check(ch.finish_reason == "length" and ('{"name":'.startswith(ch.message.content) or ch.message.content.startswith('{"name":')),
            "a max_tokens cut: finish_reason length, the document's prefix", f"{ch.finish_reason}: {ch.message.content!r}")

    # the openai library's own strict schema from a pydantic model (nested models as $defs)
    try:
        from typing import List, Optional

        import pydantic

        class Place(pydantic.BaseModel):
            city: str
            zip: Optional[str]

        class Person(pydantic.BaseModel):
            name: str
            age: int
            places: List[Place]

        _, _, raw = s.request("POST", "/tokenize", {"prompt": '"', "add_special_tokens": False})
        quote = json.loads(raw)["tokens"][0]  # favoured: random weights close their strings sooner
        parsed, detail = None, ""
        for seed in range(8):  # random weights: some answers run into max_tokens (the library raises then)
            try:
                r = c.chat.completions.parse(model="llama_gqa", messages=ask, max_tokens=400, temperature=1.0, seed=seed,
                                             response_format=Person, logit_bias={str(quote): 6})
            except openai.LengthFinishReasonError:
                continue
            parsed, detail = r.choices[0].message.parsed, repr(r.choices[0].message.content)
            break
        t.check(isinstance(parsed, Person), "client.chat.completions.parse with a pydantic model: the answer parses", detail)
    except ImportError:
        print("note: pydantic is absent: the parse() case is skipped")

    # the grammar extension, on both endpoints
    g = 'root ::= "answer: " ("yes" | "no") (", " [0-9]{1,3})?'
    for seed in range(6):
        r = c.chat.completions.create(model="llama_gqa", messages=ask, max_tokens=30, temperature=1.0, seed=seed,
                                      extra_body={"grammar": g})
        txt, fin = r.choices[0].message.content, r.choices[0].finish_reason
        if not t.check(fin == "stop" and re.fullmatch(r"answer: (yes|no)(, [0-9]{1,3})?", txt) is not None,
                       f"grammar (chat, seed {seed}): the answer matches", f"{fin}: {txt!r}"):
            break
    r = c.completions.create(model="llama_gqa", prompt="x", max_tokens=30, temperature=1.0, seed=3,
                             extra_body={"grammar": 'root ::= [a-c]{2} "!"'})
    t.check(re.fullmatch(r"[a-c]{2}!", r.choices[0].text) is not None and r.choices[0].finish_reason == "stop",
            "grammar (completions): the answer matches", repr(r.choices[0].text))

    # errors
    refused(c, "llama_gqa", fmt({"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 2}}}, False),
            "$.properties.age: unsupported keyword 'multipleOf'")
    refused(c, "llama_gqa", fmt({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}, True),
            "strict: property 'a' must be listed in 'required'")
    refused(c, "llama_gqa", fmt({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, True),
            "strict: 'additionalProperties' must be false")
    refused(c, "llama_gqa", fmt({"type": "array", "items": {"$ref": "#/$defs/x"}}, False), "$.items: '$ref' '#/$defs/x' does not resolve")
    refused(c, "llama_gqa", fmt({"type": "string", "pattern": "(?<=a)b"}, False), "look-arounds and named groups are not supported")
    refused(c, "llama_gqa", fmt({"type": "object", "not": {"type": "null"}}, False), "$: unsupported keyword 'not'")
    refused(c, "llama_gqa", {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}, "'response_format.json_schema.name'",
            param="response_format.json_schema.name")
    refused(c, "llama_gqa", {"type": "json_schema"}, "'response_format.json_schema' must be", param="response_format.json_schema")
    refused(c, "llama_gqa", None, "line 2, column 11: rule 'b' is not defined", param="grammar",
            extra={"grammar": 'root ::= a\na ::= "x" b'})
    refused(c, "llama_gqa", {"type": "json_object"}, "cannot be combined", param="grammar", extra={"grammar": 'root ::= "{}"'})
    t.check(s.stop() == 0, "SIGTERM: exit 0")


def model_cases():
    models = [(n, p) for n, p in (("smollm2", SMOLLM2), ("qwen-coder", QWEN_CODER)) if os.path.exists(p)]
    if not models:
        skip("neither models/smollm2-135m-instruct-q4_1.gguf nor the Qwen2.5-Coder GGUF is present (tools/models/)")
    city = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                                              "population": {"type": "integer"},
                                              "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
            "required": ["city", "country", "population", "landmarks"], "additionalProperties": False}
    for name, path in models:
        s = Server(ckv, path, tmp, "--model-name", name, name=name)
        c = s.client()
        ask = [{"role": "user", "content": "Describe the city of Paris as JSON: its name, country, population, landmarks."}]
        r = c.chat.completions.create(model=name, messages=ask, max_tokens=160, temperature=0, response_format=fmt(city, True, "city"))
        txt, fin = r.choices[0].message.content, r.choices[0].finish_reason
        try:
            jsonschema.validate(json.loads(txt), city)
            ok = fin == "stop"
        except (ValueError, jsonschema.ValidationError):
            ok = False
        t.check(ok, f"{name}: a strict schema's answer validates and stops", f"{fin}: {txt!r}")
        r = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "Is Paris in France? Answer yes or no."}],
                                      max_tokens=8, temperature=0, extra_body={"grammar": 'root ::= "yes" | "no"'})
        t.check(r.choices[0].message.content in ("yes", "no") and r.choices[0].finish_reason == "stop",
                f"{name}: a grammar's answer matches", repr(r.choices[0].message.content))
        t.check(s.stop() == 0, f"{name}: SIGTERM: exit 0")


if real:
    model_cases()
else:
    fixture_cases()
t.finish()
