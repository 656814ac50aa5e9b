"""test_api_tools.py - tool calls through the openai client on the fixture model (tests/fixtures/models/
llama_gqa with the qwen2.5 template, whose tools block and <tool_call> syntax the server renders and
parses; the random fixture weights never write a call by themselves, so the calls come from the
constrained decoder): tools reach the prompt (and still do with tool_choice "none"); "required" and a
named function force a call that comes back as message.tool_calls with finish_reason "tool_calls" and
content null, and as OpenAI's deltas when streaming (first delta: index, id, type, name; then argument
fragments that concatenate to the whole response's arguments); parallel_tool_calls false keeps one
call; a history with an assistant tool_calls message (content null) and tool results is accepted;
"auto" answers text when the model writes no call; every bad tools / tool_choice / message field is a
400 naming it; a template without tools refuses them naming "tools".
usage: test_api_tools.py CKV_BINARY FIXTURES_DIR TMP_DIR"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Checks, Server, preamble  # noqa: E402

ckv, fixtures, tmp, FIXTURE = preamble()
import openai  # noqa: E402

t = Checks()
s = Server(ckv, FIXTURE, tmp, "--model-name", "llama_gqa", "--max-tokens-limit", "256", "--template", "qwen2.5", name="tools")
c = s.client()
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# '}' at +100: the forced arguments close at once ({}), so the call completes within a few tokens
_, _, raw = s.request("POST", "/tokenize", {"prompt": "}", "add_special_tokens": False})
CLOSE = {str(json.loads(raw)["tokens"][-1]): 100}


def chat(**kw):
    args = {"model": "llama_gqa", "messages": ASK, "max_tokens": 120, "temperature": 0}  # the fixture's 500 tokens are short
    args.update(kw)
    return c.chat.completions.create(**args)


def err400(param, **kw):
    try:
        chat(**kw)
    except openai.BadRequestError as e:
        got = (e.body or {}).get("param") if isinstance(e.body, dict) else None
        return t.check(got == param, f"400 naming {param}", f"param {got}: {e}")
    return t.check(False, f"400 naming {param}", "answered 200")


# tools reach the prompt, with "none" too (the model sees them, answers text)
plain = chat(max_tokens=1)
with_tools = chat(max_tokens=1, tools=[WEATHER])
none = chat(max_tokens=4, tools=[WEATHER], tool_choice="none")
t.check(with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 50, "tools are rendered into the prompt",
        f"{plain.usage.prompt_tokens} -> {with_tools.usage.prompt_tokens}")
t.check(none.usage.prompt_tokens == with_tools.usage.prompt_tokens and none.choices[0].message.tool_calls is None and
        none.choices[0].finish_reason != "tool_calls", "tool_choice none: tools rendered, the answer is text")

# required: a forced call, parsed
r = chat(tools=[WEATHER, TIME], tool_choice="required", logit_bias=CLOSE, parallel_tool_calls=False)
m = r.choices[0].message
t.check(r.choices[0].finish_reason == "tool_calls" and m.content is None and m.tool_calls and len(m.tool_calls) == 1,
        "required: one call, finish_reason tool_calls, content null", str(r.choices[0]))
if m.tool_calls:
    tc = m.tool_calls[0]
    t.check(tc.type == "function" and tc.id.startswith("call_") and tc.function.name in ("get_weather", "get_time") and
            tc.function.arguments == "{}", "required: a call of one of the tools with JSON arguments", str(tc))
# a named function, no bias: the name is forced and the arguments are a JSON object (or its beginning if cut)
r = chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=60)
tc = (r.choices[0].message.tool_calls or [None])[0]
t.check(tc is not None and tc.function.name == "get_time" and tc.function.arguments.startswith("{") and
        r.choices[0].finish_reason in ("tool_calls", "length"), "named function: that function is called", str(r.choices[0]))
# parallel calls off: one call at most; on: every call is of a listed tool
for par in (False, True):
    r = chat(tools=[WEATHER, TIME], tool_choice="required", logit_bias=CLOSE, parallel_tool_calls=par, max_tokens=200)
    calls = r.choices[0].message.tool_calls or []
    t.check(len(calls) >= 1 and (par or len(calls) == 1) and all(x.function.name in ("get_weather", "get_time") for x in calls),
            f"parallel_tool_calls {par}: {len(calls)} call(s)")

# streaming: OpenAI's deltas, concatenating to the whole response
whole = chat(tools=[WEATHER], tool_choice="required", max_tokens=60, seed=1)
stream = chat(tools=[WEATHER], tool_choice="required", max_tokens=60, seed=1, stream=True)
first, args, fin, content = None, "", None, ""
for ch in stream:
    d = ch.choices[0].delta
    content += d.content or ""
    for x in d.tool_calls or []:
        if first is None:
            first = x
        else:
            t.check(x.id is None and x.index == 0, "later deltas carry only index and arguments", str(x)) if x.id else None
        args += x.function.arguments or ""
    fin = ch.choices[0].finish_reason or fin
wc = (whole.choices[0].message.tool_calls or [None])[0]
t.check(first is not None and first.index == 0 and first.id and first.id.startswith("call_") and first.type == "function" and
        first.function.name == "get_weather", "stream: the first delta has index, id, type and name", str(first))
t.check(wc is not None and args == wc.function.arguments and fin == whole.choices[0].finish_reason and content == "",
        "stream: argument fragments concatenate to the whole response's arguments", f"{args!r} vs {wc and wc.function.arguments!r}")

# a history with tool calls (content null) and tool results
hist = ASK + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]
r = chat(messages=hist, tools=[WEATHER], max_tokens=4)
t.check(r.choices[0].finish_reason in ("stop", "length", "tool_calls") and r.usage.prompt_tokens > with_tools.usage.prompt_tokens,
        "a history with tool_calls and tool results is rendered")
# auto: the fixture writes no call, so the answer is text
r = chat(tools=[WEATHER], tool_choice="auto", max_tokens=8)
t.check(r.choices[0].message.tool_calls is None and isinstance(r.choices[0].message.content, str) and
        r.choices[0].finish_reason in ("stop", "length"), "auto without a call in the answer: text")

# bad fields: 400 naming them
err400("tools[0].function.name", tools=[{"type": "function", "function": {"name": "bad name"}}])
err400("tools[0].type", tools=[{"type": "code", "function": {"name": "f"}}])
err400("tools[1].function.name", tools=[WEATHER, WEATHER])
err400("tools", tools={"a": 1})
err400("tool_choice", tools=[WEATHER], tool_choice="sometimes")
err400("tool_choice", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nosuch"}})
err400("tool_choice", tool_choice="required")
err400("parallel_tool_calls", tools=[WEATHER], parallel_tool_calls="yes")
err400("functions", functions=[{"name": "f"}])
err400("tool_choice", tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
err400("messages[1].tool_call_id", messages=ASK + [{"role": "tool", "content": "x"}], tools=[WEATHER])
err400("messages[0].tool_calls", messages=[{"role": "user", "content": "x", "tool_calls": []}], tools=[WEATHER])
err400("messages[1].tool_calls[0]", messages=ASK + [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}])
s.stop()

# a template without tools (chatml) refuses them
s2 = Server(ckv, FIXTURE, tmp, "--model-name", "llama_gqa", "--template", "chatml", name="notools")
c = s2.client()
err400("tools", tools=[WEATHER])
try:
    chat(messages=hist)
    t.check(False, "chatml: a tool history is refused")
except openai.BadRequestError as e:
    t.check("tool" in str(e), "chatml: a tool history is refused naming tools", str(e))
s2.stop()
t.finish()
