#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for the tests of the table runner's SLURM launcher (and for trying
# LAUNCHER=slurm without a cluster): slurmctld, slurmd, munge, and slurmdbd on its own MariaDB (so that `sacct`,
# which submitit and the launcher read job states with, answers as on a real cluster).
#
#   scripts/slurm_cluster.sh start    install what is missing (Debian's packages; root), write the configuration,
#                                     start the daemons; a no-op while the cluster runs. Returns once sinfo answers
#   scripts/slurm_cluster.sh stop     stop the daemons it started (their state stays in the cluster folder)
#   scripts/slurm_cluster.sh status   the daemons and sinfo; exit status 0 when the cluster answers, 3 when not
#
# Everything but /etc/slurm/slurm.conf and /etc/slurm/slurmdbd.conf (which SLURM's commands read) lives in one
# folder, /var/lib/diverse-fairseq-slurm: the controller's state, slurmd's spool, the database, the logs. A machine
# with a SLURM configuration of its own is left alone (start refuses, naming the file).
set -euo pipefail

DIR=/var/lib/diverse-fairseq-slurm
CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
MARK="# written by diverse-fairseq's scripts/slurm_cluster.sh (a one-node test cluster)"
DB_PORT=6830  # our own MariaDB instance (127.0.0.1 only), beside any other on 3306
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
COMMANDS=(slurmctld slurmd sinfo sbatch sacct slurmdbd munged mariadbd mariadb-install-db)
HOST=$(hostname -s)

say() { echo "[slurm_cluster] $*"; }
die() { echo "[slurm_cluster] error: $*" >&2; exit 1; }

answers() {  # the cluster answers: our configuration, our slurmctld, the node up, and sacct reaching slurmdbd
    grep -qxF "$MARK" "$CONF" 2>/dev/null && alive "$DIR/run/slurmctld.pid" && timeout 10 sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)' \
        && timeout 10 sacct -n -X -j 1 >/dev/null 2>&1
}

alive() {  # alive PIDFILE: its process runs (a test any user can make)
    local pid
    pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] && [ -d "/proc/$pid" ]
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll COMMAND every 0.2 s
    local limit=$1 what=$2 i
    shift 2
    for ((i = 0; i < limit * 5; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    die "$what did not answer within ${limit}s; see the logs in $DIR/log/"
}

install_packages() {
    local missing=() c
    for c in "${COMMANDS[@]}"; do command -v "$c" >/dev/null || missing+=("$c"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || die "no SLURM cluster: ${missing[*]} not installed and not root (as root, this script installs ${PACKAGES[*]} with apt-get)"
    command -v apt-get >/dev/null || die "no SLURM cluster: ${missing[*]} not installed and no apt-get to install ${PACKAGES[*]}"
    say "installing ${PACKAGES[*]} (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >"$DIR/log/apt.log" 2>&1; then
        apt-get update -qq >>"$DIR/log/apt.log" 2>&1 || true  # a fresh machine: no package lists yet
        apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >>"$DIR/log/apt.log" 2>&1 \
            || die "apt-get could not install ${PACKAGES[*]}; see $DIR/log/apt.log"
    fi
}

write_config() {  # slurm.conf with this machine's CPUs and memory (slurmd -C), and slurmdbd.conf
    local f
    for f in "$CONF" "$DBD_CONF"; do
        if [ -e "$f" ] && ! grep -qxF "$MARK" "$f"; then
            die "$f is this machine's own SLURM configuration (not written by this script): use that cluster, or move the file away to start the test cluster"
        fi
    done
    local node
    node=$(slurmd -C | head -1)  # NodeName=<host> CPUs=.. Boards=.. SocketsPerBoard=.. ... RealMemory=..
    mkdir -p /etc/slurm
    cat >"$CONF" <<EOF
$MARK
ClusterName=local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# no cgroups in a container: processes tracked by their parent pid, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
# up to 4 jobs share a core, as the local runner's processes and the tests' share this machine's (a job waiting
# for its time limit does not hold one); each job reserves 1 GB of the memory unless it asks for more (sbatch --mem)
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerNode=1024
MailProg=/bin/true
SchedulerType=sched/builtin
MpiDefault=none
# finished jobs leave the controller's memory after 2 minutes (sacct keeps them); 5 s from SIGTERM to SIGKILL
MinJobAge=120
KillWait=5
ReturnToService=2
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    cat >"$DBD_CONF" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
EOF
    chmod 600 "$DBD_CONF"
}

db() { mariadb --no-defaults --socket="$DIR/db/mysqld.sock" -u root "$@"; }

start_munge() {
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0  # this machine's munged, or ours, runs
    [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key && chown munge:munge /etc/munge/munge.key; }
    install -d -o munge -g munge -m 755 /run/munge
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid 9>&-  # (the daemons do not keep the lock)
    wait_for 10 munged sh -c 'munge -n | unmunge'
    cp /run/munge/munged.pid "$DIR/run/munged.pid"  # ours to stop
}

start_database() {
    if [ ! -d "$DIR/db/mysql" ]; then
        install -d -o mysql -g mysql "$DIR/db"
        mariadb-install-db --no-defaults --user=mysql --datadir="$DIR/db" --auth-root-authentication-method=socket \
            --skip-test-db >"$DIR/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; see $DIR/log/mariadb-install.log"
    fi
    if ! db -e 'SELECT 1' >/dev/null 2>&1; then
        setsid mariadbd --no-defaults --user=mysql --datadir="$DIR/db" --socket="$DIR/db/mysqld.sock" --port=$DB_PORT \
            --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$DIR/db/mariadbd.pid" \
            --log-error="$DIR/db/mariadbd.log" --innodb-buffer-pool-size=16M --innodb-log-file-size=8M \
            </dev/null >/dev/null 2>&1 9>&- &
        wait_for 30 MariaDB db -e 'SELECT 1'
    fi
    db -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
           GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start() {
    if answers; then
        say "running: $(sinfo -h -o '%P %D node(s) %c CPUs %m MB %T' | head -1)"
        return 0
    fi
    grep -qxF "$MARK" "$CONF" 2>/dev/null || [ ! -e "$CONF" ] \
        || die "$CONF is this machine's own SLURM configuration (not written by this script): use that cluster, or move the file away to start the test cluster"
    [ "$(id -u)" = 0 ] || die "no SLURM cluster running, and starting one needs root (slurmd runs jobs as their users): sudo $0 start"
    mkdir -p "$DIR"/{state,spool,run,log}
    install_packages
    write_config
    start_munge
    start_database
    alive "$DIR/run/slurmdbd.pid" || slurmdbd 9>&-
    wait_for 30 slurmdbd sacctmgr -n show cluster
    alive "$DIR/run/slurmctld.pid" || slurmctld 9>&-
    alive "$DIR/run/slurmd.pid" || slurmd 9>&-
    wait_for 30 slurmctld scontrol ping
    if sinfo -h -o %T | grep -qE '^(down|drain)'; then  # e.g. a node left down by a crash
        scontrol update NodeName="$HOST" State=RESUME || true
    fi
    wait_for 30 "the node $HOST" answers
    say "started: $(sinfo -h -o '%P %D node(s) %c CPUs %m MB %T' | head -1); stop with: $0 stop"
}

stop() {
    [ "$(id -u)" = 0 ] || die "stopping the cluster needs root"
    local name pidfile pid
    for name in slurmd slurmctld slurmdbd db/mariadbd munged; do
        pidfile=$DIR/run/$name.pid
        [ "$name" = db/mariadbd ] && pidfile=$DIR/db/mariadbd.pid
        alive "$pidfile" || continue
        pid=$(cat "$pidfile")
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        say "stopped ${name#db/} ($pid)"
    done
    rm -f "$DIR/run/munged.pid"
}

status() {
    local name pidfile
    for name in munged slurmdbd slurmctld slurmd db/mariadbd; do
        pidfile=$DIR/run/$name.pid
        [ "$name" = db/mariadbd ] && pidfile=$DIR/db/mariadbd.pid
        if alive "$pidfile"; then say "${name#db/}: running ($(cat "$pidfile"))"; else say "${name#db/}: not running"; fi
    done
    if answers; then
        sinfo
        return 0
    fi
    say "the cluster does not answer (start it with: $0 start)"
    return 3
}

case "${1:-}" in
    start | stop | status)
        # one start/stop at a time (pytest-xdist's workers each start it); a user who cannot write there only reads
        if mkdir -p "$DIR" 2>/dev/null && [ -w "$DIR" ]; then exec 9>"$DIR/.lock" && flock -w 900 9; fi
        "$1"
        ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
