#!/bin/sh
# runtime-libs.sh OUT BINARY...: what the image's runtime stage needs for BINARY... to start.
#
# Reads every shared library the binaries link (ldd: direct and indirect) and sorts each one:
#   - owned by a Debian package: the package goes to OUT/packages, for the runtime stage to
#     install. On Debian 12's merged /usr a file has two paths (/lib/... and /usr/lib/...) and
#     dpkg knows only the one its package ships (libc6: /lib, libcapnp: /usr/lib), so both
#     spellings of the path ldd prints and of the file it resolves to are asked;
#   - under /usr/local/cuda (NVIDIA's toolkit, no package here): the file is copied once, under
#     the name the binaries ask for (its soname), to OUT/lib;
#   - neither, or not found at all: the build fails, naming the library.
# So the list follows the binaries and cannot drift, and a missing library fails the build.
set -eu
out=$1
shift
mkdir -p "$out/lib"
: > "$out/packages"
libs=$(ldd "$@") || { echo "runtime-libs.sh: ldd failed on $*" >&2; exit 1; }
if echo "$libs" | grep -q "not found"; then
  echo "runtime-libs.sh: the binaries link libraries that are not here:" >&2
  echo "$libs" | grep "not found" >&2
  exit 1
fi
echo "$libs" | awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
  real=$(readlink -f "$path")
  owner=
  for p in "$path" "$real"; do
    for q in "$p" "${p#/usr}" "/usr${p#/usr}"; do
      [ -z "$owner" ] || break
      owner=$(dpkg -S "$q" 2>/dev/null | head -n 1) || owner=
    done
  done
  if [ -n "$owner" ]; then
    echo "${owner%%:*}" >> "$out/packages"
  else
    case "$real" in
      /usr/local/cuda*) cp "$real" "$out/lib/$name" ;;
      *) echo "runtime-libs.sh: $name ($real) belongs to no Debian package and is not CUDA's;" \
              "the runtime stage would not have it" >&2
         exit 1 ;;
    esac
  fi
done
sort -u -o "$out/packages" "$out/packages"
echo "runtime-libs.sh: packages: $(tr '\n' ' ' < "$out/packages")"
echo "runtime-libs.sh: copied: $(ls "$out/lib" | tr '\n' ' ')"
