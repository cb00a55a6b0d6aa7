#!/bin/bash
# troupe under a real Slurm on this one machine (`make test-slurm`; docs/deploy.md, "Slurm
# heterogeneous jobs"). It starts a private Slurm cluster: munged (unless one already answers),
# MariaDB and slurmdbd (so that sacct works), slurmctld and two slurmd, `-N n1` and `-N n2`, both
# on localhost with ports of their own; then submits deploy/slurm/troupe-hetjob.sbatch as a
# heterogeneous job (component 0: data_group on n1, component 1: dnn_group on n2) running a small
# hetero_train, three times:
#
#   (a) a normal job: sacct says COMPLETED, and every epoch trained on every sample once (the
#       head's epoch lines: 0 duplicates, 0 missing; the report's digest: each id exactly once);
#   (b) the data node's app process (the hetero_train child of troupe-node on n1) killed with
#       kill -9 once training has started: troupe-node starts it again, the job still COMPLETED,
#       every sample once;
#   (c) scancel while training: every task exits 6 (INTERRUPTED) and no troupe process is left;
#   (d) the data node's process killed with kill -9 in its first seconds, before it wrote its role
#       file (the app started through a wrapper that waits 3 s on n1 first): troupe-node starts it
#       again all the same, and the job COMPLETED, every sample once (it ended FAILED with only
#       srun's "exit code 137" before).
#
# Each case prints PASS or FAIL with the reason; the script exits 0 only when all four pass.
# Where this machine cannot run Slurm (not root, no package source, no free ports) it prints one
# line, `SKIP: <reason>`, and exits 77, troupe's skip status (.ci/run reports it as a skip, never a
# pass). A daemon that does not come up from the configuration written here is a failure: `FAIL:`,
# the daemon's last log line, exit 1, and the logs kept. Missing Debian packages (slurm-wlm,
# munge, slurmdbd, mariadb-server, dataset-fashion-mnist) are installed with apt-get. Every daemon
# and process it started is stopped on every way out; its folder (/tmp/troupe-slurm.*) is removed,
# or kept with the logs when a case failed (TROUPE_SLURM_KEEP=1: always).
#
# usage: tests/slurm/run.sh BUILD_DIR    (the binaries: BUILD_DIR/apps/hetero_train/hetero_train)
set -uo pipefail
export PATH=$PATH:/usr/sbin:/sbin

repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-}
if [[ -z $build || $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
data=/usr/share/datasets/fashion-mnist
sbatch_script=$repo/deploy/slurm/troupe-hetjob.sbatch
samples=12000
t_start=$SECONDS

keep=${TROUPE_SLURM_KEEP:-0}
# Nothing from the caller's environment may choose the cluster or the secret.
for v in $(compgen -e); do
  case $v in TROUPE_* | SLURM_* | SBATCH_* | SRUN_* | SALLOC_*) unset "$v" ;; esac
done

say() { echo "test-slurm: $*"; }
skip() {  # this machine cannot run it: a skip, never a pass
  echo "SKIP: $*"
  exit 77
}
setup_failed() {  # a daemon did not come up from our own configuration: a failure, logs kept
  echo "FAIL: $*"
  failed=1
  exit 1
}

# -- cleanup, on every way out --

dir=
apt_log=
daemons=()  # "name pid", in start order; stopped in reverse
jobs=()
munged_pid=
failed=0
stop_pid() {  # NAME PID: SIGTERM, up to 10 s, then SIGKILL; reaps it (all are our children)
  local name=$1 pid=$2 i
  kill -0 "$pid" 2> /dev/null || { wait "$pid" 2> /dev/null; return; }
  kill -TERM "$pid" 2> /dev/null
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2> /dev/null; then
    echo "test-slurm: $name (pid $pid) ignored SIGTERM for 10 s; SIGKILL" >&2
    kill -KILL "$pid" 2> /dev/null
  fi
  wait "$pid" 2> /dev/null
}
our_processes() {  # pids of the job's processes: troupe-node and hetero_train from our bin/
  [[ -n $dir ]] && pgrep -f "$dir/bin/hetero_train"
}
our_stepds() {  # slurmstepd processes of this cluster (their environment names our slurm.conf)
  local p
  for p in $(pgrep -x slurmstepd); do
    if tr '\0' '\n' 2> /dev/null < "/proc/$p/environ" | grep -qxF "SLURM_CONF=$dir/etc/slurm.conf"
    then echo "$p"; fi
  done
}
cleanup() {
  local rc=$? i entry p
  trap - EXIT INT TERM HUP
  [[ -z $apt_log ]] || rm -f "$apt_log"
  if ((${#jobs[@]} > 0)) && [[ -n ${SLURM_CONF:-} ]]; then
    scancel "${jobs[@]}" 2> /dev/null
    for ((i = 0; i < 100; i++)); do
      [[ -z $(squeue -h -j "$(IFS=,; echo "${jobs[*]}")" 2> /dev/null) ]] && break
      sleep 0.1
    done
  fi
  for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do
    entry=${daemons[i]}
    stop_pid "${entry% *}" "${entry##* }"
  done
  if [[ -n $dir ]]; then
    for p in $(our_stepds) $(our_processes); do
      echo "test-slurm: left behind: $(ps -o pid=,args= -p "$p" 2> /dev/null); SIGKILL" >&2
      kill -KILL "$p" 2> /dev/null
    done
    if ((rc != 0 || failed)) || [[ $keep == 1 ]]; then
      rm -rf "${dir:?}/db" "${dir:?}/bin"
      echo "test-slurm: logs kept in $dir" >&2
    else
      rm -rf "$dir"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# -- what it needs --

[[ $(id -u) == 0 ]] || skip "Slurm's daemons need root (slurmd starts each task as its user)"
app_src=$build/apps/hetero_train/hetero_train
if [[ ! -x $app_src ]]; then
  echo "FAIL: $app_src is missing; build first (make build)"
  exit 1
fi
command -v python3 > /dev/null || skip "python3 is missing (make deps installs it)"

packages=()
for c in slurmctld slurmd sbatch sacct; do
  command -v "$c" > /dev/null || { packages+=(slurm-wlm); break; }
done
command -v munged > /dev/null || packages+=(munge)
command -v slurmdbd > /dev/null || packages+=(slurmdbd)
command -v mariadbd > /dev/null || packages+=(mariadb-server)
[[ -f $data/train-images-idx3-ubyte.gz ]] || packages+=(dataset-fashion-mnist)
if ((${#packages[@]} > 0)); then
  say "installing ${packages[*]} (apt-get)"
  apt_log=$(mktemp /tmp/troupe-slurm-apt.XXXXXX)
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${packages[@]}" > "$apt_log" 2>&1; then
    apt-get update -qq > "$apt_log" 2>&1 &&
      apt-get install -y -qq --no-install-recommends "${packages[@]}" > "$apt_log" 2>&1
    ok=$?
    why=$(grep -E '^(E|W):' "$apt_log" | tail -n 1)
    ((ok == 0)) || skip "apt-get could not install ${packages[*]}: ${why:-see apt-get}"
  fi
fi

dir=$(mktemp -d /tmp/troupe-slurm.XXXXXX) || skip "cannot make a folder in /tmp"
chmod 755 "$dir"  # munged wants every folder above its socket open to all
mkdir -p "$dir/bin" "$dir/etc" "$dir/log" "$dir/state" "$dir/spool" "$dir/job" "$dir/db"

# A copy of the app: the build may be rewriting it (another build in progress).
for ((i = 0; i < 5; i++)); do
  cp "$app_src" "$dir/bin/hetero_train" && cmp -s "$app_src" "$dir/bin/hetero_train" &&
    "$dir/bin/hetero_train" --help > /dev/null 2>&1 && break
  sleep 2
done
if ((i == 5)); then
  echo "FAIL: cannot take a working copy of $app_src (is it being rebuilt?)"
  failed=1
  exit 1
fi

read -r p_db p_dbd p_ctl p_n1 p_n2 p_t1 p_t2 < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(7)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
[[ -n ${p_t2:-} ]] || skip "cannot find free ports on 127.0.0.1"

wait_port() {  # PORT SECONDS PID: until something listens (or PID has exited)
  local port=$1 tries=$(($2 * 10)) pid=$3
  while ((tries-- > 0)); do
    (exec 3<> "/dev/tcp/127.0.0.1/$port") 2> /dev/null && return 0
    kill -0 "$pid" 2> /dev/null || return 1
    sleep 0.1
  done
  return 1
}
last_line() { grep -v '^\s*$' "$1" 2> /dev/null | tail -n 1; }
says() {  # NAME: the last line of its log, else of its output, for a FAIL line
  local line
  line=$(last_line "$dir/log/$1.log")
  [[ -n $line ]] || line=$(last_line "$dir/log/$1.out")
  echo "${line:-(nothing in $dir/log/$1.*)}"
}

# -- munge: the one that runs, else our own with a private key and socket --

if munge -n 2> /dev/null | unmunge > /dev/null 2>&1; then
  munge_socket=/run/munge/munge.socket.2
  say "using the munged that runs ($munge_socket)"
else
  mkdir -m 700 "$dir/munge-key"
  mkdir -m 755 "$dir/munge"
  head -c 1024 /dev/urandom > "$dir/munge-key/key"
  chmod 400 "$dir/munge-key/key"
  munge_socket=$dir/munge/socket
  munged -F --key-file="$dir/munge-key/key" --socket="$munge_socket" \
    --pid-file="$dir/munge/pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed" \
    > "$dir/log/munged.out" 2>&1 &
  munged_pid=$!
  daemons+=("munged $munged_pid")
  for ((i = 0; i < 50; i++)); do
    munge -S "$munge_socket" -n 2> /dev/null | unmunge -S "$munge_socket" > /dev/null 2>&1 && break
    kill -0 "$munged_pid" 2> /dev/null || break
    sleep 0.1
  done
  munge -S "$munge_socket" -n 2> /dev/null | unmunge -S "$munge_socket" > /dev/null 2>&1 ||
    setup_failed "munged did not start: $(says munged)"
fi

# -- accounting (sacct): a private MariaDB and slurmdbd --

mariadbd --no-defaults --datadir="$dir/db" --socket="$dir/mariadb.sock" --port="$p_db" \
  --bind-address=127.0.0.1 --user=root --skip-grant-tables --skip-name-resolve \
  --pid-file="$dir/mariadb.pid" --log-error="$dir/log/mariadb.log" \
  --innodb-buffer-pool-size=16M --innodb-log-file-size=8M > "$dir/log/mariadb.out" 2>&1 &
daemons+=("mariadbd $!")
wait_port "$p_db" 30 "$!" || setup_failed "MariaDB did not start: $(says mariadb)"

export SLURM_CONF=$dir/etc/slurm.conf
cat > "$dir/etc/slurmdbd.conf" << EOF
AuthType=auth/munge
AuthInfo=socket=$munge_socket
DbdHost=localhost
DbdPort=$p_dbd
SlurmUser=root
LogFile=$dir/log/slurmdbd.log
PidFile=$dir/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$p_db
StorageUser=root
StorageLoc=slurm_acct
EOF
chmod 600 "$dir/etc/slurmdbd.conf"

# Two nodes on this one machine: slurmd -N n1 and -N n2, each on a port of its own. Partitions
# named as troupe-hetjob.sbatch asks (cpu, gpu); task/none: tasks are neither bound nor limited.
ncpu=$(nproc)
((ncpu > 4)) && ncpu=4
cat > "$SLURM_CONF" << EOF
ClusterName=troupetest
SlurmctldHost=localhost
SlurmctldPort=$p_ctl
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$p_dbd
AccountingStoragePass=$munge_socket
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
InactiveLimit=0
KillWait=10
MinJobAge=300
SchedulerParameters=bf_interval=1,bf_hetjob_immediate
NodeName=n1 NodeHostname=localhost Port=$p_n1 CPUs=$ncpu State=UNKNOWN
NodeName=n2 NodeHostname=localhost Port=$p_n2 CPUs=$ncpu State=UNKNOWN
PartitionName=cpu Nodes=n1 Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=n2 MaxTime=INFINITE State=UP
EOF

slurmdbd -D > "$dir/log/slurmdbd.out" 2>&1 &
daemons+=("slurmdbd $!")
wait_port "$p_dbd" 30 "$!" || setup_failed "slurmdbd did not start: $(says slurmdbd)"
for ((i = 0; i < 20; i++)); do
  sacctmgr -i add cluster troupetest > "$dir/log/sacctmgr.out" 2>&1 && break
  sleep 0.5
done
((i < 20)) || setup_failed "sacctmgr could not register the cluster: $(says sacctmgr)"

slurmctld -D > "$dir/log/slurmctld.out" 2>&1 &
daemons+=("slurmctld $!")
wait_port "$p_ctl" 30 "$!" || setup_failed "slurmctld did not start: $(says slurmctld)"
for n in n1 n2; do
  slurmd -D -N "$n" > "$dir/log/slurmd-$n.out" 2>&1 &
  daemons+=("slurmd-$n $!")
done
for ((i = 0; i < 300; i++)); do
  states=$(sinfo -h -N -o '%N %t' 2> /dev/null | sort -u | tr '\n' ' ')
  [[ $states == "n1 idle n2 idle " ]] && break
  sleep 0.1
done
[[ $states == "n1 idle n2 idle " ]] ||
  setup_failed "the nodes did not become idle within 30 s (sinfo: ${states:-nothing}): $(says slurmd-n1)"
say "Slurm $(sinfo -V | awk '{print $2}') up in $((SECONDS - t_start)) s: n1 and n2 idle ($dir)"

# -- the job's environment (sbatch passes it on to every task) --

export TROUPE_SLURM_GROUPS=data_group:ml.c5.xlarge,dnn_group:ml.p3.2xlarge
# Both slurmd are this machine: each node name gets an address with a port of its own.
export TROUPE_HOST_MAP=$dir/etc/hosts.json
printf '{"n1": "127.0.0.1:%s", "n2": "127.0.0.1:%s"}\n' "$p_t1" "$p_t2" > "$TROUPE_HOST_MAP"
# task/none: each task would report the whole machine; say what it was given (-c).
export TROUPE_VCPUS_0=$ncpu TROUPE_VCPUS_1=$ncpu

submit_app() {  # NAME APP APP_ARGS...: prints the job id
  local name=$1 app=$2
  shift 2
  (cd "$dir/job" && sbatch --parsable -J "troupe-$name" -o "$dir/job/$name.out" \
    -N1 -c"$ncpu" -w n1 : -N1 -c"$ncpu" -w n2 --gpus-per-node=0 \
    "$sbatch_script" "$app" "$@" 2> "$dir/job/$name.sbatch-err") | cut -d';' -f1
}
submit() { submit_app "$1" "$dir/bin/hetero_train" "${@:2}"; }  # NAME APP_ARGS...
running() { [[ -n $(squeue -h -j "$1" 2> /dev/null) ]]; }
wait_job() {  # JOB SECONDS: until it left the queue; scancel after SECONDS
  local t=$(($2 * 10))
  while running "$1"; do
    if ((t-- <= 0)); then
      scancel "$1"
      return 1
    fi
    sleep 0.1
  done
}
job_states() {  # JOB: "ID|STATE|EXITCODE" per component and step, once accounting has them
  # slurmctld reports to slurmdbd on its own time: until then a component may be missing, still
  # RUNNING, or not yet known as part of the het job (a plain "ID" row).
  local i out
  for ((i = 0; i < 100; i++)); do
    out=$(sacct -n -P -j "$1" -o JobID,State,ExitCode 2> /dev/null)
    if grep -q "^$1+0|" <<< "$out" && grep -q "^$1+1|" <<< "$out" &&
      ! grep -qE '\|(PENDING|RUNNING|COMPLETING|REQUEUED)' <<< "$out"; then
      break
    fi
    sleep 0.2
  done
  echo "$out"
}
allocations() { grep -E '^[0-9]+\+[0-9]+\|' <<< "$1"; }  # the components' own rows
completed() {  # JOB_STATES: every component COMPLETED
  local rows
  rows=$(allocations "$1")
  [[ -n $rows ]] && ! grep -qv '|COMPLETED|' <<< "$rows"
}
one_line() { tr '\n' ' ' <<< "$1" | sed 's/ *$//'; }
wait_training() {  # JOB OUT: until a progress line with step > 0; prints the step
  local t=600 step
  while ((t-- > 0)); do
    step=$(grep -oE 'progress: epoch [0-9]+/[0-9]+, step [0-9]+' "$2" 2> /dev/null | tail -n 1 |
      sed 's/.* step //')
    if [[ -n $step ]] && ((step > 0)); then
      echo "$step"
      return 0
    fi
    running "$1" || return 1
    sleep 0.1
  done
  return 1
}
# Every epoch once, each sample once: the head's epoch lines (0 duplicates, 0 missing, all the
# samples) and the report's digest, the sum of splitmix64(id) over the ids trained on
# (docs/hetero_train.md), against the sum over 0..samples-1.
check_samples() {  # OUT REPORT EPOCHS
  python3 - "$@" "$samples" << 'EOF'
import json, re, sys
out, report, epochs, samples = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
bad = []
seen = {}
for m in re.finditer(r"epoch (\d+)/(\d+): (\d+) samples, (\d+) duplicates, (\d+) missing",
                     open(out, errors="replace").read()):
    seen[int(m[1])] = (int(m[3]), int(m[4]), int(m[5]))
for e in range(1, epochs + 1):
    if e not in seen:
        bad.append(f"no line for epoch {e}")
    elif seen[e] != (samples, 0, 0):
        bad.append("epoch %d: %d samples, %d duplicates, %d missing" % ((e,) + seen[e]))
M = 2**64
def digest(i):
    z = (i + 0x9e3779b97f4a7c15) % M
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) % M
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) % M
    return z ^ (z >> 31)
want = "0x%016x" % (sum(digest(i) for i in range(samples)) % M)
try:
    got = [e["digest"] for e in json.load(open(report))["epochs"]]
    if len(got) != epochs:
        bad.append(f"the report has {len(got)} epochs, not {epochs}")
    bad += [f"epoch {n}: digest {d}, each sample once gives {want}"
            for n, d in enumerate(got, 1) if d != want]
except (OSError, ValueError, KeyError) as e:
    bad.append(f"report {report}: {e}")
if bad:
    print("; ".join(bad))
    sys.exit(1)
print(f"{epochs} epochs x {samples} samples, 0 duplicates, 0 missing, digests match")
EOF
}
joined() {  # REASON...: "REASON; REASON"
  local out="" r
  for r in "$@"; do out+=${out:+; }$r; done
  echo "$out"
}
pass() { echo "PASS: $*"; }
fail() {
  echo "FAIL: $*"
  failed=1
}
show_tail() {  # OUT: for a failure, the lines that say how each process ended, then the last
  echo "  --- how the processes ended, in $1:"
  grep -E 'troupe-node:|exiting with|srun: error|slurmstepd' "$1" 2> /dev/null | head -n 20 |
    cut -c1-240 | sed 's/^/  | /'
  echo "  --- its last lines:"
  grep -v -E '^(progress:|ml\.c5|  - )' "$1" 2> /dev/null | tail -n 8 | cut -c1-240 |
    sed 's/^/  | /'
}
quick=(--train-samples "$samples" --batch-size 128 --data-dir "$data")

# -- (a) a normal job --

name="(a) normal job"
t0=$SECONDS
job=$(submit a --epochs 2 "${quick[@]}" --report "$dir/job/a.json")
if [[ -z $job ]]; then
  fail "$name: sbatch refused it: $(last_line "$dir/job/a.sbatch-err")"
else
  jobs+=("$job")
  if ! wait_job "$job" 120; then
    fail "$name: job $job still running after 120 s; cancelled"
    show_tail "$dir/job/a.out"
  else
    states=$(job_states "$job")
    samples_ok=$(check_samples "$dir/job/a.out" "$dir/job/a.json" 2)
    samples_rc=$?
    if ! completed "$states"; then
      fail "$name: job $job is not COMPLETED: sacct says '$(one_line "$states")'"
      show_tail "$dir/job/a.out"
    elif ((samples_rc != 0)); then
      fail "$name: job $job COMPLETED but not every sample once: $samples_ok"
    else
      pass "$name: job $job COMPLETED ($(one_line "$(allocations "$states")")) in" \
        "$((SECONDS - t0)) s; $samples_ok"
    fi
  fi
fi

# -- (b) the data node's process killed with kill -9 during training --

# The hetero_train child of troupe-node on n1, by pid: troupe-node's only child, with its role
# file (TROUPE_ROLE_FILE in its environment) saying "worker".
app_on() {  # NODE: prints "PID ROLE INCARNATION TROUPE_NODE_PID"
  local t env c cenv role
  for t in $(pgrep -x troupe-node); do
    env=$(tr '\0' '\n' 2> /dev/null < "/proc/$t/environ") || continue
    grep -qxF "SLURMD_NODENAME=$1" <<< "$env" || continue
    grep -qF "$dir/bin/hetero_train" "/proc/$t/cmdline" 2> /dev/null || continue
    c=$(pgrep -P "$t" | head -n 1)
    [[ -n $c ]] || continue
    cenv=$(tr '\0' '\n' 2> /dev/null < "/proc/$c/environ") || continue
    role=$(cat "$(sed -n 's/^TROUPE_ROLE_FILE=//p' <<< "$cenv")" 2> /dev/null)
    echo "$c ${role:-?} $(sed -n 's/^TROUPE_INCARNATION=//p' <<< "$cenv") $t"
    return 0
  done
  return 1
}

# The end of a case whose data node's process was killed: the job waited for, then judged by
# sacct (COMPLETED), its samples (each once) and troupe-node's restart line. Reads $name, $job, $t0.
judge_restart() {  # CASE EPOCHS RESTART_LINE_START PASS_PREFIX
  local states samples_ok samples_rc restart_line why=()
  wait_job "$job" 120 || fail "$name: job $job still running 120 s after the kill; cancelled"
  states=$(job_states "$job")
  samples_ok=$(check_samples "$dir/job/$1.out" "$dir/job/$1.json" "$2")
  samples_rc=$?
  restart_line=$(grep -F "$3" "$dir/job/$1.out" | head -n 1)
  completed "$states" || why+=("job $job is not COMPLETED: sacct says '$(one_line "$states")'")
  ((samples_rc == 0)) || why+=("not every sample once: $samples_ok")
  [[ -n $restart_line ]] || why+=("no restart line from troupe-node")
  if ((${#why[@]} > 0)); then
    fail "$name: $(joined "${why[@]}")"
    echo "  steps: $(one_line "$states")"
    show_tail "$dir/job/$1.out"
  else
    pass "$name: $4'$restart_line'; job $job COMPLETED in $((SECONDS - t0)) s; $samples_ok"
  fi
}

name="(b) kill -9 of the data node's process"
t0=$SECONDS
job=$(submit b --epochs 3 "${quick[@]}" --progress-every 0.2 --report "$dir/job/b.json")
if [[ -z $job ]]; then
  fail "$name: sbatch refused it: $(last_line "$dir/job/b.sbatch-err")"
else
  jobs+=("$job")
  if ! step=$(wait_training "$job" "$dir/job/b.out"); then
    fail "$name: job $job never reported a training step > 0 (ended or 60 s)"
    show_tail "$dir/job/b.out"
  elif ! read -r pid role incarnation tn < <(app_on n1); then
    fail "$name: no hetero_train under troupe-node on n1 to kill (job $job, step $step)"
  elif [[ $role != worker ]]; then
    fail "$name: the app on n1 (pid $pid) says its role is '$role', not worker"
  else
    kill -KILL "$pid"
    say "(b) killed hetero_train pid $pid on n1 ($role, incarnation $incarnation, under" \
      "troupe-node pid $tn) at training step $step, $((SECONDS - t0)) s after sbatch"
    judge_restart b 3 'troupe-node: hetero_train (worker) was killed by SIGKILL; starting it' \
      "killed at step $step; "
  fi
fi

# -- (c) scancel while training --

name="(c) scancel while training"
t0=$SECONDS
job=$(submit c --epochs 20 "${quick[@]}" --progress-every 0.2)
if [[ -z $job ]]; then
  fail "$name: sbatch refused it: $(last_line "$dir/job/c.sbatch-err")"
else
  jobs+=("$job")
  if ! step=$(wait_training "$job" "$dir/job/c.out"); then
    fail "$name: job $job never reported a training step > 0 (ended or 60 s)"
    show_tail "$dir/job/c.out"
  else
    scancel "$job"
    t1=$SECONDS
    wait_job "$job" 60 || fail "$name: job $job still running 60 s after scancel"
    states=$(job_states "$job")
    # Each task's code: sacct's step 0 of each component, else srun's line for the task.
    why=()
    codes=()
    for c in 0 1; do
      node=n$((c + 1))
      code=$(grep -E "^$job\+$c\.0\|" <<< "$states" | cut -d'|' -f3)
      from=sacct
      if [[ -z $code ]]; then
        code=$(grep -oE "srun: error: $node: task [0-9]+: Exited with exit code [0-9]+" \
          "$dir/job/c.out" | sed 's/.* //' | head -n 1)
        code=${code:+$code:0}
        from=srun
      fi
      codes+=("$node ${code:-?} ($from)")
      [[ $code == 6:0 ]] || why+=("the task on $node exited ${code:-?} ($from), not 6")
    done
    left=""
    for ((i = 0; i < 50; i++)); do
      left=$(our_processes)
      [[ -z $left ]] && break
      sleep 0.1
    done
    [[ -z $left ]] ||
      why+=("left running: $(one_line "$(ps -o pid=,args= -p "$(one_line "$left" | tr ' ' ,)")")")
    if ((${#why[@]} > 0)); then
      fail "$name: $(joined "${why[@]}")"
      echo "  steps: $(one_line "$states")"
      show_tail "$dir/job/c.out"
    else
      pass "$name: cancelled at step $step; every task exited 6: ${codes[*]};" \
        "the job ended $((SECONDS - t1)) s after scancel; no troupe process left"
    fi
  fi
fi

# -- (d) the data node's process killed before it knew its role --

name="(d) kill -9 of the data node's process before it wrote its role"
t0=$SECONDS
cat > "$dir/bin/slow-start" << SLOW
#!/bin/bash
# hetero_train, after 3 s on n1's first process: a window in which it has no role yet.
if [[ \$SLURMD_NODENAME == n1 && \${TROUPE_INCARNATION:-0} == 0 ]]; then sleep 3; fi
exec "$dir/bin/hetero_train" "\$@"
SLOW
chmod +x "$dir/bin/slow-start"
job=$(submit_app d "$dir/bin/slow-start" --epochs 2 "${quick[@]}" --report "$dir/job/d.json")
if [[ -z $job ]]; then
  fail "$name: sbatch refused it: $(last_line "$dir/job/d.sbatch-err")"
else
  jobs+=("$job")
  # troupe-node's child on n1 while it waits: its role file still empty.
  pid="" role="?"
  for ((i = 0; i < 200; i++)); do
    for t in $(pgrep -x troupe-node); do
      tr '\0' '\n' 2> /dev/null < "/proc/$t/environ" | grep -qxF "SLURMD_NODENAME=n1" || continue
      c=$(pgrep -P "$t" | head -n 1)
      [[ -n $c ]] || continue
      cenv=$(tr '\0' '\n' 2> /dev/null < "/proc/$c/environ") || continue
      role=$(cat "$(sed -n 's/^TROUPE_ROLE_FILE=//p' <<< "$cenv")" 2> /dev/null)
      pid=$c
    done
    [[ -n $pid ]] && break
    sleep 0.05
  done
  if [[ -z $pid ]]; then
    fail "$name: no process under troupe-node on n1 within 10 s (job $job)"
  elif [[ -n $role ]]; then
    fail "$name: the process on n1 (pid $pid) had written its role ('$role') already"
  else
    kill -KILL "$pid"
    say "(d) killed pid $pid on n1 before its role file, $((SECONDS - t0)) s after sbatch"
    judge_restart d 2 'troupe-node: slow-start (killed before it knew its role) was killed' ""
  fi
fi

say "$((SECONDS - t_start)) s in all"
((failed == 0))
