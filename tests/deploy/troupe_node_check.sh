#!/bin/bash
# deploy/troupe-node, the per-instance restart loop, against a stand-in app whose every process
# ends as told: which endings start it again (a worker killed by a signal, or exiting 3, 7 or 70;
# never a head, never once troupe-node was signalled, never beyond --restarts), the host's final
# code (the last process's; the one before it when a restart exited 5), a process killed before it
# wrote its role (started again), TROUPE_INCARNATION and
# TROUPE_ROLE_FILE, the restart lines, SIGTERM/SIGINT passed on once (not under a Slurm step,
# whose signal reaches the app itself), and no child left behind. tests/slurm/run.sh runs it
# under a real Slurm.
#
# usage: troupe_node_check.sh TROUPE_NODE
set -uo pipefail
node=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The stand-in: `app ROLE ENDING...` writes ROLE to its role file and ends as ENDING[incarnation]:
# a number (exit with it), kill (SIGKILL itself), term and int (SIGTERM or SIGINT itself, untrapped:
# a stop that reached the app alone), none (no role written, then SIGKILL), wait
# (count the SIGTERMs and SIGINTs it gets for 0.5 s after the first, log them, exit 6; 1 after
# 20 s without one), or wait-kill (the same, but SIGKILL itself instead of exit 6).
cat > "$dir/app" << 'APP'
#!/bin/bash
role=$1
shift
endings=("$@")
ending=${endings[$TROUPE_INCARNATION]:-0}
[[ $ending == none ]] || echo "$role" > "$TROUPE_ROLE_FILE"
# (What a child of this bash inherits: bash itself ignores SIGQUIT while it runs.)
ignored=$(sed -n 's/^SigIgn:\t//p' /proc/self/status)
echo "start $TROUPE_INCARNATION pid=$$ ignored=$ignored" >> "$APP_LOG"
case $ending in
  kill | none) kill -KILL $$ ;;
  term) trap - TERM; kill -TERM $$ ;;
  int) trap - INT; kill -INT $$ ;;
  wait | wait-kill)
    got=()
    trap 'got+=(TERM)' TERM
    trap 'got+=(INT)' INT
    end=$((SECONDS + 20))
    while ((SECONDS < end)); do
      if ((${#got[@]} > 0)); then
        sleep 0.5
        echo "got ${got[*]}" >> "$APP_LOG"
        [[ $ending == wait ]] || kill -KILL $$
        exit 6
      fi
      sleep 0.05
    done
    exit 1 ;;
  *) exit "$ending" ;;
esac
APP
chmod +x "$dir/app"

failures=0
checks=0
check() {  # WHAT CONDITION...
  local what=$1
  shift
  checks=$((checks + 1))
  if ! "$@"; then
    echo "FAILED: $what"
    echo "  stderr: $(tr '\n' '|' < "$dir/err")"
    echo "  app:    $(tr '\n' '|' < "$dir/log")"
    failures=$((failures + 1))
  fi
}
run() {  # [ENV=VALUE...] -- NODE_ARGS...: runs troupe-node in the foreground; sets rc
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  : > "$dir/log"
  env -u SLURM_STEP_ID -u TROUPE_NODE_RESTARTS -u TROUPE_NODE_FORWARD APP_LOG="$dir/log" \
    "${envs[@]}" "$node" "$@" 2> "$dir/err"
  rc=$?
}
restarts() { grep -c 'starting it again' "$dir/err"; }
starts() { grep -c '^start ' "$dir/log"; }
eq() { [[ $1 == "$2" ]]; }
has() { grep -qF -- "$1" "$2"; }

# -- which endings start the app again, and the final code --

run -- -- "$dir/app" worker kill 0
check "a worker killed by SIGKILL is started again, and its restart's 0 is the host's code" \
  eq "$rc $(restarts) $(starts)" "0 1 2"
check "the restart line" has \
  "troupe-node: app (worker) was killed by SIGKILL; starting it again (restart 1 of 2)" "$dir/err"
check "TROUPE_INCARNATION counts 0, 1" eq "$(grep -o '^start [0-9]*' "$dir/log" | tr '\n' ' ')" \
  "start 0 start 1 "

run -- -- "$dir/app" worker 3 7 70
check "3, 7 and 70 are started again, up to 2 restarts; the last code stays" \
  eq "$rc $(restarts) $(starts)" "70 2 3"
check "the line for exit 7" has \
  "app (worker) exited 7 (FENCED); starting it again (restart 2 of 2)" "$dir/err"
check "the line when no restart is left" has "exited 70 (INTERNAL_ERROR); no restarts left" \
  "$dir/err"

run -- -- "$dir/app" worker kill 5
check "a restart that exited 5 (JOIN_FAILED) gives the code before it" eq "$rc $(starts)" "137 2"

run -- -- "$dir/app" worker 3 5
check "likewise after HEAD_LOST" eq "$rc $(starts)" "3 2"

run -- -- "$dir/app" worker 5
check "a first process's 5 is its code" eq "$rc $(starts)" "5 1"

run -- -- "$dir/app" head kill 0
check "a head is never started again" eq "$rc $(starts)" "137 1"

# A stop is never restarted: a worker SIGTERM or SIGINT killed (sent to the app alone, or before
# it took the signals) ends the host with that signal's code.
run -- -- "$dir/app" worker term 0
check "a worker killed by SIGTERM is not started again" eq "$rc $(starts)" "143 1"
run -- -- "$dir/app" worker int 0
check "nor one killed by SIGINT" eq "$rc $(starts)" "130 1"

# Killed before it wrote its role (the first second of a process that would be a worker or the
# head): nothing of the job hangs on it yet, so it is started again (real Slurm: the job ended
# FAILED with only srun's "exit code 137" when it was not).
run -- -- "$dir/app" worker none 0
check "a process killed before it wrote its role is started again" eq "$rc $(starts)" "0 2"
check "its restart line says so" has \
  "app (killed before it knew its role) was killed by SIGKILL; starting it again" "$dir/err"
run -- -- "$dir/app" head none 0
check "so is a head killed before it knew it is the head" eq "$rc $(starts)" "0 2"

for code in 0 1 2 4 6; do
  run -- -- "$dir/app" worker "$code" 0
  check "a worker's exit $code is final" eq "$rc $(starts)" "$code 1"
done

run -- --restarts 0 -- "$dir/app" worker kill 0
check "--restarts 0" eq "$rc $(starts)" "137 1"

run TROUPE_NODE_RESTARTS=3 -- -- "$dir/app" worker kill kill kill 0
check "TROUPE_NODE_RESTARTS=3" eq "$rc $(starts)" "0 4"

run -- --restarts 3 -- "$dir/app" worker kill kill kill kill
check "--restarts 3, all used" eq "$rc $(starts)" "137 4"
check "the line when they are used up names the code the host ends with" has \
  "app (worker) was killed by SIGKILL; no restarts left (--restarts 3): this host ends 137" \
  "$dir/err"

run -- --restarts x -- "$dir/app" worker 0
check "a bad --restarts is exit 2" eq "$rc $(starts)" "2 0"
run -- "$dir/app" worker 0
check "no -- is exit 2" eq "$rc $(starts)" "2 0"

# -- signals --

# Job control: a background job's SIGINT stays as it was (not ignored), as under srun or a pod.
set -m
app_pid() { sed -n 's/^start [0-9]* pid=\([0-9]*\).*/\1/p' "$dir/log" | tail -n 1; }
signal() {  # SIGNAL TARGET(node|group) [ENV=VALUE...] -- APP_ARGS...: sets rc, got, took
  local sig=$1 target=$2 envs=() pid i
  shift 2
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  : > "$dir/log"
  env -u SLURM_STEP_ID -u TROUPE_NODE_RESTARTS -u TROUPE_NODE_FORWARD APP_LOG="$dir/log" \
    "${envs[@]}" "$node" -- "$dir/app" "$@" 2> "$dir/err" &
  pid=$!
  for ((i = 0; i < 100; i++)); do
    grep -q '^start' "$dir/log" && break
    sleep 0.05
  done
  sleep 0.2
  sent=$SECONDS
  if [[ $target == group ]]; then kill -"$sig" -- "-$pid"; else kill -"$sig" "$pid"; fi
  if [[ ${quiet_check:-} == 1 ]]; then  # nothing reaches the app: see, then stop it ourselves
    sleep 0.8
    got=$(grep '^got' "$dir/log")
    kill -TERM "$(app_pid)"
  fi
  wait "$pid"
  rc=$?
  took=$((SECONDS - sent))
  [[ ${quiet_check:-} == 1 ]] || got=$(grep '^got' "$dir/log")
}
signal TERM node -- worker wait 0
check "SIGTERM to troupe-node reaches the app once; it is not started again" \
  eq "$rc $(starts) $got" "6 1 got TERM"
signal INT node -- worker wait 0
check "SIGINT likewise" eq "$rc $(starts) $got" "6 1 got INT"
# SIGINT's bit (2) of the app's SigIgn mask; other bits are whatever this test's caller ignores.
ignored=$(sed -n 's/^start 0 pid=[0-9]* ignored=//p' "$dir/log")
check "the app does not inherit an ignored SIGINT" \
  eq "$(( (16#${ignored:-0} >> 1) & 1 ))" "0"
signal TERM group SLURM_STEP_ID=0 -- worker wait 0
check "under a Slurm step (the signal reaches every process) the app gets it once" \
  eq "$rc $got" "6 got TERM"
signal TERM node SLURM_STEP_ID=0 TROUPE_NODE_FORWARD=always -- worker wait 0
check "TROUPE_NODE_FORWARD=always passes it on under a Slurm step too" eq "$rc $got" "6 got TERM"
quiet_check=1 signal TERM node SLURM_STEP_ID=0 -- worker wait 0
check "under a Slurm step, a SIGTERM to troupe-node alone is not passed on" \
  eq "$rc $(starts) ${got:-nothing}" "6 1 nothing"
quiet_check=1 signal TERM node TROUPE_NODE_FORWARD=never -- worker wait 0
check "TROUPE_NODE_FORWARD=never does not pass it on" eq "$rc ${got:-nothing}" "6 nothing"
signal TERM node -- worker wait-kill 0
check "an app killed after troupe-node got SIGTERM is not started again" \
  eq "$rc $(starts) $(restarts)" "137 1 0"
signal HUP node -- worker wait 0
check "troupe-node ended by SIGHUP kills the app at once" \
  eq "$rc $((took < 5)) $(kill -0 "$(app_pid)" 2> /dev/null && echo running)" "129 1 "
set +m

if ((failures > 0)); then
  echo "$failures of $checks failed"
  exit 1
fi
echo "$checks passed"
