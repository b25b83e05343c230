#!/usr/bin/env python3
"""Writes the prompt sets of `tandem bench modes` from the corpus' held-out split.

Two categories, PER_CATEGORY prompts each, at most one per held-out file, files taken in an
even spread over the sorted held-out list (tools/train/corpus.py defines the split):

  code   a run of whole source lines starting near the middle of a file, holding no docstring,
         comment or blank line, ending at the end of a line (no trailing newline: the next
         token is the newline and indentation, as in training). The prompt has at least
         CODE_MIN_TOKENS tokens, and the CODE_FOLLOW_LINES lines after it are code as well, so
         the text the model should continue is code.
  prose  the first docstring of a file (module, class or function, in source order) with at
         least PROSE_MIN_CHARS characters: the source from its `def`/`class` line (when that
         header is short) or from the line of its opening quotes, through the first words of
         the docstring (at least PROSE_MIN_DOC_TOKENS tokens of it), cut at the end of a word.
         At least PROSE_MIN_REST_CHARS characters of the docstring follow the cut, so the text
         the model should continue is English prose.

Prompts are stored as text (the engine tokenizes them like `tandem generate` does) with their
token count under the bundled tokenizer. The selection depends only on the held-out files
(Python 3.11.7 standard library; the output records the file-list digest) and the tokenizer.

Run: .venv/bin/python tools/bench/make_bench_prompts.py
  [--model models/tandem-target] [--out <model>/fixtures/bench_prompts.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import platform
import sys
from pathlib import Path

from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "train"))
import corpus  # noqa: E402  (the training scripts are not a package)

PER_CATEGORY = 10
CODE_MIN_TOKENS = 48
CODE_MAX_TOKENS = 128
CODE_FOLLOW_LINES = 4
PROSE_MIN_CHARS = 400
PROSE_MIN_DOC_TOKENS = 32
PROSE_MAX_HEADER_TOKENS = 48
PROSE_MIN_REST_CHARS = 200


def docstring_nodes(tree: ast.AST) -> list[tuple[ast.AST, ast.Constant]]:
    """(owner, docstring constant) pairs in source order."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                found.append((node, body[0].value))
    found.sort(key=lambda pair: (pair[1].lineno, pair[1].col_offset))
    return found


def string_lines(tree: ast.AST) -> set[int]:
    """1-based lines touched by a multi-line string constant (docstrings and long literals)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.end_lineno is not None and node.end_lineno > node.lineno:
                lines.update(range(node.lineno, node.end_lineno + 1))
    for _, doc in docstring_nodes(tree):
        lines.update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
    return lines


def code_prompt(text: str, tree: ast.AST, tok: Tokenizer) -> tuple[int, str] | None:
    lines = text.split("\n")
    bad = string_lines(tree)

    def is_code(i: int) -> bool:  # 0-based
        stripped = lines[i].strip()
        return bool(stripped) and not stripped.startswith("#") and (i + 1) not in bad

    for start in range(len(lines) // 2, len(lines)):
        # Start at a line with the least indentation of its neighbourhood: a statement start.
        if not is_code(start) or lines[start].rstrip().endswith((",", "(", "[", "{", "\\")):
            continue
        if start > 0 and lines[start - 1].rstrip().endswith((",", "(", "[", "{", "\\")):
            continue
        end = start
        while end < len(lines) and is_code(end):
            count = len(tok.encode("\n".join(lines[start:end + 1])).ids)
            if count >= CODE_MIN_TOKENS:
                break
            end += 1
        if end >= len(lines) or not is_code(end):
            continue
        prompt = "\n".join(lines[start:end + 1])
        if len(tok.encode(prompt).ids) > CODE_MAX_TOKENS:
            continue
        follow = range(end + 1, end + 1 + CODE_FOLLOW_LINES)
        if all(i < len(lines) and is_code(i) for i in follow):
            return start + 1, prompt
    return None


def offset(lines: list[str], lineno: int, col: int) -> int:
    """Character offset of (1-based line, UTF-8 byte column) in the text."""
    before = sum(len(line) + 1 for line in lines[:lineno - 1])
    return before + len(lines[lineno - 1].encode("utf-8")[:col].decode("utf-8"))


def prose_prompt(text: str, tree: ast.AST, tok: Tokenizer) -> tuple[int, str] | None:
    lines = text.split("\n")
    for owner, doc in docstring_nodes(tree):
        if len(doc.value.strip()) < PROSE_MIN_CHARS:
            continue
        doc_line_start = offset(lines, doc.lineno, 0)
        begin, first_line = doc_line_start, doc.lineno
        if not isinstance(owner, ast.Module):
            header_start = offset(lines, owner.lineno, 0)
            if len(tok.encode(text[header_start:doc_line_start]).ids) <= PROSE_MAX_HEADER_TOKENS:
                begin, first_line = header_start, owner.lineno
        quote = offset(lines, doc.lineno, doc.col_offset)
        doc_end = offset(lines, doc.end_lineno, doc.end_col_offset)
        # Cut after the first word that brings the docstring part to the token minimum.
        cut = None
        pos = quote
        while pos < doc_end:
            nxt = pos
            while nxt < doc_end and text[nxt].isspace():
                nxt += 1
            while nxt < doc_end and not text[nxt].isspace():
                nxt += 1
            if len(tok.encode(text[quote:nxt]).ids) >= PROSE_MIN_DOC_TOKENS:
                cut = nxt
                break
            pos = nxt
        if cut is None or doc_end - cut < PROSE_MIN_REST_CHARS:
            continue
        return first_line, text[begin:cut]
    return None


def spread(files: list, n: int) -> list:
    """Files in the order to try: an even spread first, then the rest in list order."""
    first = [files[i * len(files) // n] for i in range(n)]
    return first + [f for f in files if f not in first]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO / "models" / "tandem-target"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = Path(args.model)
    out = Path(args.out) if args.out else model / "fixtures" / "bench_prompts.json"
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    data = corpus.load()
    files = sorted(data.heldout, key=lambda f: f.rel_path)

    prompts: dict[str, list[dict]] = {"code": [], "prose": []}
    makers = {"code": code_prompt, "prose": prose_prompt}
    for category, make in makers.items():
        for source in spread(files, PER_CATEGORY):
            if len(prompts[category]) == PER_CATEGORY:
                break
            found = make(source.text, ast.parse(source.text), tok)
            if found is None:
                continue
            line, prompt = found
            prompts[category].append({
                "source": f"{source.rel_path}:{line}",
                "prompt_tokens": len(tok.encode(prompt).ids),
                "text": prompt,
            })
        if len(prompts[category]) < PER_CATEGORY:
            print(f"only {len(prompts[category])} {category} prompts found", file=sys.stderr)
            return 1

    result = {
        "description": "Held-out prompts of `tandem bench modes`: Python code to continue, and "
                       "docstring prose to continue. Written by tools/bench/make_bench_prompts.py "
                       "(selection rules in its docstring).",
        "python_version": platform.python_version(),
        "file_list_sha256": data.stats()["file_list_sha256"],
        "categories": prompts,
    }
    out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    for category, items in prompts.items():
        for item in items:
            print(f"{category:5} {item['prompt_tokens']:4d} tokens  {item['source']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
