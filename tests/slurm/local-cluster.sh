#!/bin/bash
# A real Slurm cluster on this one machine, to try `launcher main cluster_type=bcm` against the
# real sbatch, and the one way the test suite starts its cluster (tests/e2e/slurm_test_cluster.hpp
# runs this script): one slurmctld and N slurmd (node1..nodeN, default 2, all on localhost, each
# on its own port) and a private munged, every path (slurm.conf, state, spool, logs, pid files,
# munge key and socket) in one directory, so that nothing touches the system's Slurm or munge.
#
#   local-cluster.sh up     [--dir DIR] [--nodes N]   start it (nothing to do if it is up);
#                                                     prints `export SLURM_CONF=DIR/slurm.conf`
#   local-cluster.sh down   [--dir DIR] [--keep]      cancel its jobs, stop it, remove DIR
#   local-cluster.sh status [--dir DIR]               say whether it is up (exit 0) or not (3)
#
# DIR defaults to $LOCAL_SLURM_DIR, else /tmp/local-slurm. Usage: eval "$(local-cluster.sh up)",
# then sbatch, squeue, sinfo and the launcher reach it through SLURM_CONF.
#
# The configuration is the one seen working on Debian bookworm's Slurm 22.05 as root (SlurmUser
# and SlurmdUser root; proctrack/linuxproc, task/none, no accounting), with per-node spool, tmp,
# pid and log files (%n), as in Slurm's "multiple slurmd" test setups (--enable-multiple-slurmd
# is not needed: each slurmd is started with -N <node> and its own port). The ports (slurmctld's
# and one per slurmd) are a random free block in 10000-32000 (below the ephemeral range, so an
# outgoing connection does not take one meanwhile); if a daemon still loses a race for its
# port, start-up is retried with another block. Needs root and the Debian packages slurm-wlm
# and munge (container/install-deps.sh --tests installs them).
set -euo pipefail

readonly kSlurmPrograms=(slurmctld slurmd sbatch srun scontrol sinfo squeue scancel munged)

usage() {
  cat >&2 <<'EOF'
usage: local-cluster.sh up     [--dir DIR] [--nodes N]
       local-cluster.sh down   [--dir DIR] [--keep]
       local-cluster.sh status [--dir DIR]
DIR: $LOCAL_SLURM_DIR, else /tmp/local-slurm. N: 1 to 16 slurmd, default 2.
EOF
  exit 2
}

say() { echo "local-cluster.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# A program's absolute path: $PATH first, then the sbin directories root's PATH usually has.
program() {
  local directory
  local IFS=:
  for directory in ${PATH:-} /usr/local/sbin /usr/sbin /sbin /usr/local/bin /usr/bin /bin; do
    [[ -n $directory && -x $directory/$1 && -f $directory/$1 ]] && { echo "$directory/$1"; return 0; }
  done
  return 1
}

require_programs() {
  local name missing=()
  for name in "${kSlurmPrograms[@]}"; do program "$name" >/dev/null || missing+=("$name"); done
  if ((${#missing[@]} > 0)); then
    die "${missing[*]} not found: install the Debian packages slurm-wlm and munge" \
        "(apt-get install slurm-wlm munge, or bash container/install-deps.sh --tests)"
  fi
  ((EUID == 0)) || die "the cluster runs its daemons as root (SlurmUser=root, slurmd launches the jobs): run this as root"
}

command_name=${1:-}
[[ -n $command_name ]] || usage
shift
dir=${LOCAL_SLURM_DIR:-/tmp/local-slurm}
nodes=2
keep=false
while (($# > 0)); do
  case $1 in
    --dir) (($# >= 2)) || usage; dir=$2; shift 2 ;;
    --dir=*) dir=${1#--dir=}; shift ;;
    --nodes) (($# >= 2)) || usage; nodes=$2; shift 2 ;;
    --nodes=*) nodes=${1#--nodes=}; shift ;;
    --keep) keep=true; shift ;;
    *) usage ;;
  esac
done
if ! [[ $nodes =~ ^[0-9]+$ ]] || ((nodes < 1 || nodes > 16)); then die "--nodes $nodes: give 1 to 16"; fi
[[ $dir == /* ]] || dir=$PWD/$dir
# The directory names every daemon (their -f DIR/slurm.conf) and is matched in /proc to find
# what is left at `down`: a short or odd path would match unrelated processes.
[[ $dir =~ ^/[A-Za-z0-9._/-]+$ && ${#dir} -ge 8 ]] ||
  die "--dir $dir: use an absolute path of at least 8 characters from [A-Za-z0-9._/-]"
dir=${dir%/}
conf=$dir/slurm.conf
export SLURM_CONF=$conf

# Runs a Slurm client against this cluster, bounded in time.
client() {
  local name=$1
  shift
  timeout 10 "$(program "$name")" "$@"
}

# A daemon that has exited but not been reaped is a zombie: gone, though kill -0 still finds it.
# The daemons outlive `up` and are reparented to whoever reaps orphans; a test process (a child
# subreaper) reaps them only after `down` returns, so counting zombies alive made every `down`
# wait out its deadlines (9 s instead of 4).
alive() {
  [[ -n ${1:-} ]] || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }  # the state follows the command name's closing parenthesis
  [[ ${stat:0:1} != Z ]]
}
pid_of() { if [[ -s $dir/pids/$1 ]]; then cat "$dir/pids/$1"; fi; }

# The nodes of slurm.conf (written by `up`), and how many sinfo shows idle.
configured_nodes() { sed -n 's/^# nodes: //p' "$conf" 2>/dev/null || true; }
idle_nodes() { client sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$' || true; }

# Up: slurmctld answers and every node is idle (or busy with a job).
cluster_is_up() {
  [[ -f $conf ]] || return 1
  alive "$(pid_of slurmctld)" || return 1
  client scontrol ping 2>/dev/null | grep -q 'is UP' || return 1
  local count
  count=$(configured_nodes)
  [[ -n $count ]] || return 1
  local node
  for ((node = 1; node <= count; node++)); do alive "$(pid_of "slurmd-node$node")" || return 1; done
  local ready
  ready=$(client sinfo -h -N -o '%N %T' 2>/dev/null | grep -cE ' (idle|mixed|allocated)$' || true)
  ((ready == count))
}

# Starts "$@" in a session of its own (no terminal signal reaches it), output to $dir/$name.out,
# no descriptor of the caller held (a test's pipe would otherwise stay open), and records its pid.
# LOCAL_SLURM_CLUSTER marks its environment, which slurmd passes on to slurmstepd: `down` finds
# them by it.
start_daemon() {
  local name=$1
  shift
  (
    for fd in "/proc/$BASHPID/fd/"*; do
      fd=${fd##*/}
      if ((fd > 2 && fd < 255)); then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    LOCAL_SLURM_CLUSTER=$dir exec setsid "$@" </dev/null >>"$dir/$name.out" 2>&1
  ) &
  echo $! >"$dir/pids/$name"
}

# Waits up to $1 seconds for `$2 ...` to succeed while the daemons named after it live.
wait_until() {
  local seconds=$1 check=$2
  shift 2
  local deadline=$((SECONDS + seconds)) name
  while ((SECONDS < deadline)); do
    $check && return 0
    for name in "$@"; do alive "$(pid_of "$name")" || return 1; done
    sleep 0.1
  done
  $check
}

# The local TCP ports in use (any state), from /proc/net/tcp{,6}: "sl local_address ...", the
# address ending in :PORT in hexadecimal.
used_ports() {
  local file address
  for file in /proc/net/tcp /proc/net/tcp6; do
    [[ -r $file ]] || continue
    while read -r _ address _; do
      [[ $address == *:* ]] && echo $((16#${address##*:}))
    done < <(tail -n +2 "$file")
  done
}

# The first port of `count` consecutive ports in 10000-32000 that nothing uses.
pick_port_block() {
  local count=$1 attempt base port used taken
  used=" $(used_ports | sort -un | tr '\n' ' ') "
  for ((attempt = 0; attempt < 500; attempt++)); do
    base=$((10000 + (RANDOM * 32768 + RANDOM) % (32000 - count - 10000)))
    taken=false
    for ((port = base; port < base + count; port++)); do
      [[ $used == *" $port "* ]] && { taken=true; break; }
    done
    $taken || { echo "$base"; return 0; }
  done
  die "no block of $count free TCP ports in 10000-32000"
}

write_slurm_conf() {
  local port=$1
  cat >"$conf" <<EOF
# Written by tests/slurm/local-cluster.sh: a private $nodes-node cluster on this machine.
# nodes: $nodes
ClusterName=localslurm
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# Finished jobs stay visible to scontrol for an hour; batch jobs start at once, not within 3 s.
MinJobAge=3600
SchedulerParameters=batch_sched_delay=0
KillWait=2
InactiveLimit=0
MailProg=/bin/true
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdSpoolDir=$dir/spool-%n
# One TmpFS per node: srun --mpi=pmix makes its directories under it, named by job and step
# only, so two nodes on one machine would collide in a shared /tmp.
TmpFS=$dir/tmp-%n
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmdLogFile=$dir/slurmd-%n.log
NodeName=node[1-$nodes] NodeHostname=localhost Port=$((port + 1))-$((port + nodes)) CPUs=1 RealMemory=1000
PartitionName=debug Nodes=node[1-$nodes] Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munged() {
  if alive "$(pid_of munged)" && [[ -S $dir/munge.socket ]]; then return 0; fi
  if [[ ! -s $dir/munge.key ]]; then
    (umask 077 && head -c 128 /dev/urandom >"$dir/munge.key")
  fi
  rm -f "$dir/munge.socket"
  start_daemon munged "$(program munged)" --foreground --force --socket="$dir/munge.socket" \
    --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" --seed-file="$dir/munged.seed" \
    --log-file="$dir/munged.log"
  wait_until 10 "test -S $dir/munge.socket" munged ||
    die "munged did not create its socket $dir/munge.socket within 10 s; $(tail -5 "$dir/munged.out" "$dir/munged.log" 2>/dev/null)"
}

controller_answers() { client scontrol ping 2>/dev/null | grep -q 'is UP'; }
all_nodes_idle() { (($(idle_nodes) == nodes)); }

# One try at slurmctld and the slurmd on a fresh block of ports; false when they did not come up.
start_slurm_daemons() {
  local node
  rm -rf "$dir/state" "$dir"/spool-* "$dir"/tmp-* "$dir"/slurm*.log "$dir"/slurm*.out "$dir"/slurm*.pid
  mkdir -p "$dir/state"
  for ((node = 1; node <= nodes; node++)); do mkdir -p "$dir/spool-node$node" "$dir/tmp-node$node"; done
  local port
  port=$(pick_port_block $((nodes + 1))) || return 1
  write_slurm_conf "$port"
  start_daemon slurmctld "$(program slurmctld)" -D -c -f "$conf"
  wait_until 15 controller_answers slurmctld || return 1
  local watched=(slurmctld)
  for ((node = 1; node <= nodes; node++)); do
    start_daemon "slurmd-node$node" "$(program slurmd)" -D -N "node$node" -f "$conf"
    watched+=("slurmd-node$node")
  done
  wait_until 30 all_nodes_idle "${watched[@]}"
}

# The daemons this script started, by the names of their pid files: munged, slurmctld,
# slurmd-node1, ...; `slurm` for the Slurm ones only.
recorded() {
  local file name
  for file in "$dir"/pids/*; do
    [[ -e $file ]] || continue
    name=${file##*/}
    [[ $1 == all || ($1 == slurm && $name == slurm*) ]] && echo "$name"
  done
  return 0
}

# Sends signal $1 (0: none) to the recorded daemons $3 (all or slurm), then waits up to $2
# seconds for them to be gone.
stop_recorded() {
  local signal=$1 seconds=$2 which=$3 name pid left deadline
  for name in $(recorded "$which"); do
    pid=$(pid_of "$name")
    if alive "$pid"; then kill "-$signal" "$pid" 2>/dev/null || true; fi
  done
  deadline=$((SECONDS + seconds))
  while :; do
    left=false
    for name in $(recorded "$which"); do alive "$(pid_of "$name")" && left=true; done
    $left || return 0
    ((SECONDS < deadline)) || return 0
    sleep 0.1
  done
}

# Says which of the recorded daemons $1 (all or slurm) are still running, and $2: a daemon that
# outlives the gentler step is worth a line, since `down` then waits out a deadline for it.
report_running() {
  local name
  for name in $(recorded "$1"); do
    if alive "$(pid_of "$name")"; then say "down: $name still running $2"; fi
  done
}

# The pids of what is left of the cluster: processes whose command line names $dir (the daemons,
# slurmstepd's children started with its paths), and job processes (SLURM_JOB_ID set, with this
# cluster's SLURM_CONF). Not this script nor its ancestors: a shell that ran `eval "$(... up)"`
# holds SLURM_CONF too.
leftover_processes() {
  local -A spared=()
  local pid=$$
  while [[ -n $pid && $pid != 0 ]]; do
    spared[$pid]=1
    pid=$(awk '{ print $4 }' "/proc/$pid/stat" 2>/dev/null || true)
  done
  spared[$BASHPID]=1
  local entry
  for entry in /proc/[0-9]*; do
    pid=${entry#/proc/}
    [[ -n ${spared[$pid]:-} ]] && continue
    local command_line environment
    command_line=$({ tr '\0' '\n' <"$entry/cmdline"; } 2>/dev/null || true)
    environment=$({ tr '\0' '\n' <"$entry/environ"; } 2>/dev/null || true)
    if [[ $command_line == *"$dir/"* ]] ||
       grep -qxF -- "LOCAL_SLURM_CLUSTER=$dir" <<<"$environment" ||
       { grep -qxF -- "SLURM_CONF=$conf" <<<"$environment" &&
         grep -q '^SLURM_JOB_ID=' <<<"$environment"; }; then
      echo "$pid"
    fi
  done
}

# The file that marks a directory as this script's: `down` removes no other directory, and
# `up` takes an existing one only when it is empty (a test's fresh temporary one) or marked.
readonly kMarker=.local-slurm-cluster

ours() { [[ -f $dir/$kMarker ]]; }

cmd_up() {
  require_programs
  if cluster_is_up; then
    say "already up in $dir ($(configured_nodes) nodes)"
    echo "export SLURM_CONF=$conf"
    return 0
  fi
  if [[ -e $dir ]] && ! ours; then
    [[ -d $dir && -z $(ls -A "$dir") ]] ||
      die "$dir exists and is not a directory this script made: give another --dir"
  fi
  # Whatever is left of an earlier cluster in this directory goes first.
  if ours; then cmd_down_quietly; fi
  mkdir -p "$dir/pids"
  touch "$dir/$kMarker"
  start_munged
  local attempt
  for attempt in 1 2 3; do
    if start_slurm_daemons; then
      say "up in $dir: slurmctld and $nodes slurmd (node1..node$nodes) on localhost, partition debug"
      echo "export SLURM_CONF=$conf"
      return 0
    fi
    local logs
    logs=$(tail -n 15 "$dir"/slurm*.log "$dir"/slurm*.out "$dir"/munged.log 2>/dev/null || true)
    stop_recorded KILL 2 slurm
    if ! grep -qs 'Address already in use' "$dir"/slurm*.log "$dir"/slurm*.out || ((attempt == 3)); then
      stop_recorded KILL 2 all
      die "the cluster in $dir did not come up (slurmctld answering \`scontrol ping\`, then" \
          "$nodes idle nodes in sinfo) on attempt $attempt; daemon logs:"$'\n'"$logs"
    fi
  done
}

cmd_down_quietly() {
  local shut_down=false
  if [[ -f $conf ]] && alive "$(pid_of slurmctld)"; then
    shut_down=true
    # Cancel what is left so that no job step lingers, then stop the daemons the Slurm way.
    client scancel --quiet --user "$(id -un)" 2>/dev/null || true
    local deadline=$((SECONDS + 5))
    while ((SECONDS < deadline)); do
      local queue
      queue=$(client squeue -h -o %i 2>/dev/null) || break
      [[ -z ${queue//[[:space:]]/} ]] && break
      sleep 0.2
    done
    client scontrol shutdown >/dev/null 2>&1 || true
  fi
  if [[ -d $dir/pids ]]; then
    if $shut_down; then
      stop_recorded 0 5 slurm
      report_running slurm "5 s after scontrol shutdown: sending TERM"
    fi
    stop_recorded TERM 2 all
    report_running all "2 s after TERM: sending KILL"
    stop_recorded KILL 2 all
  fi
  # slurmstepd and the job processes detach from slurmd: what still names the cluster goes too.
  local pids=() round
  for ((round = 0; round < 10; round++)); do
    mapfile -t pids < <(leftover_processes)
    ((${#pids[@]} > 0)) || break
    kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.1
  done
  rm -rf "$dir/pids"
  if ! $keep; then rm -rf "$dir"; fi
}

cmd_down() {
  if [[ ! -e $dir ]]; then
    say "nothing to stop: $dir does not exist"
    return 0
  fi
  ours || die "$dir is not a directory this script made (no $kMarker): not touching it"
  cmd_down_quietly
  say "down: $dir $($keep && echo kept || echo removed)"
}

cmd_status() {
  if cluster_is_up; then
    echo "up: $dir ($(configured_nodes) nodes); export SLURM_CONF=$conf"
    client sinfo -N -o '%N %P %T' || true
    return 0
  fi
  echo "down: no cluster answers in $dir"
  return 3
}

case $command_name in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) usage ;;
esac
