#!/usr/bin/env python3
"""Keeps every Catch test case reachable from ctest.

Three ways a Catch test case is silently never run under ctest, and one way it aborts:
- a name starting with '-' or '~': Catch takes the filter ctest passes for an option or an
  exclusion;
- a `;` in its name: catch_discover_tests() splits the name in two at the `;` (CMake's list
  separator), registers two filters that match no test, and Catch v2 exits 0 on "No tests ran";
- a catch_discover_tests() call without `EXTRA_ARGS -w NoTests`: a filter that matches nothing
  (for any other reason) passes instead of failing;
- a first ": " in its name at column 77 or later: Catch v2's console reporter indents the name's
  wrapped lines to just after it, and asserts the indent is below the width (79), which aborts the
  test case in a build with assertions (the sanitizer build).

Usage: catch_names_check.py PATH...  (folders are searched for C++ sources and CMake files; files
given as arguments are checked whatever their name, which the self-test uses). Prints file:line
for every problem and exits 1; exits 0 when there is none.
"""

import re
import sys
from pathlib import Path

SOURCES = (".cpp", ".h", ".cc", ".hpp")
CMAKE = ("CMakeLists.txt",)
CMAKE_SUFFIXES = (".cmake",)

# The macros whose first string argument becomes a test case's name.
TEST_MACRO = re.compile(r"\b(TEST_CASE|SCENARIO|TEST_CASE_METHOD|TEMPLATE_TEST_CASE)\s*\(")
LITERAL = re.compile(r'\s*(?:u8|u|U|L)?"((?:[^"\\\n]|\\.)*)"', re.S)
DISCOVER = re.compile(r"\bcatch_discover_tests\s*\(")
CONSOLE_WIDTH = 80  # Catch v2's CATCH_CONFIG_CONSOLE_WIDTH


def strip_comments(text):
    """Blanks out // and /* */ comments outside string literals, keeping offsets and newlines."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        else:
            i += 1
    return "".join(out)


def test_names(text):
    """(line, name) for every test case: adjacent string literals are joined, as C++ does."""
    text = strip_comments(text)
    for m in TEST_MACRO.finditer(text):
        pos = m.end()
        if m.group(1) == "TEST_CASE_METHOD":  # the fixture comes first
            comma = text.find(",", pos)
            if comma < 0:
                continue
            pos = comma + 1
        parts = []
        while True:
            lit = LITERAL.match(text, pos)
            if not lit:
                break
            parts.append(lit.group(1))
            pos = lit.end()
        if parts:
            yield text.count("\n", 0, m.start()) + 1, "".join(parts)


def check_source(path):
    for line, name in test_names(path.read_text(errors="replace")):
        if name[:1] in ("-", "~"):
            yield line, (f"test case name \"{name}\" starts with '{name[0]}': on the command "
                         "line ctest gives it, Catch reads it as an option or an exclusion, so "
                         "it never runs. Start it with a word.")
        if ";" in name:
            yield line, (f"test case name \"{name}\" contains ';': ctest's discovery splits it "
                         "into filters that match nothing, so it never runs. Use ',' or ':'.")
        colon = name.find(": ")
        if colon >= 0 and colon + 2 >= CONSOLE_WIDTH - 1:
            yield line, (f"test case name \"{name}\" has its first ': ' at column {colon}: "
                         "Catch's console reporter indents the name's wrapped lines to just "
                         f"after it, and past column {CONSOLE_WIDTH - 3} that fails an assertion "
                         "and aborts the test in a build without NDEBUG (make test-sanitize). "
                         "Put the ': ' earlier, or use ','.")


def check_cmake(path):
    text = re.sub(r"#[^\n]*", lambda m: " " * len(m.group(0)), path.read_text(errors="replace"))
    for m in DISCOVER.finditer(text):
        depth, end = 1, m.end()
        while end < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        call = text[m.end():end - 1]
        if not re.search(r"\bEXTRA_ARGS\b[^)]*-w\s+NoTests\b", call):
            line = text.count("\n", 0, m.start()) + 1
            yield line, ("catch_discover_tests() without EXTRA_ARGS -w NoTests: a test filter "
                         "that matches nothing would pass. Add EXTRA_ARGS -w NoTests.")


def files_under(arg):
    root = Path(arg)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*")
                  if p.is_file() and (p.suffix in SOURCES or p.name in CMAKE
                                      or p.suffix in CMAKE_SUFFIXES))


def main(args):
    problems = 0
    for arg in args:
        for path in files_under(arg):
            is_cmake = (path.name in CMAKE or path.suffix in CMAKE_SUFFIXES
                        or path.name.endswith(".cmake.txt"))
            for line, what in (check_cmake(path) if is_cmake else check_source(path)):
                problems += 1
                print(f"{path}:{line}: {what}")
    if problems == 0:
        print(f"every Catch test case name is free of ';', of a leading '-' or '~' and of a late ': ', and every "
              f"catch_discover_tests() "
              f"passes -w NoTests in {' '.join(args)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
