#!/usr/bin/env bash
# Lease operations per second on each store, at one and at many client
# connections, on loopback, in one run.
#
# One command: ./scripts/bench-leases.sh. It builds fencegate and the load
# generator scripts/leasebench (no wrk needed), measures the disk's
# fdatasync/s where the file store lives, starts one fencegate per store
# (the lease API only, no gate), and drives POST /v1/leases/<fresh>/acquire
# at every store with 1 and $LEASES_CONNS connections: every request takes a
# resource never used before, so every acquisition issues a token and is one
# durable write. Rounds are interleaved (store by store, connection count by
# connection count) so that a noisy neighbour hurts every figure alike; the
# script prints each run and then the median acquires/s, p50 and p99 per
# store and connection count, and the ratios the performance notes quote:
# file@N ÷ file@1 and file@N ÷ memory@N.
#
# With LEASES_BASELINE set to a git revision (such as main), it also builds
# fencegate at that revision (git archive, no worktree) and measures its file
# store beside the current one, as store "file-base", in the same rounds.
#
# Environment: LEASES_DURATION (5s), LEASES_ROUNDS (3), LEASES_CONNS (16),
# LEASES_FILE_DIR (where the file store's file lives, default the temporary
# directory: point it at a tmpfs such as /dev/shm to see what the file store
# costs when flushes are free, i.e. its ceiling on a faster disk),
# LEASES_STORES ("memory file"; add "postgres" with LEASES_PG_URL set to a
# postgres:// URL of a server you started), LEASES_OP (acquire, or cycle:
# acquire, renew, checkpoint, release of a fresh resource, each counted).
# Everything it starts is stopped by PID on exit; its files live in one
# temporary directory under $TMPDIR, removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${LEASES_DURATION:-5s}
ROUNDS=${LEASES_ROUNDS:-3}
CONNS=${LEASES_CONNS:-16}
STORES=${LEASES_STORES:-memory file}
OP=${LEASES_OP:-acquire}

say() { echo "bench-leases.sh: $*" >&2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-leases.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT

say "building fencegate and leasebench"
go build -o "$tmp/fencegate" ./cmd/fencegate
go build -o "$tmp/leasebench" ./scripts/leasebench
if [ -n "${LEASES_BASELINE:-}" ]; then
	say "building fencegate at $LEASES_BASELINE"
	mkdir "$tmp/base"
	git archive "$LEASES_BASELINE" | tar -x -C "$tmp/base"
	(cd "$tmp/base" && go build -o "$tmp/fencegate-base" ./cmd/fencegate)
	STORES="$STORES file-base"
fi

fdir=$tmp
if [ -n "${LEASES_FILE_DIR:-}" ]; then
	fdir=$(mktemp -d "$LEASES_FILE_DIR/fencegate-leases.XXXXXX")
	trap 'cleanup; rm -rf "$fdir"' EXIT
fi
"$tmp/leasebench" -fsyncprobe "$fdir" -d 2s | sed 's/^/disk: /'

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

declare -A url
for st in $STORES; do
	case $st in
	memory) spec=memory: ;;
	file) spec=file:$fdir/fencegate.db ;;
	file-base) spec=file:$fdir/fencegate-base.db ;;
	postgres)
		[ -n "${LEASES_PG_URL:-}" ] || { say "postgres needs LEASES_PG_URL"; exit 2; }
		spec=$LEASES_PG_URL
		;;
	*) say "unknown store $st"; exit 2 ;;
	esac
	bin=$tmp/fencegate
	if [ "$st" = file-base ]; then bin=$tmp/fencegate-base; fi
	port=$(free_port)
	FENCEGATE_STORE=$spec FENCEGATE_API_ADDR=127.0.0.1:$port FENCEGATE_LOG_LEVEL=warn \
		"$bin" serve >"$tmp/$st.log" 2>&1 &
	pids+=($!)
	url[$st]=http://127.0.0.1:$port
	for _ in $(seq 100); do
		if curl -fsS "${url[$st]}/readyz" >/dev/null 2>&1; then break; fi
		sleep 0.1
	done
	curl -fsS "${url[$st]}/readyz" >/dev/null || { say "$st did not start:"; cat "$tmp/$st.log" >&2; exit 1; }
done

results=$tmp/results
: >"$results"
for round in $(seq "$ROUNDS"); do
	for st in $STORES; do
		for c in 1 "$CONNS"; do
			line=$("$tmp/leasebench" -url "${url[$st]}" -conns "$c" -d "$DURATION" -op "$OP" -prefix "r$round-$st-$c")
			echo "round $round store=$st $line"
			echo "$st $c $line" >>"$results"
		done
	done
done

# Medians over rounds, per store and connection count.
python3 - "$results" "$CONNS" <<'EOF'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    st, c, *kv = line.split()
    d = dict(x.split("=", 1) for x in kv)
    rows.setdefault((st, int(c)), []).append(d)
conns = int(sys.argv[2])
med = {}
print(f"{'store':10} {'conns':>5} {'ops/s':>9} {'p50 µs':>8} {'p99 µs':>8} {'errors':>6}")
for (st, c), ds in sorted(rows.items()):
    ops = statistics.median(float(d["ops_per_s"]) for d in ds)
    p50 = statistics.median(int(d["p50_us"]) for d in ds)
    p99 = statistics.median(int(d["p99_us"]) for d in ds)
    errs = sum(int(d["errors"]) for d in ds)
    med[(st, c)] = ops
    print(f"{st:10} {c:5} {ops:9.0f} {p50:8.0f} {p99:8.0f} {errs:6}")
def ratio(a, b):
    return f"{med[a] / med[b]:.2f}" if a in med and b in med and med[b] else "n/a"
print(f"file@{conns} / file@1 = {ratio(('file', conns), ('file', 1))}")
print(f"file@{conns} / memory@{conns} = {ratio(('file', conns), ('memory', conns))}")
if ("file-base", 1) in med:
    print(f"file-base@{conns} / file-base@1 = {ratio(('file-base', conns), ('file-base', 1))}")
    print(f"file@1 / file-base@1 = {ratio(('file', 1), ('file-base', 1))} (throughput at one connection, current over baseline)")
if ("postgres", 1) in med:
    print(f"postgres@{conns} / postgres@1 = {ratio(('postgres', conns), ('postgres', 1))}")
EOF
