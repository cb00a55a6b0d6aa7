#!/usr/bin/env python3
"""Packs what it takes to build troupe's Python module (python/src/*.cpp) on another machine
whose Python is another version (scripts/gpu-check.sh prepare; the GPU machine's PyTorch runs
under its own python3, not Debian's 3.11).

    scripts/gpu_pykit.py BUILD KIT LIBDIR

A module compiled for one Python minor version loads only into that one, and no Python 3.12
headers come with Debian 12, so the module's sources are compiled there, against that machine's
Python and pybind11; everything else is this build's: its static libraries (debug info stripped),
the headers the sources read (found by the compiler's own dependency list, -M), and the shared
libraries it links (already in LIBDIR, the bundle's). KIT/build-native.sh does the compiles and the
link there.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    build, kit, libdir = (os.path.abspath(a) for a in sys.argv[1:])
    source = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    entries = [e for e in json.load(open(os.path.join(build, "compile_commands.json")))
               if "/python/src/" in e["file"] and e["file"].endswith(".cpp")]
    if not any(e["file"].endswith("python/src/native.cpp") for e in entries):
        print("gpu_pykit: %s did not build python/src/native.cpp (pybind11-dev, python3-dev)" %
              build, file=sys.stderr)
        return 2
    shutil.rmtree(kit, ignore_errors=True)
    os.makedirs(kit)
    # Every source of the module compiles with the same flags (one CMake target): the first's.
    argv = shlex.split(entries[0]["command"])
    flags = []
    skip = False
    for a in argv[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c"):
            skip = True
            continue
        if a == "-isystem":
            skip = True  # Python's own headers: the other machine's
            continue
        flags.append(a)

    # The headers the sources read: the repository's travel with it; the build's generated ones
    # and the system's (capnp, kj, spdlog, fmt, ...) are copied, keeping their paths.
    headers = []
    for entry in entries:
        compile_only = []
        skip = False
        for a in shlex.split(entry["command"])[1:]:
            if skip or a == "-c":
                skip = False
                continue
            if a == "-o":
                skip = True
                continue
            compile_only.append(a)
        deps = subprocess.run([argv[0], "-M"] + compile_only, capture_output=True, text=True,
                              cwd=entry["directory"])
        if deps.returncode != 0:
            print(deps.stderr, file=sys.stderr)
            return 1
        for h in deps.stdout.replace("\\\n", " ").split(":", 1)[1].split():
            headers.append(os.path.normpath(os.path.join(entry["directory"], h)))
    headers = list(dict.fromkeys(headers))
    system_prefixes = ("/usr/include/c++/", "/usr/include/x86_64-linux-gnu/", "/usr/lib/gcc/",
                       "/usr/include/python3", "/usr/include/pybind11/")
    own = ("capnp/", "kj/", "spdlog/", "fmt/", "nlohmann/", "CLI/", "uv", "opencv4/", "openssl/",
           "thrust/", "cub/", "libcuckoo/", "zlib.h", "zconf.h", "uv.h", "cblas.h", "openblas",
           "turbojpeg.h")
    copied = 0
    for h in headers:
        if h.startswith(build + "/"):
            dest = os.path.join(kit, "gen", os.path.relpath(h, build))
        elif h.startswith("/usr/include/") and not h.startswith(system_prefixes):
            rel = os.path.relpath(h, "/usr/include")
            if not rel.startswith(own):
                continue  # the C library's, which the other machine has
            dest = os.path.join(kit, "include", rel)
        else:
            continue
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(h, dest)
        copied += 1
        if h == "/usr/include/capnp/blob.h":
            # Cap'n Proto 0.9.2 compares `const char* == kj::StringPtr`, which g++ 13 rejects in
            # C++20 (no such operator once reversed candidates count); StringPtr on the left is
            # the same comparison, and what later Cap'n Proto releases write.
            with open(dest) as f:
                text = f.read()
            text = text.replace("{ return a == b.asString(); }", "{ return b.asString() == a; }")
            text = text.replace("{ return a != b.asString(); }", "{ return !(b.asString() == a); }")
            with open(dest, "w") as f:
                f.write(text)

    def place(path):
        # A path of the compile command, as build-native.sh spells it there.
        if path.startswith(build + "/"):
            return "$KIT/gen/" + os.path.relpath(path, build)
        if path.startswith(source + "/"):
            return "$REPO/" + os.path.relpath(path, source)
        return path

    cflags = []
    for a in flags:
        if a.startswith("-I"):
            cflags.append("-I" + place(a[2:]))
        elif a in ("-g",):
            continue
        else:
            cflags.append(a)
    cflags.append("-I$KIT/include")

    # The link: this build's command for the module, with its static libraries copied (stripped)
    # and its shared ones taken from LIBDIR by their sonames; CUDA's from the other machine.
    link = subprocess.run(["ninja", "-t", "commands"], capture_output=True, text=True,
                          cwd=build).stdout
    line = next((l for l in link.splitlines() if "-o python/troupe/_native" in l), None)
    if line is None:
        print("gpu_pykit: no link command for the module in %s" % build, file=sys.stderr)
        return 1
    words = shlex.split(line.split("&&")[1])
    libs = []
    os.makedirs(os.path.join(kit, "lib"))
    for w in words:
        if w.endswith(".a") and not w.startswith("/usr/"):
            name = os.path.basename(w)
            shutil.copy2(os.path.join(build, w), os.path.join(kit, "lib", name))
            subprocess.run(["strip", "--strip-debug", os.path.join(kit, "lib", name)], check=True)
            libs.append("$KIT/lib/" + name)
        elif re.search(r"/lib(cudart|cublas|cublasLt|culibos|cudadevrt|cudart_static)\b", w):
            base = os.path.basename(w)
            libs.append("$CUDA_LIB/" + base)
        elif ".so" in w and w.startswith("/"):
            soname = subprocess.run(["objdump", "-p", w], capture_output=True, text=True).stdout
            m = re.search(r"SONAME\s+(\S+)", soname)
            name = m[1] if m else os.path.basename(w)
            if not os.path.exists(os.path.join(libdir, name)):
                shutil.copy2(os.path.realpath(w), os.path.join(libdir, name))
            libs.append("$LIBDIR/" + name)
        elif w.endswith(".a"):
            libs.append(w)  # libdl.a, librt.a, libpthread.a: the C library's, there too
        elif w.startswith("-l"):
            libs.append(w)
    libs = list(dict.fromkeys(libs))  # once each, in order
    script = """#!/bin/sh
# Builds troupe._native for this machine's python3 (made by scripts/gpu_pykit.py): compiles the
# module's sources against this Python's headers and pybind11, links the kit's static libraries
# and the bundle's shared ones. Usage: build-native.sh REPO CUDA_LIB OUT_DIR
# DT_RPATH (--disable-new-dtags), not RUNPATH: it also finds what the bundle's libraries load
# (OpenCV's libGLX), which a RUNPATH would leave to a system that may not have it.
set -e
KIT=$(cd "$(dirname "$0")" && pwd)
LIBDIR=%(libdir)s
REPO=$1
CUDA_LIB=$2
OUT=$3
PYTHON=${PYTHON:-python3}
# pybind11 from the Python's own package where it has one, else the system's headers.
PY_INCLUDES=$("$PYTHON" -m pybind11 --includes 2>/dev/null) ||
  PY_INCLUDES="-I$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
SUFFIX=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
mkdir -p "$OUT/troupe"
cp "$REPO"/python/troupe/*.py "$OUT/troupe/"
OBJECTS=
for SRC in %(sources)s; do
  c++ %(cflags)s $PY_INCLUDES -o "$OUT/$SRC.o" -c "$REPO/python/src/$SRC.cpp"
  OBJECTS="$OBJECTS $OUT/$SRC.o"
done
c++ -fPIC -O2 -shared -o "$OUT/troupe/_native$SUFFIX" $OBJECTS -L"$CUDA_LIB" \\
  -Wl,--disable-new-dtags -Wl,-rpath,"$LIBDIR" -Wl,-rpath,"$CUDA_LIB" %(libs)s
echo "build-native.sh: $OUT/troupe/_native$SUFFIX"
""" % {"libdir": libdir, "cflags": " ".join(cflags), "libs": " ".join(libs),
       "sources": " ".join(os.path.splitext(os.path.basename(e["file"]))[0] for e in entries)}
    with open(os.path.join(kit, "build-native.sh"), "w") as f:
        f.write(script)
    os.chmod(os.path.join(kit, "build-native.sh"), 0o755)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(kit) for f in fs)
    print("gpu_pykit: %s: %d headers, %d libraries, %.1f MB" % (kit, copied, len(libs),
                                                                 size / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
