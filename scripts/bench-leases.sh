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
# durable write.
#
# Made for a shared machine, whose load moves from one second to the next:
# each store is warmed up first (one run at $LEASES_CONNS connections, not
# counted), then the measurements go in rounds, every round measuring every
# store and connection count once, in an order that runs forward in odd
# rounds and backward in even ones, so that the two figures of each ratio
# are taken next to each other (memory@N beside file@N, file@N beside
# file@1). Each ratio is computed within its round, and the script reports
# the median of the rounds' ratios with their range (a figure moved by a
# noisy neighbour moves one round's ratio, not the median), beside the
# median acquires/s, p50 and p99 per store and connection count. The ratios
# are the ones the performance notes quote: file@N ÷ file@1 and file@N ÷
# memory@N.
#
# With LEASES_BASELINE set to a git revision (such as main), it also builds
# fencegate at that revision (git archive, no worktree) and measures its file
# store beside the current one, as store "file-base", in the same rounds,
# and reports file@1 ÷ file-base@1 for throughput and p50 at one connection,
# and file@N ÷ file-base@N.
#
# Environment: LEASES_DURATION (3s per measurement), LEASES_ROUNDS (7),
# LEASES_CONNS (16), LEASES_WARMUP (2s; 0 skips it),
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

DURATION=${LEASES_DURATION:-3s}
ROUNDS=${LEASES_ROUNDS:-7}
WARMUP=${LEASES_WARMUP:-2s}
CONNS=${LEASES_CONNS:-16}
STORES=${LEASES_STORES:-memory file}
OP=${LEASES_OP:-acquire}

NAME=bench-leases.sh
. scripts/lib.sh # has, say, $tmp, pids and their cleanup, free_port

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
	cleanup_more+=("$fdir")
fi
"$tmp/leasebench" -fsyncprobe "$fdir" -d 2s | sed 's/^/disk: /'

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

# Warm-up: a first run on each store, not counted (the file store's first
# acquisitions grow a new file; the processes reach their steady state).
if [ "$WARMUP" != 0 ]; then
	for st in $STORES; do
		"$tmp/leasebench" -url "${url[$st]}" -conns "$CONNS" -d "$WARMUP" -op "$OP" -prefix "warm-$st" >/dev/null
	done
fi

# One round's measurements, in order: each store at 1 and at N
# connections, the file store's two between the memory store's N and the
# baseline's 1, so that the two figures of each ratio are neighbours.
points=()
for st in $STORES; do
	case $st in
	file) points+=("$st $CONNS" "$st 1") ;;
	*) points+=("$st 1" "$st $CONNS") ;;
	esac
done

results=$tmp/results
: >"$results"
for round in $(seq "$ROUNDS"); do
	order=("${points[@]}")
	if [ $((round % 2)) = 0 ]; then
		order=()
		for ((i = ${#points[@]} - 1; i >= 0; i--)); do order+=("${points[i]}"); done
	fi
	for p in "${order[@]}"; do
		read -r st c <<<"$p"
		line=$("$tmp/leasebench" -url "${url[$st]}" -conns "$c" -d "$DURATION" -op "$OP" -prefix "r$round-$st-$c")
		echo "round $round store=$st $line"
		echo "$round $st $c $line" >>"$results"
	done
done

# Medians over rounds per store and connection count; each ratio within
# its round, then the median and range of the rounds' ratios.
python3 - "$results" "$CONNS" <<'EOF'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    rnd, st, c, *kv = line.split()
    d = dict(x.split("=", 1) for x in kv)
    rows.setdefault(int(rnd), {})[(st, int(c))] = d
n = int(sys.argv[2])
keys = sorted({k for r in rows.values() for k in r})
print(f"{'store':10} {'conns':>5} {'ops/s':>9} {'p50 µs':>8} {'p99 µs':>8} {'errors':>6}")
for k in keys:
    ds = [r[k] for r in rows.values() if k in r]
    ops = statistics.median(float(d["ops_per_s"]) for d in ds)
    p50 = statistics.median(int(d["p50_us"]) for d in ds)
    p99 = statistics.median(int(d["p99_us"]) for d in ds)
    errs = sum(int(d["errors"]) for d in ds)
    print(f"{k[0]:10} {k[1]:5} {ops:9.0f} {p50:8.0f} {p99:8.0f} {errs:6}")
def ratio(name, a, b, field="ops_per_s"):
    rs = sorted(float(r[a][field]) / float(r[b][field])
                for r in rows.values() if a in r and b in r and float(r[b][field]) > 0)
    if rs:
        print(f"{name} = {statistics.median(rs):.2f} (median of {len(rs)} rounds, range {rs[0]:.2f} to {rs[-1]:.2f}: " +
              " ".join(f"{x:.2f}" for x in rs) + ")")
print("ratios, each taken within one round:")
ratio(f"file@{n} / file@1", ("file", n), ("file", 1))
ratio(f"file@{n} / memory@{n}", ("file", n), ("memory", n))
ratio(f"file-base@{n} / file-base@1", ("file-base", n), ("file-base", 1))
ratio("file@1 / file-base@1 (throughput at one connection, current over baseline)", ("file", 1), ("file-base", 1))
ratio(f"file@{n} / file-base@{n} (throughput at {n} connections, current over baseline)", ("file", n), ("file-base", n))
ratio("file@1 p50 / file-base@1 p50 (latency at one connection; below 1 is faster)", ("file", 1), ("file-base", 1), "p50_us")
ratio(f"postgres@{n} / postgres@1", ("postgres", n), ("postgres", 1))
EOF
