#!/usr/bin/env python3
"""Finds lambdas that capture by value written inside a co_await expression.

g++ 12 destroys such a lambda twice (a double free), so troupe's code makes the promise first and
awaits it afterwards; see runtime/include/troupe/co.h. Usage: co_await_lambda_check.py DIR...
Exits 1 and names file:line for every occurrence; 0 when there is none. Files given as arguments
are checked even if they are not C++ sources (the self-test uses that).
"""

import re
import sys
from pathlib import Path

SOURCES = (".cpp", ".h", ".cc", ".hpp")


def strip(text):
    """Blanks out comments and string/char literals, keeping newlines (and so line numbers)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def statement_end(text, start):
    """The index of the `;` (or unmatched closer) that ends the expression starting at `start`."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return i
            depth -= 1
        elif c == ";" and depth == 0:
            return i
    return len(text)


LAMBDA = re.compile(r"(?:^|(?<=[(,=!{]))\s*\[([^\[\]]*)\]\s*(?:\(|\{|mutable|->)")


def by_value(captures):
    for capture in (c.strip() for c in captures.split(",")):
        if capture and not capture.startswith("&") and capture != "this":
            return True
    return False


def check(path):
    text = strip(path.read_text(errors="replace"))
    found = []
    for m in re.finditer(r"\bco_await\b", text):
        end = statement_end(text, m.end())
        span = text[m.end():end]
        for lam in LAMBDA.finditer(span):
            if by_value(lam.group(1)):
                line = text.count("\n", 0, m.end() + lam.start(1)) + 1
                found.append((line, lam.group(1).strip()))
    return found


def main(args):
    problems = 0
    for arg in args:
        root = Path(arg)
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.suffix in SOURCES)
        for path in files:
            for line, captures in check(path):
                problems += 1
                print(f"{path}:{line}: a lambda capturing [{captures}] inside a co_await "
                      "expression; g++ 12 destroys it twice. Make the promise first "
                      "(auto p = ...;) and then co_await kj::mv(p).")
    if problems == 0:
        print(f"no lambda captures by value inside a co_await expression in {' '.join(args)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
