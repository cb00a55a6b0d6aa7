#!/bin/bash
# deploy/slurm/troupe-hetjob.sbatch gives every task the job secret as a file of mode 0600 in the
# job's folder, by its path (TROUPE_TOKEN_FILE), never the secret itself in the environment or on
# the command line; the file is gone when the job ends. Each hetjob component's tasks get its own
# TROUPE_LABELS_<n> / TROUPE_RESOURCES_<n> / TROUPE_VCPUS_<n> as TROUPE_LABELS / TROUPE_RESOURCES /
# TROUPE_VCPUS, and every task runs under troupe-node (no --kill-on-bad-exit), found beside the
# submitted script although the script runs as a copy in slurmd's spool. `srun` is a stand-in
# that reports what a task would get, `scontrol` one that names the submitted script.
# tests/slurm/run.sh runs the script under a real Slurm.
#
# usage: slurm_check.sh SBATCH_SCRIPT
set -euo pipefail
script=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/bin" "$dir/submit"
cat > "$dir/bin/srun" <<'SRUN'
#!/bin/bash
secret=$(cat "$TROUPE_TOKEN_FILE")
echo "file=$TROUPE_TOKEN_FILE mode=$(stat -c %a "$TROUPE_TOKEN_FILE") length=${#secret}"
if env | grep -q '^TROUPE_TOKEN='; then echo "TROUPE_TOKEN is in the environment"; fi
if env | grep -qF "$secret"; then echo "the secret is in the environment"; fi
case "$*" in *"$secret"*) echo "the secret is on the command line" ;; esac
printf '%s\n' "$*" > "$(dirname "$0")/args"
SRUN
printf '#!/bin/bash\necho "   Command=%s app --epochs 1"\n' "$script" > "$dir/bin/scontrol"
chmod +x "$dir/bin/srun" "$dir/bin/scontrol"
# As slurmd runs it: a copy in its spool folder.
mkdir "$dir/spool"
cp "$script" "$dir/spool/slurm_script"
out=$(cd "$dir/submit" && env -u TROUPE_TOKEN_FILE -u TROUPE_NODE -u TROUPE_VCPUS \
  PATH="$dir/bin:$PATH" SLURM_SUBMIT_DIR="$dir/submit" SLURM_JOB_ID=7 \
  TROUPE_LABELS_0=zone=a,disk=nvme TROUPE_RESOURCES_1=fpga=2 TROUPE_VCPUS_1=2 \
  bash "$dir/spool/slurm_script" app --epochs 1)
echo "$out"
fail=0
[[ $out == "file=$dir/submit/.troupe-secret-7 mode=600 length=32" ]] || fail=1
args=$(cat "$dir/bin/args")
node=$(dirname "$(dirname "$script")")/troupe-node
want="--het-group=0 env TROUPE_LABELS=zone=a,disk=nvme TROUPE_RESOURCES= TROUPE_VCPUS= $node -- app"
want+=" --epochs 1 : --het-group=1 env TROUPE_LABELS= TROUPE_RESOURCES=fpga=2 TROUPE_VCPUS=2 $node"
want+=" -- app --epochs 1"
if [[ $args != "$want" ]]; then echo "srun got: $args"; echo "expected: $want"; fail=1; fi
if [[ -n $(ls -A "$dir/submit") ]]; then echo "left in the job's folder: $(ls -A "$dir/submit")"; fail=1; fi
if (( fail )); then echo "1 failed"; exit 1; fi
echo "2 passed"
