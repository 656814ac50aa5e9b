"""test_api_tools_qwen.py - tool calls on Qwen2.5-Coder-0.5B-Instruct (models/, GGUF; label slow),
through the official openai client, with the model's own chat template (read from the GGUF):
a weather-style request with tool_choice "required" comes back as a parsed call of get_weather whose
arguments are a JSON object naming the city; with "auto" the test reports what the model does (a
parsed call or text) and checks that the response is well formed; the same request streamed gives the
same call; a tool result in the history is answered with text.
usage: test_api_tools_qwen.py CKV_BINARY FIXTURES_DIR TMP_DIR"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import QWEN_CODER, Checks, Server, skip, preamble  # noqa: E402

ckv, fixtures, tmp, _ = preamble()
if not os.path.exists(QWEN_CODER):
    skip(f"{QWEN_CODER} is not present (tools/models/)")
t = Checks()
s = Server(ckv, QWEN_CODER, tmp, "--model-name", "qwen-coder", name="qwen_tools")
c = s.client()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a given city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What's the weather like in Paris today?"}]


def ask(**kw):
    args = {"model": "qwen-coder", "messages": ASK, "tools": [WEATHER], "max_tokens": 96, "temperature": 0}
    args.update(kw)
    return c.chat.completions.create(**args)


def parsed(call):
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return None


r = ask(tool_choice="required")
m, fin = r.choices[0].message, r.choices[0].finish_reason
call = (m.tool_calls or [None])[0]
args = parsed(call) if call else None
print(f"required: finish_reason {fin}, content {m.content!r}, calls {[(x.function.name, x.function.arguments) for x in m.tool_calls or []]}")
t.check(fin == "tool_calls" and call is not None and call.function.name == "get_weather" and isinstance(args, dict) and
        "paris" in json.dumps(args).lower(), "required: a parsed get_weather call naming Paris", str(r.choices[0]))

# the README's round trip: the client's own message object back in the history, then the result
if call is not None:
    back = ASK + [m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "{\"temperature\": 21}"}]
    rt = ask(messages=back, tool_choice="none")
    print(f"round trip: {rt.choices[0].message.content!r}")
    t.check(isinstance(rt.choices[0].message.content, str) and rt.choices[0].finish_reason in ("stop", "length"),
            "the client's assistant message (model_dump) and a tool result are accepted back")

r = ask(tool_choice="auto")
m, fin = r.choices[0].message, r.choices[0].finish_reason
print(f"auto: finish_reason {fin}, content {m.content!r}, calls {[(x.function.name, x.function.arguments) for x in m.tool_calls or []]}")
if m.tool_calls:
    t.check(fin == "tool_calls" and all(isinstance(parsed(x), dict) for x in m.tool_calls), "auto: the model called a tool (parsed)")
else:
    t.check(fin in ("stop", "length") and isinstance(m.content, str) and "<tool_call>" not in m.content,
            "auto: the model answered text (no unparsed call in it)", repr(m.content))
auto_calls = [(x.function.name, x.function.arguments) for x in m.tool_calls or []]

# streamed: the same answer as deltas
names, frags, content, sfin = {}, {}, "", None
for ev in ask(tool_choice="auto", stream=True):
    d = ev.choices[0].delta
    content += d.content or ""
    for x in d.tool_calls or []:
        if x.function and x.function.name:
            names[x.index] = x.function.name
        frags[x.index] = frags.get(x.index, "") + (x.function.arguments or "" if x.function else "")
    sfin = ev.choices[0].finish_reason or sfin
streamed = [(names[i], frags[i]) for i in sorted(names)]
t.check(streamed == auto_calls and sfin == fin, "auto streamed: the same calls as the whole response", f"{streamed} vs {auto_calls}")

# the tool's result in the history: the model answers with text
hist = ASK + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21, \"unit\": \"celsius\", \"sky\": \"sunny\"}"}]
r = ask(messages=hist, tool_choice="auto")
m = r.choices[0].message
print(f"after the tool result: {m.content!r}")
t.check(isinstance(m.content, str) and "21" in m.content, "a tool result in the history is used in the answer", repr(m.content))
s.stop()
t.finish()
