#!/usr/bin/env python3
"""Renders a real chat template through libspark and through transformers' jinja2 environment, and
says where they differ.

Model publishers' templates cannot be copied into the repository, so the CPU suite tests the Jinja
constructs they use (tests/data/tokenizers/jinja_golden.jsonl); this script checks a template file you
have (a model's chat_template.jinja or tokenizer_config.json) end to end, over conversations that
reach every branch a chat/agent host uses: system prompt or none, a model identity passed as an extra
variable, multi-turn, reasoning given as `reasoning_content` or as <think> in the content (kept only
after the last user turn), tools, parallel tool calls with dict arguments, consecutive tool
responses, a tool response without a call (the template's raise_exception), and non-ASCII text.
Both sides fail or both render byte-identical text, or the case is reported.

Needs transformers (its jinja2 environment is the reference) and a built libspark.so:
    python dev/chat_templates/compare_with_jinja2.py MODEL_DIR/chat_template.jinja build/src/libspark.so
Exit status: 0 when every case agrees, 1 otherwise.
"""
import ctypes
import json
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template


class ChatMessage(ctypes.Structure):  # spark_chat_message (include/spark/spark.h)
    _fields_ = [(name, ctypes.c_char_p) for name in ("role", "content", "reasoning_content", "tool_calls_json", "name")]


def load_template(path):
    text = open(path, encoding="utf-8").read()
    if path.endswith(".json"):
        template = json.loads(text)["chat_template"]
        return template if isinstance(template, str) else template[0]["template"]
    return text


def spark_render(lib, template, messages, tools, add_generation_prompt, extra):
    def utf8(s):
        return None if s is None else s.encode()

    array = (ChatMessage * max(1, len(messages)))()
    for i, m in enumerate(messages):
        array[i] = ChatMessage(utf8(m["role"]), utf8(m.get("content")), utf8(m.get("reasoning_content")),
                               utf8(json.dumps(m["tool_calls"]) if "tool_calls" in m else None), utf8(m.get("name")))
    args = (template.encode(), array, len(messages), add_generation_prompt,
            utf8(None if tools is None else json.dumps(tools)), utf8(None if extra is None else json.dumps(extra)), None, None)
    length = ctypes.c_size_t(0)
    lib.spark_chat_apply_template(*args, None, 0, ctypes.byref(length))  # asks for the size
    buf = ctypes.create_string_buffer(length.value + 1)
    status = lib.spark_chat_apply_template(*args, ctypes.cast(buf, ctypes.c_char_p), len(buf), ctypes.byref(length))
    if status != 0:
        return "error", lib.spark_last_error().decode()
    return "ok", buf.raw[:length.value].decode()


def reference_render(template, messages, tools, add_generation_prompt, extra):
    try:
        return "ok", _compile_jinja_template(template).render(messages=messages, tools=tools,
                                                             add_generation_prompt=add_generation_prompt, **(extra or {}))
    except Exception as e:
        return "error", f"{type(e).__name__}: {e}"


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                      "parameters": {"type": "object", "required": ["city"],
                                                     "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "search", "description": "Web search, \"quoted\", café",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
]
CALL = {"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "opts": {"unit": "C", "x": [1, 2.5, None, True]}}}}
CALL2 = {"id": "c2", "type": "function", "function": {"name": "search", "arguments": {"q": "weather Paris"}}}
USER = {"role": "user", "content": "Hi"}

# (messages, tools, add_generation_prompt, extra variables)
CASES = [
    ([USER], None, True, None),
    ([USER], None, False, None),
    ([{"role": "system", "content": "Be brief."}, USER], None, True, None),
    ([USER], None, True, {"model_identity": "You are a test model."}),
    ([USER], None, True, {"enable_thinking": False}),
    ([USER, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "How are you?"}], None, True, None),
    ([USER, {"role": "assistant", "content": "<think>\nthe user greets\n</think>\n\nHello!"}], None, False, None),
    ([USER, {"role": "assistant", "content": "<think>\nold\n</think>\n\nHello!"}, {"role": "user", "content": "again"}], None, True, None),
    ([USER, {"role": "assistant", "content": "Hello!", "reasoning_content": "a greeting"}], None, False, None),
    ([{"role": "system", "content": "sys"}, {"role": "user", "content": "Weather in Paris?"}], TOOLS, True, None),
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "reasoning_content": "needs the tools", "tool_calls": [CALL, CALL2]},
      {"role": "tool", "content": "{\"temp\": 21}", "name": "get_weather"},
      {"role": "tool", "content": "sunny", "name": "search"}], TOOLS, True, None),
    ([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "content": "21C"}, {"role": "assistant", "content": "It is 21C."},
      {"role": "user", "content": "thanks"}], TOOLS, True, None),
    ([USER, {"role": "tool", "content": "a response nobody asked for"}], None, True, None),
    ([], None, True, None),
    ([{"role": "user", "content": "unicode ✓ 中文 🚀 \\ \" ' <tag> {{ not jinja }}"}], None, True, None),
]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    template = load_template(sys.argv[1])
    lib = ctypes.CDLL(sys.argv[2])
    lib.spark_chat_apply_template.restype = ctypes.c_int
    lib.spark_chat_apply_template.argtypes = [ctypes.c_char_p, ctypes.POINTER(ChatMessage), ctypes.c_size_t, ctypes.c_bool,
                                              ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                              ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    lib.spark_last_error.restype = ctypes.c_char_p
    lib.spark_last_error.argtypes = []
    different = 0
    for i, (messages, tools, agp, extra) in enumerate(CASES):
        want = reference_render(template, messages, tools, agp, extra)
        got = spark_render(lib, template, messages, tools, agp, extra)
        agree = want == got or want[0] == got[0] == "error"
        print(f"case {i:2d}: {'agrees' if agree else 'DIFFERS'} ({want[0]})" + (f": {got[1][:120]}" if got[0] == "error" else ""))
        if not agree:
            different += 1
            print(f"   jinja2: {want[1]!r}\n   spark:  {got[1]!r}")
    print(f"{len(CASES) - different} of {len(CASES)} cases agree")
    return 0 if different == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
