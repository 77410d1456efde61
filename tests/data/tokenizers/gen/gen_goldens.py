#!/usr/bin/env python3
"""Generates the extra tokenizer / chat-template / Jinja goldens in tests/data/tokenizers from the
Hugging Face reference implementations. Nothing here is hand-written expected output: every
"ids", "decoded" and "rendered" value comes from the libraries.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install tokenizers transformers jinja2
    /tmp/venv/bin/python tests/data/tokenizers/gen/gen_goldens.py

Versions used for the committed files: see VERSIONS below (printed into versions.txt).
"""
import copy
import json
import os
import sys

import jinja2
import tokenizers
import transformers
from tokenizers import Tokenizer
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)
VERSIONS = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__, "jinja2": jinja2.__version__,
            "python": sys.version.split()[0]}


def write_jsonl(name, rows):
    with open(os.path.join(DATA, name), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{name}: {len(rows)} lines")


TEXTS = [
    "Hello world", "  two leading spaces", "trailing spaces   ", "\t\ttabs\tinside\t", "a\u0085b next-line char",
    "line1\nline2\r\nline3\rline4", "\n\n\n", " \n \n ", "x" * 300, "abc" * 200, "😀" * 20,
    "emoji 😀😃😄 family 👨‍👩‍👧‍👦 flags 🇯🇵🇺🇸 skin 👋🏿", "zero\u200bwidth\u200djoiner", "ﬁ ligature and ｆｕｌｌｗｉｄｔｈ",
    "e\u0301 combining vs é precomposed", "Ω Ohm sign and Ω omega", "Å angstrom", "한국어 텍스트 처리", "中文标点：，。！？【】",
    "日本語とEnglishのmixed文章123", "Tiếng Việt có dấu", "ภาษาไทยไม่มีช่องว่าง", "עברית מימין לשמאל",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;", "<div class=\"x\">&amp; &lt;tag&gt;</div>",
    "{\"json\": [1, 2.5, -3e10, true, null], \"k\": \"v\"}", "path/to/file_name-v2.0.tar.gz", "user@example.com",
    "123456789012345678901234567890", "3.14159 2.71828 1e-10 0x1F 0b1010", "I'M YOU'RE HE'S THEY'LL WE'D", "it's 'quoted'",
    "   \t  \n", "\u3000ideographic space\u3000", "a  b   c    d", "!!!", "...", "—–-", "«guillemets» „quotes“",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "text<|endoftext|>more<|endoftext|>", "<|im_start|><|im_start|>", "<|im_end", "<|im_start|x", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "<think>\n\n</think>\n\n", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "a<|box_start|>b<|box_end|>c",
    "\x00\x01\x1f control chars", "\u00a0\u00a0nbsp", "tab\tthen\u00a0nbsp\u2003em",
]


def tokenizer_rows(tok, texts):
    rows = []
    for t in texts:
        for parse_special in (True, False):
            tok.encode_special_tokens = not parse_special
            ids = tok.encode(t, add_special_tokens=False).ids
            rows.append({"text": t, "parse_special": parse_special, "ids": ids,
                         "decoded": tok.decode(ids, skip_special_tokens=False),
                         "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    tok.encode_special_tokens = False
    return rows


def gen_tokenizer_goldens():
    qwen = Tokenizer.from_file(os.path.join(DATA, "qwen3/tokenizer.json"))
    write_jsonl("qwen3_extra_golden.jsonl", tokenizer_rows(qwen, TEXTS))
    demo = Tokenizer.from_file(os.path.join(DATA, "demo/tokenizer.json"))
    write_jsonl("demo_golden.jsonl", tokenizer_rows(demo, TEXTS))

    # Variants of the demo tokenizer that exercise options the shipped files do not use.
    base = json.load(open(os.path.join(DATA, "demo/tokenizer.json"), encoding="utf-8"))
    variant_texts = ["hello world foo", "a,b  c\n\nd", " leading", "x<|im_start|>y <|im_end|> z", "café CAFÉ",
                     "<mask> before", "word <mask>   after", "ABC abcABC ABC.", "end   of", "123 4567 89",
                     "  \t spaces \u0085 here  ", "hello" * 5, "thethe the"]
    variants = []

    # Each variant is a JSON Patch (RFC 6902) of the demo tokenizer.json; the test applies the same patch.
    def apply_patch(doc, ops):
        doc = copy.deepcopy(doc)
        for op in ops:
            parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
            parent = doc
            for key in parts[:-1]:
                parent = parent[int(key)] if isinstance(parent, list) else parent[key]
            last = parts[-1]
            if isinstance(parent, list):
                if op["op"] == "add":
                    parent.insert(len(parent) if last == "-" else int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = op["value"]
        return doc

    def add(name, ops, texts=variant_texts):
        tok = Tokenizer.from_str(json.dumps(apply_patch(base, ops)))
        cases = []
        for t in texts:
            for parse_special in (True, False):
                tok.encode_special_tokens = not parse_special
                ids = tok.encode(t, add_special_tokens=False).ids
                cases.append({"text": t, "parse_special": parse_special, "ids": ids,
                              "decoded": tok.decode(ids, skip_special_tokens=False)})
        variants.append({"variant": name, "patch": ops, "cases": cases})

    def added(content, lstrip, rstrip, single_word, normalized, special, file_id):
        return {"op": "add", "path": "/added_tokens/-",
                "value": {"id": file_id, "content": content, "single_word": single_word, "lstrip": lstrip,
                          "rstrip": rstrip, "normalized": normalized, "special": special}}

    def split(behavior, invert):
        return [{"op": "add", "path": "/pre_tokenizer/pretokenizers/0",
                 "value": {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": behavior, "invert": invert}}]

    add("add_prefix_space", [{"op": "replace", "path": "/pre_tokenizer/pretokenizers/1/add_prefix_space", "value": True}])
    add("bytelevel_gpt2_regex", [{"op": "replace", "path": "/pre_tokenizer", "value": {
        "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}}])
    add("bytelevel_gpt2_regex_prefix", [{"op": "replace", "path": "/pre_tokenizer", "value": {
        "type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}])
    # The ids written in the file are not what HF uses ("end" is already in the vocabulary).
    add("added_token_flags", [added("<mask>", True, True, False, False, True, 8192),
                              added("ABC", False, False, True, False, False, 8193),
                              added("end", False, True, False, False, False, 8194),
                              added("café", False, False, False, True, False, 8195)])
    add("ignore_merges", [{"op": "replace", "path": "/model/ignore_merges", "value": True}])
    add("string_merges", [{"op": "replace", "path": "/model/merges", "value": [" ".join(m) for m in base["model"]["merges"]]}])
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in (False, True):
            add(f"split_{behavior}_{invert}", split(behavior, invert))
    add("digits", [{"op": "add", "path": "/pre_tokenizer/pretokenizers/0", "value": {"type": "Digits", "individual_digits": True}}])
    add("split_string_pattern", [{"op": "add", "path": "/pre_tokenizer/pretokenizers/0", "value": {
        "type": "Split", "pattern": {"String": "the"}, "behavior": "Isolated", "invert": False}}])
    add("no_decoder", [{"op": "replace", "path": "/decoder", "value": None}])
    add("nfkc_lowercase", [{"op": "replace", "path": "/normalizer", "value": {
        "type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}}])
    # The pre-tokenizer of the GPT-4o (o200k) family, which MiniMax-M2 / M2.5's tokenizer.json uses: case-
    # aware word pieces with contractions folded in, digits in groups of up to three, punctuation runs
    # that keep trailing newlines and slashes; with MiniMax's role markers as special added tokens.
    o200k = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    add("o200k_regex_minimax_markers",
        [{"op": "replace", "path": "/pre_tokenizer/pretokenizers/0/pattern", "value": {"Regex": o200k}},
         added("]~!b[", False, False, False, False, True, 8192), added("]~b]", False, False, False, False, True, 8193),
         added("[e~[", False, False, False, False, True, 8194), added("<minimax:tool_call>", False, False, False, False, True, 8195)],
        variant_texts + ["HelloWorld CamelCase XMLHttpRequest iPhone McDONALD'S don't DON'T We'RE",
                         "1234567 v2.0.10 3.14159 x=12345", "path/to/file.cpp// end\n\n  next//\n",
                         "e\u0301t\u00e9 \u00c9COLE na\u00efve \u4e2d\u6587\u5b57 \u0928\u092e\u0938\u094d\u0924\u0947 \U0001f680!!",
                         "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\nHi[e~[\n]~b]ai\n<think>\n",
                         "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"])
    write_jsonl("variant_golden.jsonl", variants)


# ---------------------------------------------------------------------------------------------
# Chat templates (transformers.apply_chat_template on the Qwen3 tokenizer)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city. Use “celsius”.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "City name, e.g. Zürich"},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web <b>&</b>",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"},
                                                                                      "limit": {"type": "integer", "default": 5}}}}},
]

CHATS = [
    {"messages": [{"role": "user", "content": "What's the weather in Paris?"}], "tools": TOOLS, "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Weather?"}],
     "tools": TOOLS, "add_generation_prompt": True},
    {"messages": [
        {"role": "user", "content": "What's the weather in Paris and Tokyo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Tokyo\"}"}}]},
        {"role": "tool", "name": "get_weather", "content": "{\"temp\": 18}"},
        {"role": "tool", "name": "get_weather", "content": "{\"temp\": 25}"},
    ], "tools": TOOLS, "add_generation_prompt": True},
    {"messages": [
        {"role": "user", "content": "Look this up."},
        {"role": "assistant", "content": "Let me search.", "reasoning_content": "The user wants a search.",
         "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"q": "spark runtime", "limit": 3}}}]},
        {"role": "tool", "content": "result 1\nresult 2"},
        {"role": "assistant", "content": "Found two results.", "reasoning_content": "Summarize them."},
        {"role": "user", "content": "Thanks! Now in Japanese: 日本語で"},
    ], "tools": TOOLS, "add_generation_prompt": True},
    {"messages": [
        {"role": "user", "content": "Multi-step"},
        {"role": "assistant", "content": "<think>\nstep one\n</think>\n\nCalling.", "tool_calls": [
            {"name": "search", "arguments": {"q": "a"}}]},
        {"role": "tool", "content": "A"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "search", "arguments": {"q": "b"}}]},
        {"role": "tool", "content": "B"},
    ], "tools": TOOLS, "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Hi"}], "extra": {"enable_thinking": False}, "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Hi"}], "extra": {"enable_thinking": True}, "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello"},
                  {"role": "user", "content": "Again"}, {"role": "assistant", "content": "<think>x</think>Sure"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "u1"},
                  {"role": "system", "content": "mid-conversation system"}, {"role": "user", "content": "u2"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "<tool_response>\nnot a real tool response\n</tool_response>"},
                  {"role": "assistant", "content": "ok"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "emoji 😀 and \"quotes\" and \\backslash"}], "tools": [
        {"type": "function", "function": {"name": "echo", "description": "Echo “unicode” 😀 \n newline",
                                          "parameters": {"type": "object", "properties": {}}}}], "add_generation_prompt": True},
]


def gen_chat_goldens():
    tok = AutoTokenizer.from_pretrained(os.path.join(DATA, "qwen3"))
    rows = []
    for chat in CHATS:
        kwargs = dict(chat.get("extra") or {})
        rendered = tok.apply_chat_template(chat["messages"], tools=chat.get("tools"), tokenize=False,
                                           add_generation_prompt=chat["add_generation_prompt"], **kwargs)
        rows.append({"messages": chat["messages"], "tools": chat.get("tools"), "extra": chat.get("extra"),
                     "add_generation_prompt": chat["add_generation_prompt"], "rendered": rendered})
    write_jsonl("qwen3_chat_tools_golden.jsonl", rows)


# ---------------------------------------------------------------------------------------------
# Jinja conformance: small templates rendered by transformers' compiled jinja2 environment.

JINJA_CASES = [
    ("{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 10 / 4 }} {{ 2 ** 10 }} {{ 1.5 * 2 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true ~ undefined_thing }}", {}),
    ("{{ none }}|{{ true }}|{{ [1, 'a', none, 1.0, {'k': 'v'}] }}|{{ ('x',) }}|{{ {'a': [1, 2]} }}", {}),
    ("{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }} {{ 2.5e-7 }} {{ 100.0 }} {{ -0.5 }}", {}),
    ("{% for x in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}",
     {"items": ["a", "b", "c"]}),
    ("{% for x in items if x > 1 %}{{ x }}{{ loop.length }}{% else %}empty{% endfor %}", {"items": [1, 2, 3]}),
    ("{% for x in items %}{{ x }}{% else %}empty{% endfor %}", {"items": []}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for x in [1,2,3,4,5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}[{{ x }}]", {}),
    ("{% set x = 5 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}[{{ x }}]", {}),
    ("{% if true %}{% set y = 3 %}{% endif %}{{ y }}", {}),
    ("{% set ns = namespace(n=0, s='') %}{% for i in range(5) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }}", {}),
    ("{{ 'abc'[::-1] }} {{ [1,2,3,4][1:3] }} {{ [1,2,3,4][::2] }} {{ 'héllo'[1] }} {{ 'héllo'[-1] }} {{ [1,2,3][-1] }} {{ 'abcdef'[-3:] }} {{ [1,2,3][5:] }}", {}),
    ("{{ x is defined }} {{ y is defined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is lower }} {{ 'A' is upper }} {{ u is undefined }}",
     {"x": 1}),
    ("{{ 1 is sameas 1 }} {{ none is sameas none }} {{ x is not none }} {{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1,2] }} {{ true is true }} {{ 0 is false }}", {"x": 0}),
    ("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }}", {}),
    ("{{ a and b }}|{{ a or b }}|{{ c or 'default' }}|{{ not a }}|{{ a and not b }}", {"a": "x", "b": "", "c": None}),
    ("{{ 'yes' if x else 'no' }} {{ 'yes' if y }}|", {"x": 1, "y": 0}),
    ("{{ x | tojson }}", {"x": {"b": 1, "a": [1, 2.5, "é\"\\\n\t<>&'", None, True], "c": {}, "d": []}}),
    ("{{ x | tojson(indent=2) }}", {"x": {"b": 1, "a": [1, {"z": None}], "e": [], "f": {}}}),
    ("{{ x | tojson(ensure_ascii=True) }}|{{ x | tojson(sort_keys=true) }}|{{ x | tojson(separators=(',', ':')) }}",
     {"x": {"z": "日本😀", "a": 1}}),
    ("{{ x | tojson(indent=4, sort_keys=True) }}", {"x": {"b": [1, [2, {"c": 3}]], "a": "s"}}),
    ("{{ 'Hello World' | upper }} {{ 'Hello World' | lower }} {{ 'hello world-foo' | title }} {{ 'hello WORLD' | capitalize }} {{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}", {}),
    ("{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ items | sort(attribute='n') | map(attribute='n') | list }}",
     {"items": [{"n": 2}, {"n": 1}, {"n": 3}]}),
    ("{{ [1, 2, 3] | join(', ') }} {{ items | map(attribute='name') | join('/') }} {{ [1,2,3] | first }} {{ [1,2,3] | last }} {{ 'abc' | length }} {{ {'a':1} | length }} {{ [1,2] | count }}",
     {"items": [{"name": "a"}, {"name": "b"}]}),
    ("{{ items | selectattr('on') | map(attribute='n') | list }} {{ items | rejectattr('on') | map(attribute='n') | list }} {{ items | selectattr('n', 'equalto', 2) | list | length }} {{ [1,2,3,4] | select('odd') | list }} {{ [1,2,3,4] | reject('even') | list }}",
     {"items": [{"n": 1, "on": True}, {"n": 2, "on": False}, {"n": 3, "on": True}]}),
    ("{{ x | default('dflt') }} {{ y | default('dflt') }} {{ z | default('dflt', true) }} {{ z | d('d2') }}", {"y": "set", "z": ""}),
    ("{{ '3' | int + 1 }} {{ '3.7' | float }} {{ 3.7 | int }} {{ 'x' | int }} {{ 42 | string ~ '!' }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ [1, 2, 3] | sum }} {{ [3, 1, 2] | max }} {{ [3, 1, 2] | min }}", {}),
    ("{{ {'b': 2, 'a': 1} | items | list }} {{ {'b': 2, 'a': 1} | dictsort }} {{ [1, 1, 2, 'a', 'A'] | unique | list }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} {{ 'a b  c' | wordcount }}", {}),
    ("{{ 'a-b-c'.split('-') }} {{ ' a  b '.split() }} {{ 'a-b-c'.split('-', 1) }} {{ 'a-b-c'.rsplit('-', 1) }} {{ '  x  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}", {}),
    ("{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('lo', 'x')) }} {{ 'hello'.replace('l', 'L') }} {{ 'hello'.replace('l', 'L', 1) }} {{ 'hello'.upper() }} {{ 'HeLLo'.lower() }} {{ 'hello world'.title() }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ ', '.join(['a', 'b']) }}", {}),
    ("{{ '{} and {}'.format('a', 'b') }} {{ '{0}{0}'.format('x') }} {{ '{name}!'.format(name='n') }} {{ '%s=%d' % ('a', 3) }} {{ '%05.2f' | format(3.14159) }}", {}),
    ("{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.keys() | list }} {{ d.values() | list }} {{ d['a'] }} {{ d.a }} {{ d.missing }}|{{ d['missing'] }}|", {"d": {"a": 1, "b": 2}}),
    ("{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }}", {}),
    ("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner{% endcall %}", {}),
    ("{% set greeting %}Hi {{ name }}{% endset %}[{{ greeting }}]{% set shout | upper %}quiet{% endset %}{{ shout }}", {"name": "Bob"}),
    ("{% filter upper %}make me loud{% endfilter %}", {}),
    ("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
    ("{# comment #}A{#- stripped -#}  B  {{- ' C ' -}}  D", {}),
    ("line1\n  {% if true %}\n  inside\n  {% endif %}\nline2\n", {}),
    ("  {%+ if true %}kept{% endif %}\n{% if true +%}\nkept newline{% endif %}", {}),
    ("a\n{%- if true -%}\n  b  \n{%- endif -%}\n c", {}),
    ("{% raw %}{{ not rendered }}{% endraw %}", {}),
    ("{{ messages | length }}{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}",
     {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}),
    ("{{ 'Tab\\there' }} {{ \"dq 'single'\" }} {{ 'uni \\u00e9 \\x41' }} {{ 'adj' 'acent' }}", {}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }} {% for a, b in [[1, 2], [3, 4]] %}{{ a * b }}{% endfor %}", {}),
    ("{{ [1, 2] + [3] }} {{ 'ab' * 3 }} {{ [0] * 3 }} {{ (1, 2) }} {{ () }}", {}),
    ("{{ {'a': 1}['a'] }} {{ [[1, 2], [3]][0][1] }} {{ x.y.z }}", {"x": {"y": {"z": "deep"}}}),
    ("{{ '  indented\nblock\n\nend' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(2, blank=true) }}", {}),
    ("{{ u is iterable }} {{ 'abc' | first }} {{ [] | first }}| {{ 'a,b'.split(',') | join('-') }} {{ {'a': 1} | tojson(2) }} {{ [1,2] | tojson(indent=0) }}", {}),
    ("{{ 1.0 | tojson }} {{ 3 / 1 }} {{ 2 ** -1 }} {{ 'x' ~ [1, 'y'] }} {{ (1, 2) | list }} {{ true and 0 }} {{ '' or none }} {{ 'Ab' is lower }}", {}),
    ("{{ 5 | string | length }} {{ 'a\tb' | wordcount }} {{ -1 // 2 }} {{ -1.5 // 1 }} {{ 5.5 % 2 }} {{ [3,2,1] | sort | first }} {{ {'b':1,'a':2} | dictsort(by='value') }}", {}),
    ("{% for a in 'ab' %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}{{ 'abc'.upper().lower() }} {{ 'é' | upper }} {{ 1 in [1.0] }} {{ none | default('d') }}", {}),
    ("{%- set x = 1 -%}\n  {{ x }}  \n{%- if x %} y {% endif -%}  z{% for i in range(3) %}{% if loop.last %}{{ i }}{% endif %}{% endfor %}", {}),
    ("{{ loop_missing.index }}", {}),
    ("{{ x.y }}", {}),
    ("{{ 'a' + none }}", {}),
    ("{{ raise_exception('bad input') }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ [1, 2] | foo }}", {}),
    ("{% if x is banana %}{% endif %}", {}),
    ("{% if %}{% endif %}", {}),
    ("{% for x in y %}no end", {}),
    ("{% endfor %}", {}),
    ("{% include 'x.html' %}", {}),
    ("{{ 'unclosed }}", {}),
    ("{{ x ", {}),
    ("{% break %}", {}),
    ("{{ none.startswith('a') }}", {}),
    ("{{ 'a' < 1 }}", {}),
    ("{{ len([1]) }}", {}),
    # Constructs of the MiniMax-M2 / M2.5 chat template (written here, not copied from it): a macro that
    # sets a default for a variable the caller may pass, tojson() with empty parentheses, a dict walked
    # with `| items` and values printed raw or as JSON, <think> split out of a reply, a namespace
    # attribute set from a missing field (undefined, which is not none), a loop variable rebound inside
    # its loop, a sliced list indexed from the loop, and the string/iterable/mapping tests.
    ("{%- macro who() -%}{%- if ident is not defined -%}{%- set ident = 'default' -%}{%- endif -%}{{ ident }}{%- endmacro -%}"
     "{{ who() }}|{{ ident is defined }}", {}),
    ("{%- macro who() -%}{%- if ident is not defined -%}{%- set ident = 'default' -%}{%- endif -%}{{ ident }}{%- endmacro -%}"
     "{{ who() }}", {"ident": "You are X."}),
    ("{{ obj | tojson() }}|{{ obj.b | tojson }}", {"obj": {"a": 1, "b": [1, 2.5, None, True, "\u00e9\"<"], "c": {}}}),
    ("{%- for k, v in args | items %}<{{ k }}={{ v | tojson if v is not string else v }}>{% endfor %}",
     {"args": {"city": "Paris", "days": 3, "opts": {"unit": "C", "list": [1, None]}, "flag": False, "q": "a \"b\""}}),
    ("{{ s.split('</think>')[0].strip('\\n').split('<think>')[-1].strip('\\n') }}|{{ s.split('</think>')[-1].strip('\\n') }}|{{ '</think>' in s }}",
     {"s": "<think>\nstep one\nstep two\n</think>\n\nThe answer."}),
    ("{% set ns = namespace(name=none) %}{% set ns.name = calls[-1].name %}{{ ns.name is none }}|{{ ns.name is defined }}|"
     "{% set ns.name = none %}{{ ns.name is none }}", {"calls": [{"function": {"name": "f"}}]}),
    ("{%- for t in calls -%}{%- if t.function %}{%- set t = t.function %}{%- endif %}{{ t.name }},{%- endfor -%}|{{ t is defined }}",
     {"calls": [{"function": {"name": "a"}}, {"name": "b"}]}),
    ("{%- set rest = msgs[1:] -%}{%- for m in rest -%}{{ loop.first }}/{{ loop.last }}/{{ rest[loop.index0 - 1].role }};{%- endfor -%}",
     {"msgs": [{"role": "system"}, {"role": "user"}, {"role": "assistant"}, {"role": "tool"}]}),
    ("{%- for x in vals -%}{{ x is string }}/{{ x is iterable and x is not mapping }}/{{ x is mapping }};{%- endfor -%}",
     {"vals": ["s", [1], {"k": 1}, None, 3]}),
]


def gen_jinja_goldens():
    rows = []
    for template, variables in JINJA_CASES:
        try:
            rendered = _compile_jinja_template(template).render(**variables)
            rows.append({"template": template, "vars": variables, "rendered": rendered})
        except Exception as e:  # the interpreter must fail too (SPARK_ERR_TEMPLATE)
            rows.append({"template": template, "vars": variables, "error": f"{type(e).__name__}: {e}"})
    write_jsonl("jinja_golden.jsonl", rows)


if __name__ == "__main__":
    gen_tokenizer_goldens()
    gen_chat_goldens()
    gen_jinja_goldens()
    with open(os.path.join(HERE, "versions.txt"), "w") as f:
        for k, v in VERSIONS.items():
            f.write(f"{k} {v}\n")
    print(VERSIONS)
