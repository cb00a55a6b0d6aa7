#!/usr/bin/env python3
"""Finds aggregate temporaries written inside a co_await expression.

g++ 12 destroys a temporary lambda that captures by value, or a braced aggregate (`f({a, b})`,
`Spec{a, b}`), twice when it is written inside a co_await expression (a double free). troupe's
code makes such values first and awaits afterwards; see runtime/include/troupe/co.h. Usage: co_await_check.py DIR...
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


def matching(text, i):
    """The index of the bracket that closes the one at `i`."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] in "([{":
            depth += 1
        elif text[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


def lambda_body(span, after):
    """The (start, end) of the body of a lambda whose introducer ends at `after`."""
    i = after
    while i < len(span) and span[i] != "{":
        if span[i] == "(":
            i = matching(span, i)
        i += 1
    return (i, matching(span, i)) if i < len(span) else (len(span), len(span))


def check(path):
    text = strip(path.read_text(errors="replace"))
    found = []
    for m in re.finditer(r"\bco_await\b", text):
        end = statement_end(text, m.end())
        span = text[m.end():end]
        bodies = []
        for lam in LAMBDA.finditer(span):
            line = text.count("\n", 0, m.end() + lam.start(1)) + 1
            if by_value(lam.group(1)):
                found.append((line, f"a lambda capturing [{lam.group(1).strip()}]"))
            bodies.append(lambda_body(span, lam.end(1) + 1))
        for brace in re.finditer(r"\{", span):
            if not any(start <= brace.start() <= stop for start, stop in bodies):
                line = text.count("\n", 0, m.end() + brace.start()) + 1
                found.append((line, "a braced initializer"))
    return found


def main(args):
    problems = 0
    for arg in args:
        root = Path(arg)
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.suffix in SOURCES)
        for path in files:
            for line, what in check(path):
                problems += 1
                print(f"{path}:{line}: {what} inside a co_await expression; g++ 12 destroys "
                      "it twice. Make it (or the promise) first, as a local, then co_await.")
    if problems == 0:
        print(f"no lambda capturing by value or braced initializer inside a co_await "
              f"expression in {' '.join(args)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
