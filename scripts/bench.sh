#!/usr/bin/env bash
# Side-by-side speed of fencegate's write gate against nginx, on loopback.
#
# One command: ./scripts/bench.sh. It builds the fencegate binary, starts
#   - an upstream: nginx answering 200 to every request (`return 200`), so
#     the upstream costs the same, and as little as possible, for every path;
#   - nginx as a plain keep-alive reverse proxy in front of it, in
#     processes of its own (upstream keepalive, HTTP/1.1), the yardstick of
#     DESIGN §8;
#   - one fencegate gate per store (memory, file, Valkey on a throwaway
#     redis-server), all forwarding to the same upstream with the route rule
#     `PUT /jobs/{id} fence job:{id}`,
# takes a lease on each of $BENCH_RESOURCES resources through every gate's
# lease API, and drives the same fenced writes at every path with wrk: PUT
# /jobs/<n> with that resource's Fencing-Token and a small JSON body, the
# resources taken in turn. The gates admit every write at the high-water mark
# (the token never changes), so what is measured is the forwarding path plus
# one admission per write. A non-2xx answer is counted and reported: a run
# with refusals measures nothing useful.
#
# Phases, each target measured in turn, rounds interleaved so that a noisy
# neighbour hurts every target alike:
#   1. throughput: $BENCH_ROUNDS rounds of $BENCH_DURATION at $BENCH_CONNS
#      connections; median req/s, p50 and p99 over rounds, the ratios
#      gate ÷ nginx and gate ÷ direct (median, and the range over rounds),
#      the proxy's CPU time per request (user + system, from /proc, all of
#      nginx's processes) and the machine's idle CPU share meanwhile (a
#      proxy that leaves CPU idle while the client waits on it is limited
#      by how its work is spread over threads, not by its cost);
#   2. latency: one connection, median latency, and what each hop adds to
#      the direct path;
#   3. many clients: $BENCH_MANY connections at every gate: req/s, RSS
#      sampled during the run, peak RSS (VmHWM, over the process's life) and
#      the goroutine count (go_goroutines from /metrics) during the run.
#
# Environment: BENCH_DURATION (5s), BENCH_ROUNDS (5), BENCH_CONNS (50),
# BENCH_MANY (1000), BENCH_RESOURCES (64), BENCH_STORES ("memory file
# valkey"), BENCH_THREADS (wrk threads, 2), BENCH_SWITCHES (none): entries
# STORE:VAR=VALUE, each one more gate on STORE started with FENCEGATE_VAR=VALUE
# and measured beside the others in the same rounds (say
# "valkey:MARK_READERS=false memory:IO_URING=false"): a fast path's with and
# without in one run. Missing nginx, wrk, redis-server
# and curl are installed with apt-get when running as root, else it stops.
# Everything it starts is stopped by PID on exit; its files live in one
# temporary directory, removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-5s}
ROUNDS=${BENCH_ROUNDS:-5}
CONNS=${BENCH_CONNS:-50}
MANY=${BENCH_MANY:-1000}
RESOURCES=${BENCH_RESOURCES:-64}
STORES=${BENCH_STORES:-memory file valkey}
THREADS=${BENCH_THREADS:-2}
SWITCHES=${BENCH_SWITCHES:-}

has() { command -v "$1" >/dev/null 2>&1; }
say() { echo "bench.sh: $*" >&2; }

missing=()
has nginx || [ -x /usr/sbin/nginx ] || missing+=(nginx)
has wrk || missing+=(wrk)
has curl || missing+=(curl)
has pgrep || missing+=(procps)
case " $STORES " in *" valkey "*) has redis-server || has valkey-server || missing+=(redis-server) ;; esac
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && has apt-get; then
	say "installing ${missing[*]} with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
		{ apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi
PATH=$PATH:/usr/sbin
for bin in nginx wrk curl; do
	has "$bin" || { say "needs $bin (e.g. apt-get install $bin)"; exit 1; }
done
VALKEY_SERVER=$(command -v valkey-server || command -v redis-server || true)

# 1,000 client connections need as many descriptors in wrk, the proxy and
# (through its pool) the upstream.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-bench.XXXXXX")
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port prints a loopback TCP port nothing listens on, below the
# ephemeral range (a port there may be the local end of another program's
# connection, which a listener cannot take), never the same one twice.
ephemeral=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
given=" "
free_port() {
	local p
	while :; do
		p=$((10000 + RANDOM % (ephemeral - 10000)))
		case $given in *" $p "*) continue ;; esac
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			given+="$p "
			echo "$p"
			return
		fi
	done
}

# wait_http URL PID waits up to 30 s for URL to answer 2xx, as long as the
# process PID runs.
wait_http() {
	local i
	for i in $(seq 300); do
		curl -fs -o /dev/null "$1" && return 0
		kill -0 "$2" 2>/dev/null || break
		sleep 0.1
	done
	say "$1 did not come up"
	tail -n 5 "$tmp"/*.log "$tmp"/*/logs/* >&2 2>/dev/null || true
	exit 1
}

say "building fencegate"
go build -o "$tmp/fencegate" ./cmd/fencegate

# --- upstream and nginx --------------------------------------------------
# Two nginx instances, each its own processes: the upstream, and the
# yardstick proxy in front of it. One instance serving both roles would let
# the proxy reach the upstream inside its own event loop, without the
# cross-process wake-up every sidecar (and the gate) pays.
UP=$(free_port)
NGX=$(free_port)
# start_nginx NAME SERVER-BLOCKS starts an nginx instance in $tmp/NAME.
start_nginx() {
	local dir="$tmp/$1"
	mkdir -p "$dir/logs"
	{
		[ "$(id -u)" = 0 ] && echo "user root;"
		cat <<EOF
worker_processes auto;
daemon off;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 16384; }
http {
    access_log off;
    keepalive_requests 10000000;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
$2
}
EOF
	} >"$dir/nginx.conf"
	nginx -p "$dir" -c "$dir/nginx.conf" 2>>"$dir/logs/stderr" &
	pids+=($!)
}
# The upstream: 200 to everything.
start_nginx upstream "    server {
        listen 127.0.0.1:$UP;
        location / { return 200 \"ok\\n\"; }
    }"
wait_http "http://127.0.0.1:$UP/" "${pids[-1]}"
# The yardstick: a plain keep-alive reverse proxy.
start_nginx nginx "    upstream app {
        server 127.0.0.1:$UP;
        keepalive 256;
        keepalive_requests 10000000;
    }
    server {
        listen 127.0.0.1:$NGX;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
    }"
wait_http "http://127.0.0.1:$NGX/" "${pids[-1]}"
# The second yardstick, when installed: HAProxy as a plain keep-alive
# reverse proxy to the same upstream (Debian's 2.6; one thread per CPU).
HAP=""
if has haproxy || [ -x /usr/sbin/haproxy ]; then
	HAP=$(free_port)
	mkdir -p "$tmp/haproxy"
	printf '%s\n' "global" "    maxconn 8192" "defaults" "    mode http" "    timeout connect 5s" \
		"    timeout client 60s" "    timeout server 60s" "    option http-keep-alive" "    http-reuse always" \
		"frontend gate" "    bind 127.0.0.1:$HAP" "    default_backend app" "backend app" \
		"    server up 127.0.0.1:$UP maxconn 1024" >"$tmp/haproxy/haproxy.cfg"
	"$(command -v haproxy || echo /usr/sbin/haproxy)" -db -f "$tmp/haproxy/haproxy.cfg" >"$tmp/haproxy/log" 2>&1 &
	pids+=($!)
	hap_pid=$!
	wait_http "http://127.0.0.1:$HAP/" "$hap_pid"
fi

# --- Valkey ----------------------------------------------------------------
valkey_url=""
case " $STORES " in *" valkey "*)
	[ -n "$VALKEY_SERVER" ] || { say "needs valkey-server or redis-server"; exit 1; }
	VK=$(free_port)
	mkdir -p "$tmp/valkey"
	"$VALKEY_SERVER" --bind 127.0.0.1 --port "$VK" --dir "$tmp/valkey" --save "" \
		--appendonly no --protected-mode no >"$tmp/valkey/log" 2>&1 &
	pids+=($!)
	for i in $(seq 100); do
		(exec 3<>"/dev/tcp/127.0.0.1/$VK") 2>/dev/null && break
		sleep 0.1
	done
	valkey_url="valkey://127.0.0.1:$VK"
	;;
esac

# --- the gates -----------------------------------------------------------
declare -A gate_port gate_pid gate_api
# A gate per store, then one per switch (named STORE+VAR=VALUE).
gates=$STORES
for sw in $SWITCHES; do
	case $sw in
	*:*=*) gates+=" ${sw%%:*}+${sw#*:}" ;;
	*) say "BENCH_SWITCHES entry $sw is not STORE:VAR=VALUE"; exit 1 ;;
	esac
done
for store in $gates; do
	base=${store%%+*}
	extra=()
	[ "$base" = "$store" ] || extra=("FENCEGATE_${store#*+}")
	case $base in
	memory) url="memory:" ;;
	file) url="file:$tmp/gate-file-$(echo "$store" | tr -c 'A-Za-z0-9\n' _).db" ;;
	valkey) url=$valkey_url ;;
	*) say "unknown store $base (memory, file or valkey)"; exit 1 ;;
	esac
	api=$(free_port)
	gp=$(free_port)
	env FENCEGATE_API_ADDR=127.0.0.1:$api FENCEGATE_PROXY_ADDR=127.0.0.1:$gp \
		FENCEGATE_UPSTREAM=http://127.0.0.1:$UP FENCEGATE_STORE=$url \
		FENCEGATE_KEY_PREFIX=bench-$base FENCEGATE_RULES='PUT /jobs/{id} fence job:{id}' \
		FENCEGATE_LOG_LEVEL=warn OTEL_SDK_DISABLED=true "${extra[@]}" \
		"$tmp/fencegate" serve 2>"$tmp/gate-$store.log" &
	gate_pid[$store]=$!
	pids+=($!)
	gate_port[$store]=$gp
	gate_api[$store]=$api
	wait_http "http://127.0.0.1:$api/readyz" "${gate_pid[$store]}"
	# One lease per resource; its token goes into this gate's wrk script.
	{
		echo "tokens = {"
		for n in $(seq "$RESOURCES"); do
			tok=$(curl -fsS -H 'Content-Type: application/json' \
				-d '{"owner":"bench","ttl_seconds":86400}' \
				"http://127.0.0.1:$api/v1/leases/job:$n/acquire" |
				sed -E 's/.*"token":([0-9]+).*/\1/')
			echo "  \"$tok\","
		done
		echo "}"
	} >"$tmp/tokens-$store.lua"
done

# write_script NAME TOKENS: the wrk script for one target. Each thread
# prebuilds one request per resource and sends them in turn from a random
# start; done() prints one machine-readable line.
write_script() {
	cat "$2" - >"$tmp/wrk-$1.lua" <<'EOF'
local reqs, n, i = {}, 0, 0
function init(args)
  for k, tok in ipairs(tokens) do
    reqs[k] = wrk.format("PUT", "/jobs/" .. k,
      {["Content-Type"] = "application/json", ["Fencing-Token"] = tok}, '{"step":1}')
  end
  n = #reqs
  i = math.random(n) - 1
end
function request()
  i = i % n + 1
  return reqs[i]
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %.1f %.1f %.1f %d %d %d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout, summary.requests))
end
EOF
}
targets=(direct nginx)
declare -A target_port=([direct]=$UP [nginx]=$NGX)
if [ -n "$HAP" ]; then
	targets+=(haproxy)
	target_port[haproxy]=$HAP
fi
first=""
for store in $gates; do
	write_script "gate-$store" "$tmp/tokens-$store.lua"
	targets+=("gate-$store")
	target_port[gate-$store]=${gate_port[$store]}
	first=${first:-$store}
done
# Direct and nginx get the same requests (tokens of the first gate; the
# upstream ignores them).
write_script direct "$tmp/tokens-$first.lua"
cp "$tmp/wrk-direct.lua" "$tmp/wrk-nginx.lua"
[ -z "$HAP" ] || cp "$tmp/wrk-direct.lua" "$tmp/wrk-haproxy.lua"

# proxy_pids TARGET: the processes of TARGET's proxy (nginx's master and
# workers, or the gate); none for direct.
proxy_pids() {
	case $1 in
	direct) ;;
	nginx)
		local m
		m=$(cat "$tmp/nginx/nginx.pid")
		echo "$m" $(pgrep -P "$m")
		;;
	haproxy) echo "$hap_pid" ;;
	gate-*) echo "${gate_pid[${1#gate-}]}" ;;
	esac
}
# cpu_ticks PID...: user + system clock ticks those processes used so far
# (utime and stime, the 12th and 13th fields after the command's name).
cpu_ticks() {
	local p f=()
	for p in "$@"; do f+=("/proc/$p/stat"); done
	[ "${#f[@]}" -gt 0 ] || { echo 0; return; }
	awk '{ sub(/.*\) /, ""); split($0, a, " "); t += a[12] + a[13] } END { print t + 0 }' "${f[@]}" 2>/dev/null
}
# machine_ticks: "idle total" clock ticks of all CPUs so far (/proc/stat).
machine_ticks() { awk '/^cpu /{t=0; for (i=2;i<=NF;i++) t+=$i; print $5+$6, t; exit}' /proc/stat; }
TICK=$(getconf CLK_TCK)

# run TARGET CONNS THREADS: one wrk run; prints "req/s p50µs p99µs non2xx
# sockerr cpuµs idle%": cpuµs is the proxy's CPU time (user + system) per
# request ("-" for direct), idle% the machine's idle CPU share meanwhile.
run() {
	local out pp c0 c1 i0 t0 i1 t1
	pp=$(proxy_pids "$1")
	c0=$(cpu_ticks $pp)
	read -r i0 t0 < <(machine_ticks)
	out=$(wrk -t"$3" -c"$2" -d"$DURATION" --timeout 10s -s "$tmp/wrk-$1.lua" \
		"http://127.0.0.1:${target_port[$1]}" 2>&1) || { say "wrk failed on $1: $out"; exit 1; }
	c1=$(cpu_ticks $pp)
	read -r i1 t1 < <(machine_ticks)
	sed -n 's/^RESULT //p' <<<"$out" | awk -v c=$((c1 - c0)) -v pp="$pp" -v tick="$TICK" \
		-v idle=$((i1 - i0)) -v total=$((t1 - t0)) '{
		cpu = pp == "" || $6 == 0 ? "-" : sprintf("%.1f", c / tick * 1e6 / $6)
		print $1, $2, $3, $4, $5, cpu, sprintf("%.0f", total ? 100 * idle / total : 0)
	}'
}

echo "fencegate bench: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  $(go version | cut -d' ' -f3), $(nginx -v 2>&1 | cut -d' ' -f3), $("$tmp/fencegate" version 2>/dev/null | head -1)${VALKEY_SERVER:+, $("$VALKEY_SERVER" --version | cut -d' ' -f1-3)}"
echo "  upstream: nginx return 200; $RESOURCES resources; wrk -t$THREADS; $ROUNDS rounds x $DURATION per target, interleaved"
echo

# --- 1. throughput ---------------------------------------------------------
say "throughput: $ROUNDS rounds at $CONNS connections"
: >"$tmp/results"
for r in $(seq "$ROUNDS"); do
	for t in "${targets[@]}"; do
		echo "$r $t $(run "$t" "$CONNS" "$THREADS")" >>"$tmp/results"
	done
done
echo "Throughput, $CONNS connections (median of $ROUNDS rounds; ratio range over rounds):"
awk -v targets="${targets[*]}" '
function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
{ rps[$2, $1] = $3; p50[$2, $1] = $4; p99[$2, $1] = $5; bad[$2] += $6 + $7; cpu[$2, $1] = $8; idle[$2, $1] = $9; if ($1 > rounds) rounds = $1 }
END {
	n = split(targets, T, " ")
	hap = (("haproxy", 1) in rps)
	printf "  %-31s %10s %9s %9s %10s %14s %10s %14s %10s %14s %8s %9s %6s\n", "target", "req/s", "p50 µs", "p99 µs", "÷ nginx", "(range)", "÷ haproxy", "(range)", "÷ direct", "(range)", "errors", "CPU µs", "idle"
	for (k = 1; k <= n; k++) {
		t = T[k]
		for (r = 1; r <= rounds; r++) { a[r] = rps[t, r]; b[r] = p50[t, r]; c[r] = p99[t, r]; x[r] = rps[t, r] / rps["nginx", r]; y[r] = rps[t, r] / rps["direct", r]; z[r] = hap ? rps[t, r] / rps["haproxy", r] : 0; u[r] = cpu[t, r]; v[r] = idle[t, r] }
		m = median(a, rounds); m50 = median(b, rounds); m99 = median(c, rounds)
		lo = hi = x[1]; dlo = dhi = y[1]; hlo = hhi = z[1]
		for (r = 2; r <= rounds; r++) { if (x[r] < lo) lo = x[r]; if (x[r] > hi) hi = x[r]; if (y[r] < dlo) dlo = y[r]; if (y[r] > dhi) dhi = y[r]; if (z[r] < hlo) hlo = z[r]; if (z[r] > hhi) hhi = z[r] }
		hm = hap ? median(z, rounds) : 0
		printf "  %-31s %10.0f %9.0f %9.0f %10.2f %14s %10s %14s %10.2f %14s %8d %9s %5.0f%%\n", t, m, m50, m99, median(x, rounds), sprintf("%.2f–%.2f", lo, hi), hap ? sprintf("%.2f", hm) : "–", hap ? sprintf("%.2f–%.2f", hlo, hhi) : "–", median(y, rounds), sprintf("%.2f–%.2f", dlo, dhi), bad[t], t == "direct" ? "–" : sprintf("%.1f", median(u, rounds)), median(v, rounds)
	}
}' "$tmp/results"
echo

# --- 2. one connection -----------------------------------------------------
say "latency: one connection"
: >"$tmp/c1"
for t in "${targets[@]}"; do
	echo "$t $(run "$t" 1 1)" >>"$tmp/c1"
done
echo "One connection (median latency; added = what the hop adds to direct):"
awk '
{ t[NR] = $1; p[NR] = $3; rps[NR] = $2; if ($1 == "direct") d = $3 }
END {
	printf "  %-31s %10s %9s %11s\n", "target", "req/s", "p50 µs", "added µs"
	for (i = 1; i <= NR; i++) printf "  %-31s %10.0f %9.0f %11s\n", t[i], rps[i], p[i], t[i] == "direct" ? "–" : sprintf("%+.0f", p[i] - d)
}' "$tmp/c1"
echo

# --- 3. many clients -------------------------------------------------------
say "memory: $MANY connections"
echo "$MANY connections (RSS sampled during the run; peak = VmHWM over the process's life):"
printf "  %-31s %10s %9s %9s %12s %12s %11s %8s\n" target req/s "p50 µs" "p99 µs" "RSS MiB" "peak MiB" goroutines errors
kib() { awk -v k="$1" '/^'"$1"':/ {print $2}' "/proc/$2/status"; }
for t in "${targets[@]:1}"; do
	store=${t#gate-}
	run "$t" "$MANY" "$THREADS" >"$tmp/many" &
	wpid=$!
	pids+=($wpid)
	rss=0
	gor="–"
	sleep "$(awk -v d="${DURATION%s}" 'BEGIN{print d/2}')"
	if [ "$t" != nginx ] && [ "$t" != haproxy ]; then
		rss=$(kib VmRSS "${gate_pid[$store]}")
		gor=$(curl -fs "http://127.0.0.1:${gate_api[$store]}/metrics" | awk '/^go_goroutines /{print $2}' || true)
	fi
	wait "$wpid"
	read -r rps p50 p99 st se _ <"$tmp/many"
	if [ "$t" = nginx ] || [ "$t" = haproxy ]; then
		printf "  %-31s %10.0f %9.0f %9.0f %12s %12s %11s %8d\n" "$t" "$rps" "$p50" "$p99" – – – $((st + se))
	else
		hwm=$(kib VmHWM "${gate_pid[$store]}")
		printf "  %-31s %10.0f %9.0f %9.0f %12.1f %12.1f %11s %8d\n" "$t" "$rps" "$p50" "$p99" \
			"$(awk -v k="$rss" 'BEGIN{print k/1024}')" "$(awk -v k="$hwm" 'BEGIN{print k/1024}')" "${gor:-–}" $((st + se))
	fi
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "errors = non-2xx answers + socket errors (should be 0). Target: gate ≥ 1.0× nginx and HAProxy,"
echo "added p50 ≤ nginx's + one store round trip, ≤ 64 MiB RSS at 1,000 connections."
