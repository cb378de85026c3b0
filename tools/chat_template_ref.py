#!/usr/bin/env python3
"""Expected outputs for the chat-template corpus (tests/data/chat_templates).

Renders every *.jinja there with every case below the way transformers'
apply_chat_template renders it -- ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True) with the loopcontrols extension, transformers' tojson filter,
raise_exception, strftime_now (here at a fixed time, UTC), tools=None, documents=None,
bos_token/eos_token, and continue_final_message's cut -- and writes expected.json beside
them. tests/unit/test_jinja.c renders the same in C and compares byte for byte.

Needs python3 and jinja2 (pip install jinja2); CI does not run it, only the stored output.
Usage: python3 tools/chat_template_ref.py [TEMPLATE_DIR]
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = 1721995200  # 2024-07-26 12:00:00 UTC
BOS, EOS = "<BOS>", "<EOS>"

U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
S = lambda c: {"role": "system", "content": c}  # noqa: E731

CASES = [
    ("user", [U("Hello!")], True, False),
    ("system_user", [S("You are terse."), U("What is 2+2?")], True, False),
    ("multi_turn", [S("Be brief. "), U("\n Hi there"), A("Hello! How can I help?"),
                    U("Tell me a joke.")], True, False),
    ("multi_turn_nosys", [U("Hi"), A("Hello."), U("Bye")], True, False),
    ("no_gen_prompt", [U("Hi"), A("Hello.")], False, False),
    ("assistant_prefix", [U("Name a colour."), A("The colour is")], False, True),
    ("assistant_prefix_ws", [S("Be brief."), U("Name a colour."), A(" The colour is ")], False,
     True),
    ("unicode", [U("  Grüße, 世界! 😀\ttabs\r\n and \"quotes\" 'single' \\ back  ")], True,
     False),
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]
TOOL_MSGS = [S("Use tools when needed."), U("Weather in Paris?"),
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "abc123XYZ", "type": "function", "function": {
                     "name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
             {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather",
              "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
             A("It is 21.5 degrees and clear."), U("Thanks!")]
# A turn that ends with a tool's result (the prompt of the next call's answer), the call
# beside text (GPT-OSS keeps it as reasoning while no final answer follows).
TOOL_TURN_MSGS = [U("Weather in Paris?"),
                  {"role": "assistant", "content": "Need the weather.", "tool_calls": [
                      {"id": "c1", "type": "function", "function": {
                          "name": "get_weather", "arguments": {"city": "Paris"}}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 °C"}]
KWARGS = {"enable_thinking": False, "reasoning_effort": "high", "date_string": "01 Jan 2025",
          "builtin_tools": ["browser", "code_interpreter"], "model_identity": "You are Tess.",
          "functions": '[{"name": "get_weather", "parameters": {"city": "string"}}]',
          "datetime": "2024-07-26"}
THINK_MSGS = [S("Think first."), U("What is 6*7?"),
              A("<think>\nsix times seven\n</think>\n\n42"), U("And 7*8?")]
# (name, messages, add_generation_prompt, continue_final, tools, extra template variables)
CASES = [c + (None, {}) for c in CASES] + [
    ("tools", TOOL_MSGS, True, False, TOOLS, {}),
    ("tool_turn", TOOL_TURN_MSGS, True, False, TOOLS, {}),
    ("kwargs", THINK_MSGS, True, False, None, KWARGS),
]


class AssistantTracker(Extension):
    # transformers' {% generation %} ... {% endgeneration %}: renders its body as is.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(
            lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker,
                                                    jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(tpl, messages, add_gen, cont, tools, extra):
    out = tpl.render(messages=messages, tools=tools, documents=None,
                     add_generation_prompt=add_gen, bos_token=BOS, eos_token=EOS, **extra)
    if cont:  # transformers' continue_final_message
        final = messages[-1]["content"]
        if final.strip() not in out:
            raise ValueError("the final message does not appear in the rendered chat")
        loc = out.rindex(final.strip())
        if out[loc:loc + len(final.lstrip())] == final:
            out = out[:loc + len(final.lstrip())]
        else:
            out = out[:loc + len(final.strip())]
    return out


# The context of snippets.txt: small templates, one construct or two each, separated by
# lines "====", rendered with this context only.
SNIPPET_CTX = {
    "messages": [{"role": "system", "content": " Sys "}, {"role": "user", "content": "Hi\nthere"},
                 {"role": "assistant", "content": "Yo", "tool_calls": [{"function": {
                     "name": "f", "arguments": {"b": 2, "a": [1, 2.5, None, True]}}}]}],
    "d": {"b": 1, "A": 2, "a": 3}, "xs": [3, 1, 2], "s": "Hello World", "n": None, "f": 2.5,
    "i": -7, "u": "h\u00e9llo w\u00f6rld", "e": "", "l": [], "strs": ["b", "A", "a"]}


def snippets(env, d):
    path = os.path.join(d, "snippets.txt")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", newline="") as f:
        texts = f.read().split("\n====\n")
    out = []
    for t in texts:
        r = {"template": t}
        try:
            r["output"] = env.from_string(t).render(**SNIPPET_CTX)
        except Exception as e:
            r["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        out.append(r)
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests/data/chat_templates")
    env = make_env()
    results = []
    for name in sorted(os.listdir(d)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(d, name), encoding="utf-8", newline="") as f:
            src = f.read()
        try:
            tpl = env.from_string(src)
        except jinja2.TemplateError as e:
            results.append({"template": name, "compile_error": str(e)})
            continue
        for cname, msgs, add_gen, cont, tools, extra in CASES:
            r = {"template": name, "case": cname}
            try:
                r["output"] = render(tpl, msgs, add_gen, cont, tools, extra)
            except Exception as e:  # the C side must refuse too
                r["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            results.append(r)
    cases = [{"name": c, "messages": m, "add_generation_prompt": g, "continue_final": k,
              "tools": t, "extra": x} for c, m, g, k, t, x in CASES]
    doc = {"generator": "tools/chat_template_ref.py", "jinja2": jinja2.__version__,
           "now": NOW, "bos_token": BOS, "eos_token": EOS, "cases": cases,
           "results": results, "snippet_context": SNIPPET_CTX, "snippets": snippets(env, d)}
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for r in results if "error" in r or "compile_error" in r)
    print("%d results (%d raise an error) -> %s" % (len(results), n_err,
                                                     os.path.join(d, "expected.json")))


if __name__ == "__main__":
    main()
