#!/usr/bin/env bash
# Soak: many one-shot resources through fencegate, on loopback, per store.
#
#   ./scripts/soak.sh                 # CI size: 2,000 resources per store
#   ./scripts/soak.sh -n 1000000      # the DESIGN §12 soak
#   ./scripts/soak.sh -n 50000 -s "valkey file"
#
# For each store (Valkey on a throwaway redis-server/valkey-server,
# PostgreSQL on a throwaway cluster, the file store), it starts one gate in
# front of a tiny upstream that answers 204 (scripts/soak, which keeps
# nothing), then takes N resources soak:<run>:<i> through acquire, one
# fenced PUT through the gate with the lease's token, and release, C at a
# time. It reports, per store:
#   - the store's size before the run, at its peak (right after it) and
#     after the retention (when the binary knows FENCEGATE_RETENTION: the
#     gate runs with -r, and the script waits up to -w for the records to
#     go): Valkey used_memory and keys, PostgreSQL's relation sizes and
#     rows, the file store's pages in use and records (`soak boltsize`,
#     on a copy: bbolt never shrinks its file, freed pages are reused, so
#     the file's own size stays at its peak);
#   - bytes per resource at the peak: (peak - before) / the records
#     added (N when no record went yet; a retention shorter than the run
#     removes records while it runs);
#   - p50/p99 of acquire and of the fenced write (admission + forwarding)
#     over the first W resources (a store of about W records) and the last
#     W (a store of about N);
#   - the gate's RSS at the peak and at the end, and its peak (VmHWM);
#     with the file store, RSS includes the file's pages mapped by bbolt
#     (page cache the kernel can reclaim): the anonymous part (heap,
#     stacks) is printed beside it.
#
# Flags: -n N (2000), -c C concurrent resources (16), -W window (1000),
# -s "stores" ("valkey postgres file"), -r retention (30s), -w longest wait
# past the retention for the records to go (300s; a sweep runs a minute or
# so apart). Bounded: every wait has a limit; everything it
# starts is stopped by PID on exit and its files (one temporary directory)
# removed. Needs go, curl, and redis-server (or valkey-server) and
# PostgreSQL's initdb/postgres for those stores (a missing one is skipped
# with a note).
set -euo pipefail
cd "$(dirname "$0")/.."

N=2000 CONNS=16 WIN=1000 STORES="valkey postgres file" RETENTION=30s RWAIT=300
while getopts "n:c:W:s:r:w:h" o; do
	case $o in
	n) N=$OPTARG ;; c) CONNS=$OPTARG ;; W) WIN=$OPTARG ;; s) STORES=$OPTARG ;;
	r) RETENTION=$OPTARG ;; w) RWAIT=$OPTARG ;;
	*) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
	esac
done

NAME=soak.sh
. scripts/lib.sh # has, say, $tmp, pids and their cleanup, free_port
chmod 755 "$tmp"

# wait_for DESC SECONDS CMD...: run CMD every 0.2 s until it succeeds, at
# most SECONDS.
wait_for() {
	local desc=$1 secs=$2 i
	shift 2
	for i in $(seq $((secs * 5))); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	say "$desc did not come up"
	tail -n 5 "$tmp"/*.log >&2 2>/dev/null || true
	exit 1
}

say "building fencegate and the driver"
go build -o "$tmp/fencegate" ./cmd/fencegate
go build -o "$tmp/soak" ./scripts/soak
retention_env=()
if "$tmp/fencegate" env 2>/dev/null | grep FENCEGATE_RETENTION >/dev/null; then # not -q: under pipefail an early exit would fail the pipe
	retention_env=("FENCEGATE_RETENTION=$RETENTION")
else
	say "this fencegate has no FENCEGATE_RETENTION: the size after the retention is not measured"
fi

UP=$(free_port)
"$tmp/soak" upstream -listen "127.0.0.1:$UP" 2>"$tmp/upstream.log" &
pids+=($!)
wait_for upstream 10 curl -fs -X PUT "http://127.0.0.1:$UP/"

# --- stores --------------------------------------------------------------
VALKEY_SERVER=$(command -v valkey-server || command -v redis-server || true)
VALKEY_CLI=$(command -v valkey-cli || command -v redis-cli || true)
PGBIN=$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -1 || echo /nonexistent/initdb)")")
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

start_valkey() {
	VK=$(free_port)
	mkdir -p "$tmp/valkey"
	"$VALKEY_SERVER" --bind 127.0.0.1 --port "$VK" --dir "$tmp/valkey" --save "" --appendonly yes \
		--appendfsync everysec --protected-mode no >"$tmp/valkey.log" 2>&1 &
	pids+=($!)
	wait_for valkey 10 "$VALKEY_CLI" -p "$VK" ping
	STORE_URL="valkey://127.0.0.1:$VK"
}
start_postgres() {
	PGP=$(free_port)
	mkdir -p "$tmp/pg"
	[ "$(id -u)" = 0 ] && chown postgres "$tmp/pg"
	as_pg "$PGBIN/initdb" -D "$tmp/pg/data" -U postgres --auth=trust >"$tmp/initdb.log" 2>&1
	as_pg "$PGBIN/postgres" -D "$tmp/pg/data" -p "$PGP" -k "$tmp/pg" -c listen_addresses= \
		-c shared_buffers=64MB >"$tmp/postgres.log" 2>&1 &
	pids+=($!)
	wait_for postgres 30 as_pg "$PGBIN/psql" -h "$tmp/pg" -p "$PGP" -U postgres -c 'select 1'
	STORE_URL="postgres:///postgres?host=$tmp/pg&port=$PGP&user=postgres&sslmode=disable"
}
psql_q() { as_pg "$PGBIN/psql" -h "$tmp/pg" -p "$PGP" -U postgres -Atq -c "$1"; }
# pg_live: the bytes of live rows and index entries in fencegate's tables
# (pgstattuple), which a VACUUM'd table and its indexes come back to; their
# files keep the pages they had, free for the next rows.
pg_live() {
	psql_q "CREATE EXTENSION IF NOT EXISTS pgstattuple" >/dev/null 2>&1 || { echo "?"; return; }
	psql_q "SELECT coalesce(sum((pgstattuple(c.oid)).tuple_len), 0) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'fencegate' AND c.relkind IN ('r', 'i')" 2>/dev/null || echo "?"
}

# size STORE: "bytes records" as the store reports them.
size() {
	case $1 in
	valkey)
		echo "$("$VALKEY_CLI" -p "$VK" info memory | tr -d '\r' | sed -n 's/^used_memory://p')" \
			"$("$VALKEY_CLI" -p "$VK" dbsize | tr -d '\r')"
		;;
	postgres)
		psql_q "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'fencegate' AND c.relkind IN ('r', 'm')" | tr '\n' ' '
		psql_q "SELECT count(*) FROM fencegate.resources" 2>/dev/null || echo "?"
		;;
	file) "$tmp/soak" boltsize -file "$tmp/file.db" 2>/dev/null || echo "0 ?" ;;
	esac
}
# removed: records the gate's store removed by retention so far (its metric).
removed() {
	curl -fs "http://127.0.0.1:$API/metrics" | awk '/^fencegate_store_retention_removed_total/ {s += $NF} END {print s + 0}'
}
# seconds DURATION: a Go-style duration of whole s, m or h in seconds.
seconds() {
	case $1 in
	*h) echo $((${1%h} * 3600)) ;; *m) echo $((${1%m} * 60)) ;; *s) echo "${1%s}" ;; *) echo "$1" ;;
	esac
}
rss() { awk -v k="$1:" '$1 == k {printf "%.1f", $2 / 1024}' "/proc/$2/status"; }

echo "fencegate soak: $N resources per store, $CONNS at a time, windows of $WIN; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  $("$tmp/fencegate" version 2>/dev/null | head -1); retention: ${retention_env[*]:-not supported by this binary}"
echo

for store in $STORES; do
	case $store in
	valkey)
		if [ -z "$VALKEY_SERVER" ] || [ -z "$VALKEY_CLI" ]; then say "no redis-server/valkey-server: valkey skipped"; continue; fi
		start_valkey
		;;
	postgres)
		if [ ! -x "$PGBIN/initdb" ]; then say "no PostgreSQL (initdb): postgres skipped"; continue; fi
		start_postgres
		;;
	file) STORE_URL="file:$tmp/file.db" ;;
	*) say "unknown store $store (valkey, postgres or file)"; exit 2 ;;
	esac
	API=$(free_port)
	GP=$(free_port)
	env FENCEGATE_API_ADDR=127.0.0.1:$API FENCEGATE_PROXY_ADDR=127.0.0.1:$GP \
		FENCEGATE_UPSTREAM=http://127.0.0.1:$UP FENCEGATE_STORE="$STORE_URL" \
		FENCEGATE_RULES='PUT /jobs/{id} fence soak:{id}' FENCEGATE_LOG_LEVEL=warn OTEL_SDK_DISABLED=true \
		"${retention_env[@]}" "$tmp/fencegate" serve 2>"$tmp/gate-$store.log" &
	gpid=$!
	pids+=($gpid)
	wait_for "the gate on $store" 30 curl -fs "http://127.0.0.1:$API/readyz"
	read -r b0 r0 < <(size "$store")
	[ "$store" = postgres ] && live0=$(pg_live)
	case $store in valkey) unit=keys ;; postgres) unit=rows ;; *) unit="records" ;; esac
	say "$store: $N resources"
	"$tmp/soak" run -api "http://127.0.0.1:$API" -gate "http://127.0.0.1:$GP" -n "$N" -conns "$CONNS" \
		-window "$WIN" -run "$store" >"$tmp/run-$store" || { cat "$tmp/run-$store"; say "$store: the run failed"; exit 1; }
	read -r b1 r1 < <(size "$store")
	rss_peak="$(rss VmRSS "$gpid") ($(rss RssAnon "$gpid") anonymous)"
	after="not measured"
	if [ "${#retention_env[@]}" -gt 0 ]; then
		# Wait for the records to go, by the store's count where it has
		# one, else for the retention and a minute of sweeping.
		sleep "$(seconds "$RETENTION")"
		deadline=$((SECONDS + RWAIT))
		while [ "$SECONDS" -lt "$deadline" ]; do
			read -r b2 r2 < <(size "$store")
			if [ "$r2" != "?" ] && [ "$r2" -le "$((r0 + 10))" ]; then break; fi
			if [ "$r2" = "?" ] && [ "$(removed)" -ge "$N" ]; then break; fi
			sleep 2
		done
		took=$((SECONDS - deadline + RWAIT + $(seconds "$RETENTION")))
		# PostgreSQL keeps a deleted row's space until a VACUUM, which
		# autovacuum runs in its own time: run it now, as it would.
		[ "$store" = postgres ] && psql_q "VACUUM" >/dev/null 2>&1
		read -r b2 r2 < <(size "$store")
		after="$b2 bytes, $r2 $unit, $(removed) records removed by the retention (its metric), $took s after the run"
		[ "$store" = postgres ] && after+="; live bytes (pgstattuple) $live0 before, $(pg_live) after"
		# Valkey removes expired keys itself: its own count of them.
		[ "$store" = valkey ] && after+="; the server expired $("$VALKEY_CLI" -p "$VK" info stats | tr -d '\r' | sed -n 's/^expired_keys://p') keys"
	fi
	rss_end="$(rss VmRSS "$gpid") ($(rss RssAnon "$gpid") anonymous)"
	hwm=$(rss VmHWM "$gpid")
	echo "$store:"
	sed 's/^/  /' "$tmp/run-$store"
	echo "  size before: $b0 bytes, $r0 $unit; peak: $b1 bytes, $r1 $unit; after the retention: $after"
	[ "$store" = file ] && echo "  (file: bytes of the pages in use; the file itself is $(stat -c %s "$tmp/file.db") bytes and never shrinks)"
	added=$N
	[ "$r1" != "?" ] && [ "$((r1 - r0))" -gt 0 ] && added=$((r1 - r0))
	echo "  bytes per resource at the peak: $(awk -v a="$b0" -v b="$b1" -v n="$added" 'BEGIN{printf "%.0f", (b - a) / n}') ($added records added)"
	echo "  gate RSS: $rss_peak MiB at the peak, $rss_end MiB at the end, $hwm MiB highest"
	echo
	kill "$gpid" 2>/dev/null || true
	wait "$gpid" 2>/dev/null || true
done
