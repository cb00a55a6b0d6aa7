#!/usr/bin/env python3
"""The runtime's layout as docs/architecture.md states it, checked on the tree.

1. Every include of another folder in runtime/src/<folder>/ (`"<folder>/..."`, `"../<folder>/..."`,
   or `<<folder>/...>` where runtime/src has that file) names a folder that the folder's
   troupe_part(... FOLDERS ...) in runtime/CMakeLists.txt lists: a new arrow between the runtime's
   parts is a decision written down there, not an accident.
2. No two folders reach each other, directly or around a loop, through those lists: the runtime's
   arrows point one way (a part reaches one above it through an interface it owns, as node/
   reaches the head through HeadLink), and no folder includes the entry point troupe/run.h (the
   options it reads are troupe/run_options.h).
3. Every .cpp of a folder is in its SOURCES.
4. No include of the tree's C++ climbs out of its folder (`"../x/y.h"`): a folder is included by
   its component's path, which says which arrow it is.
5. Outside a component and tests/, nothing includes (with quotes or angles) a component's private
   header: one of actors/<c>/, runtime/src/ or scheduler/src/ that is not under its include/. An
   app or python/src reaches a component through its include/troupe/ headers, and no file is
   allowed an exception.
6. No source file of the tree (.cpp, .h, .cu, .py; not build folders) is longer than LIMIT lines
   unless it says why at its top: a line starting "// Why this file is long:" ("# ..." in Python)
   within its first 20 lines.

Usage: layout_check.py ROOT [--expect-failures] (the second form reads a fixture tree and prints
what it finds without failing, for the test that shows the check can fail).
"""
import os
import re
import sys

LIMIT = 650
REASON = re.compile(r"^// Why this file is long:", re.M)
PY_REASON = re.compile(r"^# Why this file is long:", re.M)
INCLUDE = re.compile(r'\s*#\s*include\s*([<"])([^>"]+)[>"]')

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


def cycles(graph):
    """Each loop of `graph` (folder -> the folders it includes) once, as a path back to its start."""
    found, seen = [], set()

    def walk(path):
        for nxt in graph.get(path[-1], []):
            if nxt == path[0]:
                key = frozenset(path)
                if key not in seen:
                    seen.add(key)
                    found.append(path + [nxt])
            elif nxt not in path and nxt > path[0]:
                walk(path + [nxt])

    for start in sorted(graph):
        walk([start])
    return found


def runtime_folder(src, folder, quote, name):
    """The folder of runtime/src an include in runtime/src/<folder>/ names, or None: "node/x.h",
    "../node/x.h", or <node/x.h> where runtime/src has it (not a system header such as
    <net/if.h>)."""
    if name.startswith("../"):
        name = os.path.relpath(os.path.normpath(os.path.join(src, folder, name)), src)
    elif quote == "<" and not os.path.isfile(os.path.join(src, name)):
        return None
    return name.split("/")[0] if "/" in name else None


def private_roots(root):
    """(a folder an include is looked up in, the component whose private headers it holds)."""
    roots = [("runtime/src", "runtime"), ("runtime/src/net", "runtime"),
             ("scheduler/src", "scheduler")]
    actors = os.path.join(root, "actors")
    if os.path.isdir(actors):
        roots += [(f"actors/{c}", f"actors/{c}") for c in sorted(os.listdir(actors))
                  if os.path.isdir(os.path.join(actors, c))]
    return roots


def private_header(root, roots, rel, name):
    """The private header of another component that file `rel` reaches with `#include name`, or
    None: a header of its own folder, a public one (under include/), or one tests/ may test."""
    if rel.startswith("tests/") or os.path.isfile(os.path.join(root, os.path.dirname(rel), name)):
        return None
    for base, component in roots + [(".", c) for _, c in roots]:
        path = os.path.normpath(os.path.join(base, name))
        mine = rel.startswith(component + "/")
        if (path.startswith(component + "/") and not path.startswith(component + "/include/")
                and not mine and os.path.isfile(os.path.join(root, path))):
            return path
    return None


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
                    if re.match(r'\s*#\s*include\s+"troupe/run\.h"', line):
                        problems.append(f"{rel}:{n}: includes troupe/run.h, the entry point above "
                                        "every part; include troupe/run_options.h for RunOptions")
                    m = INCLUDE.match(line)
                    other = m and runtime_folder(src, folder, m.group(1), m.group(2))
                    if not other or other == folder or other not in folders:
                        continue
                    if other not in allowed:
                        problems.append(
                            f"{rel}:{n}: includes {other}/, which troupe_part({folder} "
                            f"FOLDERS {' '.join(sorted(allowed)) or '(none)'}) does not list; "
                            "add it there (and to docs/architecture.md) if the arrow is meant")
    for cycle in cycles({f: declared[f]["FOLDERS"] for f in folders if f in declared}):
        problems.append(f"runtime/CMakeLists.txt: the folders {' -> '.join(cycle)} reach each "
                        "other in a loop; give the lower one an interface it owns, which the "
                        "upper one implements, and drop the arrow back up")
    roots = private_roots(root)
    for dirpath, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        # Not the tree's own: build folders, hidden ones, and (on the real tree) the fixture.
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "build"))
                         and os.path.join(rel_dir, d) != os.path.join("tests", "layout", "fixture"))
        for name in sorted(files):
            if not name.endswith((".cpp", ".h", ".cu", ".py")):
                continue
            path = os.path.join(dirpath, name)
            text = open(path, errors="replace").read()
            rel = os.path.relpath(path, root)
            for n, line in enumerate(text.split("\n"), 1):
                m = INCLUDE.match(line) if not name.endswith(".py") else None
                if not m:
                    continue
                if ".." in m.group(2).split("/"):
                    problems.append(f"{rel}:{n}: includes {m.group(2)}, climbing out of its "
                                    "folder; include it by its component's path")
                    continue
                private = private_header(root, roots, rel, m.group(2))
                if private:
                    problems.append(f"{rel}:{n}: includes {m.group(2)} ({private}), a private "
                                    "header of another component; include its public "
                                    "troupe/... header, or make one")
            lines = text.count("\n")
            head = "\n".join(text.split("\n")[:20])
            reason = PY_REASON if name.endswith(".py") else REASON
            if lines > LIMIT and not reason.search(head):
                problems.append(f"{os.path.relpath(path, root)}: {lines} lines, over {LIMIT}, "
                                "and no 'Why this file is long:' line at its top; split it "
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
