"""chat_tools_reference.py - the reference renderings of conversations with tools, tool calls and
tool results through a model's own Jinja chat template, by transformers' render_jinja_template (the
code apply_chat_template runs), for test_chat_tools (tests/unit/test_chat_tools.c).

Writes a JSON list of cases {"name", "tools", "messages", "text"}; "messages" is what an OpenAI client
sends (tool-call arguments as JSON strings); the template is given them as an OpenAI-compatible server
passes them on (arguments parsed into objects). Run offline with a Python that has transformers and
jinja2; the output is committed.
usage: chat_tools_reference.py TEMPLATE.jinja OUT.json"""
import copy
import json
import sys

from transformers.utils.chat_template_utils import render_jinja_template

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city (°C, \"quoted\")",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                                    "scale": {"type": "number", "default": 0.5}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def call(i, name, args):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


CASES = [
    ("tools_default_system", [WEATHER], [{"role": "user", "content": "Weather in Paris?"}]),
    ("tools_own_system", [WEATHER, TIME], [{"role": "system", "content": "You are terse."},
                                           {"role": "user", "content": "Weather in Paris and the time?"}]),
    ("tool_round_trip", [WEATHER, TIME], [
        {"role": "user", "content": "Weather in Paris and the time?"},
        {"role": "assistant", "content": None, "tool_calls": [call(1, "get_weather", {"city": "Paris", "days": 2}),
                                                              call(2, "get_time", {})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
        {"role": "assistant", "content": "21 °C at noon."},
        {"role": "user", "content": "Thanks"}]),
    ("call_with_text_no_tools", None, [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call(3, "get_weather", {"city": "Zürich\n"})]},
        {"role": "tool", "tool_call_id": "call_3", "content": "sunny"}]),
]


def for_template(messages):
    """The messages as the template sees them: tool-call arguments parsed from their JSON text."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def main():
    template = open(sys.argv[1]).read()
    cases = []
    for name, tools, messages in CASES:
        text = render_jinja_template(conversations=[for_template(messages)], tools=tools, chat_template=template,
                                     add_generation_prompt=True)
        text = text[0][0] if isinstance(text, tuple) else text
        if isinstance(text, list):
            text = text[0]
        cases.append({"name": name, "tools": tools, "messages": messages, "text": text})
    with open(sys.argv[2], "w") as f:
        json.dump(cases, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
