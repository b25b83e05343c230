#!/usr/bin/env python3
"""The training corpus: the Python standard library sources of the running interpreter.

Why this corpus: it is on every machine that can run the training scripts, needs no network,
has a known licence (PSF), and is large enough (about 9 MB of code) for models of a few
million parameters. Its content depends on the Python version, which is therefore recorded
with every model trained on it.

File list (fixed and sorted by relative path): every `*.py` under `sysconfig.get_paths()
["stdlib"]`, excluding
  * test suites: any directory named `test`, `tests` or `idle_test` (covers `test/`,
    `lib2to3/tests`, `unittest/test`, `ctypes/test`, `tkinter/test`, `distutils/tests`);
  * `site-packages/` (third-party code, differs between installations);
  * `idlelib/` (an application, not library code);
  * generated data: `encodings/` (mostly charmap tables), `pydoc_data/` (a documentation
    text blob), `_sysconfigdata_*.py` (build-machine paths) and `config-*` directories.

Split: by file, deterministic. A file is held out when the first 8 bytes of
sha256("tandem-corpus:" + relative path), read as a big-endian integer, modulo 1000 fall
below HELDOUT_PER_MILLE. Files are read as UTF-8 (every stdlib source is UTF-8).

Run directly to print the statistics: `python tools/train/corpus.py [--json]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform
import sys
import sysconfig
from pathlib import Path

HELDOUT_PER_MILLE = 50  # about 5 % of the files
EXCLUDED_DIR_NAMES = frozenset({"test", "tests", "idle_test", "__pycache__"})
EXCLUDED_TOP_DIRS = frozenset({"site-packages", "idlelib", "encodings", "pydoc_data"})


@dataclasses.dataclass(frozen=True)
class SourceFile:
    rel_path: str  # POSIX-style path relative to the stdlib root
    text: str


@dataclasses.dataclass
class Corpus:
    root: str
    python_version: str
    train: list[SourceFile]
    heldout: list[SourceFile]

    def stats(self) -> dict:
        def part(files: list[SourceFile]) -> dict:
            return {
                "files": len(files),
                "bytes": sum(len(f.text.encode("utf-8")) for f in files),
                "chars": sum(len(f.text) for f in files),
            }

        return {
            "source": "Python standard library (*.py), see tools/train/corpus.py",
            "python_version": self.python_version,
            "python_implementation": platform.python_implementation(),
            "heldout_per_mille": HELDOUT_PER_MILLE,
            "train": part(self.train),
            "heldout": part(self.heldout),
            "heldout_files": [f.rel_path for f in self.heldout],
            "file_list_sha256": file_list_digest(self.train + self.heldout),
        }


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def is_excluded(rel: Path) -> bool:
    parts = rel.parts
    if parts[0] in EXCLUDED_TOP_DIRS or parts[0].startswith("config-"):
        return True
    if any(p in EXCLUDED_DIR_NAMES for p in parts[:-1]):
        return True
    return rel.name.startswith("_sysconfigdata")


def is_heldout(rel_path: str) -> bool:
    digest = hashlib.sha256(("tandem-corpus:" + rel_path).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 1000 < HELDOUT_PER_MILLE


def file_list_digest(files: list[SourceFile]) -> str:
    """sha256 over the sorted (path, content) pairs: two corpora are equal iff this matches."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.rel_path):
        data = f.text.encode("utf-8")
        h.update(f"{f.rel_path}\0{len(data)}\0".encode("utf-8"))
        h.update(data)
    return h.hexdigest()


def list_files(root: Path | None = None) -> list[str]:
    """Sorted relative POSIX paths of the corpus files."""
    root = root or stdlib_root()
    rels = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if path.is_file() and not is_excluded(rel):
            rels.append(rel.as_posix())
    return sorted(rels)


def load(root: Path | None = None) -> Corpus:
    root = root or stdlib_root()
    train, heldout = [], []
    for rel in list_files(root):
        text = (root / rel).read_text(encoding="utf-8")
        (heldout if is_heldout(rel) else train).append(SourceFile(rel, text))
    return Corpus(
        root=str(root),
        python_version=platform.python_version(),
        train=train,
        heldout=heldout,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    args = parser.parse_args()
    corpus = load()
    stats = corpus.stats()
    if args.json:
        json.dump(stats, sys.stdout, indent=2)
        print()
        return 0
    print(f"stdlib root    : {corpus.root}")
    print(f"python         : {stats['python_version']} ({stats['python_implementation']})")
    for name in ("train", "heldout"):
        s = stats[name]
        print(f"{name:<15}: {s['files']:5d} files  {s['bytes']:10,d} bytes")
    print(f"file list sha256: {stats['file_list_sha256']}")
    print("held-out files :", ", ".join(stats["heldout_files"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
