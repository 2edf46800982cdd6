#!/usr/bin/env python3
"""Puts the generated tables into the docs: docs/report/*.md into
docs/benchmarks.md's "Current figures", and the warm loop's ratio table into
the README's "How it compares". Run by scripts/benchmarks.sh after the tools
have written docs/report/; it measures nothing itself.

Each target holds a region between a line starting `<!-- generated` and the
line `<!-- generated: end -->`; everything between is replaced. A source
file that is missing is left out (the Python parts need torch)."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "report"
END = "<!-- generated: end -->"


def demote(text):
    """Headings two levels down, so a file's `#` title sits under the
    `## Current figures` that holds it."""
    return re.sub(r"^(#+) ", r"##\1 ", text, flags=re.M)


def body(name):
    """A generated file, as a section of docs/benchmarks.md; None if absent."""
    path = REPORT / name
    if not path.exists():
        return None
    text = path.read_text()
    # Links relative to docs/report/ become relative to docs/.
    text = re.sub(r"\]\((?!https?:|#|/)([^)]+)\)", r"](report/\1)", text)
    return demote(text).strip() + "\n"


def splice(path, generated):
    """Replaces the region of `path` between its markers with `generated`."""
    text = path.read_text()
    start = re.search(r"^<!-- generated.*-->\n", text, flags=re.M)
    end = text.find(END)
    if start is None or end < start.end():
        sys.exit(f"{path}: no '<!-- generated ... -->' ... '{END}' region")
    path.write_text(text[: start.end()] + "\n" + generated + "\n" + text[end:])


def ratio_table(warm_loop):
    """The warm loop's header line and its first table (the ratios)."""
    lines = warm_loop.read_text().splitlines()
    head = next(l for l in lines if l.startswith("Warm loop,"))
    first = next(k for k, l in enumerate(lines) if l.startswith("|"))
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return f"_{head}_\n\n" + "\n".join(table) + "\n"


def main():
    parts = [
        body(name) for name in ("report.md", "warm_loop.md", "python.md", "python_compiled.md")
    ]
    found = [p for p in parts if p]
    if not found:
        sys.exit(f"nothing to splice: no report.md, warm_loop.md or python.md in {REPORT}")
    splice(ROOT / "docs" / "benchmarks.md", "\n".join(found))
    warm_loop = REPORT / "warm_loop.md"
    if warm_loop.exists():
        splice(ROOT / "README.md", ratio_table(warm_loop))


if __name__ == "__main__":
    main()
