#!/usr/bin/env bash
# Fails when a doc names a repository path that does not exist, listing each as file:line.
#
#   tests/docs/doc_paths_test.sh REPO_ROOT
#
# Docs read: README.md, docs/*.md, services/*/README.md, kernels/*/README.md and
# helm/*/README.md. A path is a token inside `code` (inline spans and fenced blocks) or a
# markdown link target whose first part is a top-level directory of the repository (listed
# from the tree, so a new one counts without a change here), e.g. `worker/engine/engine.cc`,
# `models/tandem-target`. Link targets are resolved as a markdown viewer does: relative to the
# doc's folder; a `#anchor` on a link to a .md file must name one of its headings. Skipped:
# tokens with placeholder or glob characters (`*`, `?`, `<`, `$`, `...`), build outputs (the
# top-level build folders: build/, build-*/, any folder holding a CMakeCache.txt) and hidden
# folders (local environments such as .venv/, ignored by git). `a.{h,cc}` names a.h and a.cc.
# Exit status: 0 when every path exists, 1 otherwise, 77 (skipped) without python3.
set -euo pipefail
if [[ $# -ne 1 || ! -d "$1" ]]; then
  echo "usage: $0 REPO_ROOT" >&2
  exit 2
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "doc_paths_test: python3 not found; skipped" >&2
  exit 77
fi
exec python3 - "$1" <<'PY'
import glob
import os
import re
import sys

root = os.path.abspath(sys.argv[1])

DOC_GLOBS = ["README.md", "docs/*.md", "services/*/README.md", "kernels/*/README.md",
             "helm/*/README.md"]


def is_build_dir(name):
    return (name == "build" or name.startswith("build-")
            or os.path.exists(os.path.join(root, name, "CMakeCache.txt")))


TOP_DIRS = sorted(
    name for name in os.listdir(root)
    if os.path.isdir(os.path.join(root, name)) and not name.startswith(".")
    and not is_build_dir(name))
# A path token: a top-level directory, a slash, then anything up to a space, quote or bracket,
# so that a placeholder (`docs/gpu-runs/<date>.json`) is seen whole and skipped rather than cut
# at the `<` and checked, and braces stay in the token so that `a.{h,cc}` can be expanded.
TOKEN = re.compile(r"(?<![\w./-])(?:%s)/[^\s`'\"()\[\]]*" % "|".join(re.escape(d) for d in TOP_DIRS))
PLACEHOLDER = re.compile(r"[*?<>$]|\.\.\.|…")
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A code span: backticks, text that may wrap onto the next line but not past a blank line, the
# same backticks.
INLINE_CODE = re.compile(r"(`+)((?:(?!\n[ \t]*\n)[^`])+?)\1")


def expand_braces(token):
    """`worker/decoding/ar.{h,cc}` -> the two paths; a token without braces -> itself."""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for part in m.group(1).split(","):
        out.extend(expand_braces(token[:m.start()] + part + token[m.end():]))
    return out


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_anchors = {}


def anchors_of(path):
    if path not in _anchors:
        found, seen, fenced = set(), {}, False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.lstrip().startswith("```"):
                    fenced = not fenced
                    continue
                m = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    base = slug(m.group(1))
                    n = seen.get(base, 0)
                    seen[base] = n + 1
                    found.add(base if n == 0 else "%s-%d" % (base, n))
        _anchors[path] = found
    return _anchors[path]


def check_token(token):
    """The missing paths a code token names (repository-relative); [] when all exist."""
    if PLACEHOLDER.search(token):
        return []
    token = token.rstrip(".,;:")  # sentence punctuation after the path
    missing = []
    for path in expand_braces(token):
        path = re.sub(r":\d+(-\d+)?$", "", path)  # file.cc:123
        if not os.path.exists(os.path.join(root, path)):
            missing.append(path)
    return missing


def check_link(doc, target):
    """A link target relative to the doc's folder: the missing path or anchor, else None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or PLACEHOLDER.search(target):
        return None  # a URL (https:, mailto:) or a placeholder
    path, _, anchor = target.partition("#")
    base = os.path.dirname(doc)
    full = os.path.normpath(os.path.join(base, path)) if path else doc
    rel = os.path.relpath(full, root)
    if rel.split(os.sep)[0] not in TOP_DIRS and os.path.dirname(rel) != "":
        return None  # outside the repository or its checked folders (build outputs, hidden ones)
    if not os.path.exists(full):
        return rel
    if anchor and full.endswith(".md") and anchor.lower() not in anchors_of(full):
        return "%s#%s (no such heading)" % (rel, anchor)
    return None


def main():
    docs = sorted({p for g in DOC_GLOBS for p in glob.glob(os.path.join(root, g))})
    problems = []
    for doc in docs:
        rel_doc = os.path.relpath(doc, root)
        with open(doc, encoding="utf-8") as f:
            lines = f.read().split("\n")
        # Fenced blocks are checked line by line; the rest (prose) as one text with the fenced
        # lines blanked, so that a code span or link wrapped over two lines is read whole.
        prose, fenced = [], False
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                prose.append("")
                continue
            if fenced:
                prose.append("")
                for m in TOKEN.finditer(line):
                    for path in check_token(m.group(0)):
                        problems.append("%s:%d: %s" % (rel_doc, number, path))
            else:
                prose.append(line)
        text = "\n".join(prose)

        def line_of(offset):
            return text.count("\n", 0, offset) + 1

        for span in INLINE_CODE.finditer(text):
            for m in TOKEN.finditer(span.group(2)):
                for path in check_token(m.group(0)):
                    problems.append("%s:%d: %s" % (rel_doc, line_of(span.start(2) + m.start()), path))
        # Links outside code spans (a span keeps its length and line breaks when blanked).
        outside = INLINE_CODE.sub(lambda s: re.sub(r"[^\n]", " ", s.group(0)), text)
        for m in LINK.finditer(outside):
            bad = check_link(doc, m.group(1))
            if bad:
                problems.append("%s:%d: %s (link)" % (rel_doc, line_of(m.start()), bad))
    problems.sort(key=lambda p: (p.split(":")[0], int(p.split(":")[1])))
    if problems:
        print("docs name %d path(s) that do not exist:" % len(problems))
        for p in problems:
            print("  " + p)
        return 1
    print("doc paths: %d docs, every named path exists (top-level folders: %s)"
          % (len(docs), " ".join(TOP_DIRS)))
    return 0


sys.exit(main())
PY
