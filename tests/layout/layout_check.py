#!/usr/bin/env python3
"""The runtime's layout as docs/architecture.md states it, checked on the tree.

1. Every `#include "<folder>/..."` in runtime/src/<folder>/ names a folder that the folder's
   troupe_part(... FOLDERS ...) in runtime/CMakeLists.txt lists: a new arrow between the runtime's
   parts is a decision written down there, not an accident.
2. Every .cpp of a folder is in its SOURCES.
3. No file of runtime/ or actors/ is longer than LIMIT lines unless it says why at its top (a line
   starting "// Why this file is long:" within its first 20 lines).

Usage: layout_check.py ROOT [--expect-failures] (the second form reads a fixture tree and prints
what it finds without failing, for the test that shows the check can fail).
"""
import os
import re
import sys

LIMIT = 650
REASON = re.compile(r"^// Why this file is long:", re.M)


def parts(cmake_text):
    out = {}
    for m in re.finditer(r"troupe_part\((\w+)(.*?)\)", cmake_text, re.S):
        folder, body = m.group(1), m.group(2)
        sections = {"SOURCES": [], "FOLDERS": [], "LIBS": []}
        current = None
        for word in body.split():
            if word in sections:
                current = word
            elif current:
                sections[current].append(word)
        out[folder] = sections
    return out


def check(root):
    problems = []
    src = os.path.join(root, "runtime", "src")
    cmake = open(os.path.join(root, "runtime", "CMakeLists.txt")).read()
    declared = parts(cmake)
    # net/ is a static library of its own (runtime/net.cmake), which includes no other folder.
    net = open(os.path.join(root, "runtime", "net.cmake")).read()
    declared["net"] = {"SOURCES": re.findall(r"src/net/(\w+\.cpp)", net), "FOLDERS": [],
                       "LIBS": []}
    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    for folder in folders:
        if folder not in declared:
            problems.append(f"runtime/src/{folder}/: no troupe_part({folder} ...) in "
                            "runtime/CMakeLists.txt")
            continue
        allowed = set(declared[folder]["FOLDERS"])
        for name in sorted(os.listdir(os.path.join(src, folder))):
            path = os.path.join(src, folder, name)
            rel = f"runtime/src/{folder}/{name}"
            if name.endswith(".cpp") and name not in declared[folder]["SOURCES"]:
                problems.append(f"{rel}: not in troupe_part({folder} SOURCES ...)")
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    m = re.match(r'\s*#\s*include\s+"(\w+)/', line)
                    if not m or m.group(1) == folder or m.group(1) not in folders:
                        continue
                    if m.group(1) not in allowed:
                        problems.append(
                            f"{rel}:{n}: includes {m.group(1)}/, which troupe_part({folder} "
                            f"FOLDERS {' '.join(sorted(allowed)) or '(none)'}) does not list; "
                            "add it there (and to docs/architecture.md) if the arrow is meant")
    for top in ("runtime", "actors"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".cpp", ".h", ".cu")):
                    continue
                path = os.path.join(dirpath, name)
                text = open(path).read()
                lines = text.count("\n")
                head = "\n".join(text.split("\n")[:20])
                if lines > LIMIT and not REASON.search(head):
                    problems.append(f"{os.path.relpath(path, root)}: {lines} lines, over {LIMIT}, "
                                    "and no '// Why this file is long:' line at its top; split it "
                                    "along its sections or say why it is one file")
    return problems


def main():
    root = sys.argv[1]
    problems = check(root)
    for p in problems:
        print(p)
    if "--expect-failures" in sys.argv:
        return 0
    print(f"layout: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
