#!/usr/bin/env bash
# An app outside troupe's tree, against an installed troupe (issue 10, point 1):
#   1. `cmake --install` troupe's build into a temporary prefix;
#   2. every installed header compiles from the prefix alone (no private header leaked out, none
#      missing), and a typed spawn of an interface that is not an actor's does not compile;
#   3. examples/greeter, copied out of the tree, configures with find_package(troupe) and the
#      prefix only, and builds (one job);
#   4. the same app configures with add_subdirectory(troupe) instead (a subproject);
#   5. the installed `troupe sim` runs it: exit 0 and one greeting from each of the 3 instances;
#   6. examples/images (the data plane: troupe::dataset, troupe::images) builds the same way and
#      trains on an ImageFolder made by make_images: every sample once, better than chance.
# The temporary folder is removed on every exit.
#
# usage: package_test.sh BUILD_DIR SOURCE_DIR CXX_COMPILER [COMPILER_LAUNCHER]
set -euo pipefail
build=$1 source=$2 cxx=$3 launcher=${4:-}
tmp=$(mktemp -d /tmp/troupe-package-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" ||
  { cat "$tmp/install.log"; fail "cmake --install $build did not complete"; }
for f in bin/troupe include/troupe.capnp include/troupe.capnp.h include/troupe/troupe.h \
         include/troupe/sched/placement.h lib/cmake/troupe/troupeConfig.cmake \
         lib/cmake/troupe/troupeConfigVersion.cmake lib/cmake/troupe/TroupeCapnp.cmake; do
  [[ -e $prefix/$f ]] || fail "the install has no $f"
done
echo "ok: installed into a temporary prefix ($(find "$prefix" -type f | wc -l) files)"

# Every public header, from the prefix and the system's include folders only.
(cd "$prefix/include" && find troupe -name '*.h' | sort | sed 's/.*/#include "&"/') > "$tmp/all.cpp"
"$cxx" -std=c++20 -fsyntax-only -I"$prefix/include" "$tmp/all.cpp" ||
  fail "the installed headers do not compile from the prefix alone (a private header included?)"
echo "ok: $(wc -l < "$tmp/all.cpp") installed headers compile from the prefix alone"

# Typed spawns take actor interfaces only: troupe.capnp's Watcher does not extend Actor.
cat > "$tmp/not_an_actor.cpp" <<'CPP'
#include "troupe/troupe.h"
void spawnWatcher(troupe::Driver& job) { job.spawn<troupe::proto::Watcher>(troupe::Placement::any()); }
CPP
if "$cxx" -std=c++20 -fsyntax-only -I"$prefix/include" "$tmp/not_an_actor.cpp" > "$tmp/not_an_actor.log" 2>&1; then
  fail "job.spawn<troupe::proto::Watcher>(placement) compiled; only actor interfaces may be spawned"
fi
grep -q "an actor interface extends troupe's Actor" "$tmp/not_an_actor.log" ||
  { cat "$tmp/not_an_actor.log"; fail "spawning a non-actor interface failed without troupe's message"; }
echo "ok: spawning a non-actor interface does not compile, with troupe's message"

cp -r "$source/examples/greeter" "$tmp/src"
cmake -S "$tmp/src" -B "$tmp/greeter" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" \
  ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher"} > "$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; fail "examples/greeter does not configure with find_package(troupe)"; }
grep -q "troupe_DIR:PATH=$prefix/" "$tmp/greeter/CMakeCache.txt" ||
  fail "find_package(troupe) found a troupe other than the installed one: $(grep troupe_DIR "$tmp/greeter/CMakeCache.txt")"
cmake --build "$tmp/greeter" -j 1 > "$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; fail "examples/greeter does not build against the installed troupe"; }
echo "ok: examples/greeter configured and built out of tree against the prefix"

# As a subproject: the same app with add_subdirectory(troupe's source) instead of find_package
# configures and generates (every target it links resolves; building it is the tree's own build).
mkdir "$tmp/sub"
cp "$source/examples/greeter/greeter.capnp" "$source/examples/greeter/main.cpp" "$tmp/sub/"
cat > "$tmp/sub/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(greeter_sub LANGUAGES C CXX)
add_subdirectory("$source" troupe)
troupe_capnp(greeter_proto FILES greeter.capnp)
add_executable(greeter main.cpp)
target_link_libraries(greeter PRIVATE greeter_proto troupe::runtime)
CMAKE
cmake -S "$tmp/sub" -B "$tmp/sub-build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" \
  > "$tmp/sub.log" 2>&1 ||
  { cat "$tmp/sub.log"; fail "examples/greeter does not configure with add_subdirectory(troupe)"; }
for option in TROUPE_BUILD_TESTS TROUPE_BUILD_APPS; do
  grep -q "^$option:BOOL=OFF" "$tmp/sub-build/CMakeCache.txt" ||
    fail "as a subproject $option should default to OFF (an including project builds the runtime)"
done
echo "ok: examples/greeter configures with add_subdirectory(troupe) (tests and apps off)"

status=0
"$prefix/bin/troupe" sim -- "$tmp/greeter/greeter" package > "$tmp/run.log" 2>&1 || status=$?
cat "$tmp/run.log"
[[ $status == 0 ]] || fail "the installed troupe sim ran greeter with exit $status, not 0"
greetings=$(grep -c "greeter: hello, package from algo-" "$tmp/run.log" || true)
[[ $greetings == 3 ]] || fail "expected one greeting from each of 3 instances, saw $greetings"
grep -q "greeter: 3 greeter.Greeter actors answered" "$tmp/run.log" ||
  fail "the driver did not report 3 greeter.Greeter actors (the typed registration's name)"
echo "ok: the installed troupe sim ran greeter: exit 0, 3 greetings"

# The data plane from outside (docs/data.md): examples/images, copied out of the tree, links
# troupe::dataset and troupe::images and reads an ImageFolder made here on the data group.
cp -r "$source/examples/images" "$tmp/images-src"
cmake -S "$tmp/images-src" -B "$tmp/images" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" \
  ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher"} > "$tmp/images-configure.log" 2>&1 ||
  { cat "$tmp/images-configure.log"; fail "examples/images does not configure with find_package(troupe)"; }
cmake --build "$tmp/images" -j 1 > "$tmp/images-build.log" 2>&1 ||
  { cat "$tmp/images-build.log"; fail "examples/images does not build against the installed troupe"; }
"$build/apps/hetero_train/make_images" "$tmp/data" --samples 1000 --test-samples 200 > /dev/null ||
  fail "make_images could not make the ImageFolder"
status=0
"$prefix/bin/troupe" sim --group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge \
  -- "$tmp/images/centroids" "$tmp/data/train" "$tmp/data/test" > "$tmp/images.log" 2>&1 ||
  status=$?
grep "centroids:\|troupe sim:" "$tmp/images.log"
[[ $status == 0 ]] || { cat "$tmp/images.log"; fail "the installed troupe sim ran centroids with exit $status, not 0"; }
grep -q "centroids: 1000 of 1000 training samples, every one once: yes" "$tmp/images.log" ||
  fail "centroids did not read every training sample once"
accuracy=$(sed -n 's/.*test accuracy \([0-9.]*\) on 200 samples.*/\1/p' "$tmp/images.log")
[[ -n $accuracy ]] && awk "BEGIN { exit !($accuracy > 0.3) }" ||
  fail "centroids' test accuracy is '$accuracy', not above 0.3 (chance is 0.1)"
echo "ok: examples/images built out of tree and trained on an ImageFolder: accuracy $accuracy"
