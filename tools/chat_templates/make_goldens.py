#!/usr/bin/env python3
"""Renders the chat-template fixtures with Python's jinja2 as Hugging Face's apply_chat_template
does, and writes the outputs the C++ renderer is tested against.

Every template of tests/worker/template/fixtures/*.jinja meets every case of cases.json; the
golden is the rendered text, or the message a template raised (null for a failure of another
kind, such as adding a list to a string). Needs jinja2 (Debian's
python3-jinja2).

    python3 tools/chat_templates/make_goldens.py
"""
import json
import pathlib

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests/worker/template/fixtures"


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Hugging Face's override of Jinja2's own tojson (which escapes HTML characters).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def generation_extension(env):
    """Hugging Face renders {% generation %} blocks through; so does an empty extension here."""
    from jinja2.ext import Extension
    from jinja2 import nodes

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    env.add_extension(Generation)


def main():
    cases = json.loads((FIXTURES / "cases.json").read_text())
    env = environment()
    generation_extension(env)
    goldens = []
    for name, tokens in cases["templates"].items():
        template = env.from_string((FIXTURES / f"{name}.jinja").read_text())
        for case_name, case in cases["cases"].items():
            context = dict(case.get("vars", {}))
            context.update(messages=case["messages"],
                           add_generation_prompt=case.get("add_generation_prompt", True),
                           bos_token=tokens["bos_token"], eos_token=tokens["eos_token"])
            entry = {"template": name, "case": case_name}
            try:
                entry["output"] = template.render(**context)
            except jinja2.exceptions.TemplateError as error:
                entry["error"] = str(error)  # the template's own message: compared
            except Exception:  # a type error and the like: only that rendering fails
                entry["error"] = None
            goldens.append(entry)
    out = FIXTURES / "goldens.json"
    out.write_text(json.dumps(goldens, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(goldens)} goldens to {out}")


if __name__ == "__main__":
    main()
