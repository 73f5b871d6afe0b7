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
#      nginx's processes), the whole machine's busy CPU time per request
#      (every process: wrk, the upstream, the proxy, a Valkey server; the
#      budget the targets share, so the proxy's column against this one
#      shows what the rest costs) and the machine's idle CPU share
#      meanwhile (a proxy that leaves CPU idle while the client waits on it
#      is limited by how its work is spread over threads, not by its cost);
#   2. latency: one connection, $BENCH_LAT_ROUNDS interleaved rounds; the
#      median p50 latency over rounds and what each hop adds to the direct
#      path, taken within each round (median and range), and each row's p50
#      minus nginx's, paired within each round the same way; after each
#      Valkey gate's run, the Valkey server's PING round trip at one
#      connection (redis-benchmark's p50), and the gate's p50 minus nginx's
#      minus that PING's, paired the same way (the latency goal: at most 0);
#   3. many clients: $BENCH_MANY connections at every gate: req/s, RSS
#      sampled during the run, peak RSS (VmHWM, over the process's life) and
#      the goroutine count (go_goroutines from /metrics) during the run;
#   4. TLS: the same writes over HTTPS (keep-alive, HTTP/1.1), rounds as in
#      1, at nginx and HAProxy terminating TLS (the same processes as above,
#      one more listener each) and at one more gate per store serving
#      FENCEGATE_PROXY_TLS_CERT, all with the same throwaway certificate
#      (ECDSA P-256, made with openssl in the temporary directory) and the
#      same cleartext keep-alive upstream; ratios against the TLS rows of
#      nginx and HAProxy (DESIGN §11's target: gate ≥ 0.8× nginx). Then,
#      for information, HTTP/2 by ALPN with h2load (nghttp2-client):
#      $BENCH_H2_CONNS connections x $BENCH_H2_STREAMS streams of the same
#      PUT on one resource (h2load sends one header set; tokens differ per
#      resource), one run per target.
#
#      Then the TLS rows at one connection (latency) and at $BENCH_MANY
#      connections (RSS), as in 2 and 3.
#
# ./scripts/bench.sh -p runs phase 1 only (throughput: a switch's with and
# without, say, in a few minutes).
# ./scripts/bench.sh -l runs phase 2 only.
# ./scripts/bench.sh -t runs phase 4 only (and starts only the TLS gates;
# there, each BENCH_SWITCHES entry is one more TLS gate, say
# BENCH_SWITCHES="memory:TLS_LOOPS=false").
#
# With BENCH_BASELINE set to a git revision (such as main), each store gets
# one more gate built at that revision (git archive, no worktree), named
# STORE@base and measured beside the current one in the same rounds: a
# change to the engine measured against what it changes, in one run.
#
# Environment: BENCH_DURATION (5s), BENCH_ROUNDS (5), BENCH_LAT_ROUNDS
# (BENCH_ROUNDS), BENCH_CONNS (50),
# BENCH_MANY (1000), BENCH_RESOURCES (64), BENCH_STORES ("memory file
# valkey"), BENCH_THREADS (wrk and h2load threads, 2), BENCH_H2_CONNS (10),
# BENCH_H2_STREAMS (10), BENCH_SWITCHES (none): entries
# STORE:VAR=VALUE, each one more gate on STORE started with FENCEGATE_VAR=VALUE
# and measured beside the others in the same rounds (say
# "valkey:MARK_READERS=false memory:IO_URING=false"): a fast path's with and
# without in one run. Missing nginx, wrk, redis-server, curl and openssl
# are installed with apt-get when running as root, else it stops; so are
# h2load, without which the HTTP/2 row is left out, and haproxy, without
# which its rows are.
# Everything it starts is stopped by PID on exit; its files live in one
# temporary directory, removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

TLS_ONLY=""
LAT_ONLY=""
THROUGHPUT_ONLY=""
while getopts hlpt opt; do
	case $opt in
	p) THROUGHPUT_ONLY=1 ;;
	t) TLS_ONLY=1 ;;
	l) LAT_ONLY=1 ;;
	*)
		sed -n '2,/^set -e/{/^set -e/d;s/^# \{0,1\}//;p}' "$0" >&2
		[ "$opt" = h ] && exit 0 || exit 2
		;;
	esac
done

DURATION=${BENCH_DURATION:-5s}
ROUNDS=${BENCH_ROUNDS:-5}
LAT_ROUNDS=${BENCH_LAT_ROUNDS:-$ROUNDS}
CONNS=${BENCH_CONNS:-50}
MANY=${BENCH_MANY:-1000}
RESOURCES=${BENCH_RESOURCES:-64}
STORES=${BENCH_STORES:-memory file valkey}
THREADS=${BENCH_THREADS:-2}
H2_CONNS=${BENCH_H2_CONNS:-10}
H2_STREAMS=${BENCH_H2_STREAMS:-10}
SWITCHES=${BENCH_SWITCHES:-}
BASELINE=${BENCH_BASELINE:-}

NAME=bench.sh
. scripts/lib.sh # has, say, $tmp, pids and their cleanup, free_port

missing=()
has nginx || [ -x /usr/sbin/nginx ] || missing+=(nginx)
has haproxy || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
has wrk || missing+=(wrk)
has curl || missing+=(curl)
has pgrep || missing+=(procps)
has openssl || missing+=(openssl)
has h2load || missing+=(nghttp2-client)
case " $STORES " in *" valkey "*) has redis-server || has valkey-server || missing+=(redis-server) ;; esac
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && has apt-get; then
	say "installing ${missing[*]} with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
		{ apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi
PATH=$PATH:/usr/sbin
for bin in nginx wrk curl openssl; do
	has "$bin" || { say "needs $bin (e.g. apt-get install $bin)"; exit 1; }
done
VALKEY_SERVER=$(command -v valkey-server || command -v redis-server || true)

# 1,000 client connections need as many descriptors in wrk, the proxy and
# (through its pool) the upstream.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# wait_http URL PID waits up to 30 s for URL to answer 2xx, as long as the
# process PID runs.
wait_http() {
	local i
	for i in $(seq 300); do
		curl -fs --cacert "$tmp/tls/ca.crt" -o /dev/null "$1" && return 0
		kill -0 "$2" 2>/dev/null || break
		sleep 0.1
	done
	say "$1 did not come up"
	tail -n 5 "$tmp"/*.log "$tmp"/*/logs/* >&2 2>/dev/null || true
	exit 1
}

say "building fencegate"
go build -o "$tmp/fencegate" ./cmd/fencegate
if [ -n "$BASELINE" ]; then
	say "building fencegate at $BASELINE"
	mkdir "$tmp/base"
	git archive "$BASELINE" | tar -x -C "$tmp/base"
	(cd "$tmp/base" && go build -o "$tmp/fencegate-base" ./cmd/fencegate)
fi

# --- TLS material ----------------------------------------------------------
# A throwaway CA and one server certificate for 127.0.0.1, which nginx,
# HAProxy and the TLS gates all present.
mkdir -p "$tmp/tls"
(
	cd "$tmp/tls"
	ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
	openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 2 -subj /CN=fencegate-bench-ca
	openssl req "${ec[@]}" -keyout srv.key -out srv.csr -subj /CN=127.0.0.1
	printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >srv.ext
	openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile srv.ext -out srv.crt
	cat srv.crt srv.key >srv.pem # HAProxy's crt: certificate and key in one file
) >"$tmp/tls/log" 2>&1 || { say "openssl could not make the certificates:"; cat "$tmp/tls/log" >&2; exit 1; }

# --- upstream and nginx --------------------------------------------------
# Two nginx instances, each its own processes: the upstream, and the
# yardstick proxy in front of it. One instance serving both roles would let
# the proxy reach the upstream inside its own event loop, without the
# cross-process wake-up every sidecar (and the gate) pays.
UP=$(free_port)
NGX=$(free_port)
NGXS=$(free_port)
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
    }
    server {
        listen 127.0.0.1:$NGXS ssl http2;
        ssl_certificate $tmp/tls/srv.crt;
        ssl_certificate_key $tmp/tls/srv.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
    }"
wait_http "http://127.0.0.1:$NGX/" "${pids[-1]}"
wait_http "https://127.0.0.1:$NGXS/" "${pids[-1]}"
# The second yardstick, when installed: HAProxy as a plain keep-alive
# reverse proxy to the same upstream (Debian's 2.6; one thread per CPU).
# It terminates TLS too, on a second frontend.
HAP=""
if has haproxy || [ -x /usr/sbin/haproxy ]; then
	HAP=$(free_port)
	HAPS=$(free_port)
	mkdir -p "$tmp/haproxy"
	printf '%s\n' "global" "    maxconn 8192" "defaults" "    mode http" "    timeout connect 5s" \
		"    timeout client 60s" "    timeout server 60s" "    option http-keep-alive" "    http-reuse always" \
		"frontend gate" "    bind 127.0.0.1:$HAP" "    default_backend app" \
		"frontend gatetls" "    bind 127.0.0.1:$HAPS ssl crt $tmp/tls/srv.pem alpn h2,http/1.1" "    default_backend app" \
		"backend app" "    server up 127.0.0.1:$UP maxconn 1024" >"$tmp/haproxy/haproxy.cfg"
	"$(command -v haproxy || echo /usr/sbin/haproxy)" -db -f "$tmp/haproxy/haproxy.cfg" >"$tmp/haproxy/log" 2>&1 &
	pids+=($!)
	hap_pid=$!
	wait_http "http://127.0.0.1:$HAP/" "$hap_pid"
	wait_http "https://127.0.0.1:$HAPS/" "$hap_pid"
fi

# --- Valkey ----------------------------------------------------------------
valkey_url=""
VK=""
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
# A gate per store, then one per switch (named STORE+VAR=VALUE), then one
# per store serving TLS (named tls-STORE); with -t only the last, and one
# TLS gate per switch (tls-STORE+VAR=VALUE).
gates=""
tls_gates=""
if [ -z "$TLS_ONLY" ]; then
	gates=$STORES
	if [ -n "$BASELINE" ]; then
		for store in $STORES; do gates+=" $store@base"; done
	fi
	for sw in $SWITCHES; do
		case $sw in
		*:*=*) gates+=" ${sw%%:*}+${sw#*:}" ;;
		*) say "BENCH_SWITCHES entry $sw is not STORE:VAR=VALUE"; exit 1 ;;
		esac
	done
fi
[ -n "$LAT_ONLY$THROUGHPUT_ONLY" ] || for store in $STORES; do tls_gates+=" tls-$store"; done
if [ -n "$TLS_ONLY" ] && [ -n "$BASELINE" ]; then
	for store in $STORES; do tls_gates+=" tls-$store@base"; done
fi
if [ -n "$TLS_ONLY" ]; then
	for sw in $SWITCHES; do
		case $sw in
		*:*=*) tls_gates+=" tls-${sw%%:*}+${sw#*:}" ;;
		*) say "BENCH_SWITCHES entry $sw is not STORE:VAR=VALUE"; exit 1 ;;
		esac
	done
fi
for store in $gates $tls_gates; do
	base=${store#tls-}
	base=${base%%+*}
	bin=$tmp/fencegate
	keys=""
	case $base in *@base) bin=$tmp/fencegate-base keys=-base ;; esac
	base=${base%@base}
	extra=()
	prefix=bench-$base$keys
	case $store in
	tls-*)
		extra=("FENCEGATE_PROXY_TLS_CERT=$tmp/tls/srv.crt" "FENCEGATE_PROXY_TLS_KEY=$tmp/tls/srv.key")
		prefix=bench-tls-$base$keys
		;;
	esac
	case $store in *+*) extra+=("FENCEGATE_${store#*+}") ;; esac
	# wrk's connections all come from one address: past the per-client
	# share (a quarter of FENCEGATE_MAX_CONNS) a gate would refuse them. A
	# baseline built before the share existed has none (and would refuse
	# the variable).
	if [ "$MANY" -gt 1024 ] && [ -z "$keys" ]; then extra+=("FENCEGATE_MAX_CONNS_PER_CLIENT=0"); fi
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
		FENCEGATE_KEY_PREFIX=$prefix FENCEGATE_RULES='PUT /jobs/{id} fence job:{id}' \
		FENCEGATE_LOG_LEVEL=warn OTEL_SDK_DISABLED=true "${extra[@]}" \
		"$bin" serve 2>"$tmp/gate-$store.log" &
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
# targets are the cleartext rows, tls_targets the TLS rows (direct, the
# cleartext upstream, stays in them as the reference of ÷ direct).
targets=(direct nginx)
tls_targets=(direct nginx-tls)
declare -A target_url=([direct]=http://127.0.0.1:$UP [nginx]=http://127.0.0.1:$NGX [nginx-tls]=https://127.0.0.1:$NGXS)
if [ -n "$HAP" ]; then
	targets+=(haproxy)
	tls_targets+=(haproxy-tls)
	target_url[haproxy]=http://127.0.0.1:$HAP
	target_url[haproxy-tls]=https://127.0.0.1:$HAPS
fi
first=""
for store in $gates $tls_gates; do
	write_script "gate-$store" "$tmp/tokens-$store.lua"
	case $store in
	tls-*)
		tls_targets+=("gate-$store")
		target_url[gate-$store]=https://127.0.0.1:${gate_port[$store]}
		;;
	*)
		targets+=("gate-$store")
		target_url[gate-$store]=http://127.0.0.1:${gate_port[$store]}
		;;
	esac
	first=${first:-$store}
done
# Direct, nginx and HAProxy get the same requests (tokens of the first
# gate; the upstream ignores them).
write_script direct "$tmp/tokens-$first.lua"
for t in nginx nginx-tls haproxy haproxy-tls; do cp "$tmp/wrk-direct.lua" "$tmp/wrk-$t.lua"; done

# proxy_pids TARGET: the processes of TARGET's proxy (nginx's master and
# workers, or the gate); none for direct.
proxy_pids() {
	case $1 in
	direct) ;;
	nginx | nginx-tls)
		local m
		m=$(cat "$tmp/nginx/nginx.pid")
		echo "$m" $(pgrep -P "$m")
		;;
	haproxy | haproxy-tls) echo "$hap_pid" ;;
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
# sockerr cpuµs idle% machineµs": cpuµs is the proxy's CPU time (user +
# system) per request ("-" for direct), idle% the machine's idle CPU share
# meanwhile, machineµs the machine's busy CPU time per request (all CPUs).
run() {
	local out pp c0 c1 i0 t0 i1 t1
	pp=$(proxy_pids "$1")
	c0=$(cpu_ticks $pp)
	read -r i0 t0 < <(machine_ticks)
	out=$(wrk -t"$3" -c"$2" -d"$DURATION" --timeout 10s -s "$tmp/wrk-$1.lua" \
		"${target_url[$1]}" 2>&1) || { say "wrk failed on $1: $out"; exit 1; }
	c1=$(cpu_ticks $pp)
	read -r i1 t1 < <(machine_ticks)
	sed -n 's/^RESULT //p' <<<"$out" | awk -v c=$((c1 - c0)) -v pp="$pp" -v tick="$TICK" \
		-v idle=$((i1 - i0)) -v total=$((t1 - t0)) '{
		cpu = pp == "" || $6 == 0 ? "-" : sprintf("%.1f", c / tick * 1e6 / $6)
		print $1, $2, $3, $4, $5, cpu, sprintf("%.0f", total ? 100 * idle / total : 0), $6 ? sprintf("%.1f", (total - idle) / tick * 1e6 / $6) : "-"
	}'
}

echo "fencegate bench: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  $(go version | cut -d' ' -f3), $(nginx -v 2>&1 | cut -d' ' -f3), $("$tmp/fencegate" version 2>/dev/null | head -1)${VALKEY_SERVER:+, $("$VALKEY_SERVER" --version | cut -d' ' -f1-3)}"
echo "  upstream: nginx return 200; $RESOURCES resources; wrk -t$THREADS; $ROUNDS rounds x $DURATION per target, interleaved"
echo

# AWK_STATS are the tables' statistics over a[1..n]: the median (which
# sorts a in place), and the least and the most.
AWK_STATS='
function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
function least(a, n,   i, v) { v = a[1]; for (i = 2; i <= n; i++) if (a[i] < v) v = a[i]; return v }
function most(a, n,   i, v) { v = a[1]; for (i = 2; i <= n; i++) if (a[i] > v) v = a[i]; return v }'
# throughput FILE NGINX HAPROXY TARGET...: the throughput table of the
# rounds in FILE, with ratios to the rows NGINX, HAPROXY and direct.
throughput() {
	local f=$1 ng=$2 hp=$3
	shift 3
	awk -v targets="$*" -v nginx="$ng" -v haproxy="$hp" "$AWK_STATS"'
{ rps[$2, $1] = $3; p50[$2, $1] = $4; p99[$2, $1] = $5; bad[$2] += $6 + $7; cpu[$2, $1] = $8; idle[$2, $1] = $9; all[$2, $1] = $10; if ($1 > rounds) rounds = $1 }
END {
	n = split(targets, T, " ")
	hap = ((haproxy, 1) in rps)
	printf "  %-31s %10s %9s %9s %10s %14s %10s %14s %10s %14s %8s %9s %9s %6s\n", "target", "req/s", "p50 µs", "p99 µs", "÷ nginx", "(range)", "÷ haproxy", "(range)", "÷ direct", "(range)", "errors", "CPU µs", "all µs", "idle"
	for (k = 1; k <= n; k++) {
		t = T[k]
		for (r = 1; r <= rounds; r++) { a[r] = rps[t, r]; b[r] = p50[t, r]; c[r] = p99[t, r]; x[r] = rps[t, r] / rps[nginx, r]; y[r] = rps[t, r] / rps["direct", r]; z[r] = hap ? rps[t, r] / rps[haproxy, r] : 0; u[r] = cpu[t, r]; v[r] = idle[t, r]; w[r] = all[t, r] }
		m = median(a, rounds); m50 = median(b, rounds); m99 = median(c, rounds)
		hm = hap ? median(z, rounds) : 0
		printf "  %-31s %10.0f %9.0f %9.0f %10.2f %14s %10s %14s %10.2f %14s %8d %9s %9.1f %5.0f%%\n", t, m, m50, m99, median(x, rounds), sprintf("%.2f–%.2f", least(x, rounds), most(x, rounds)), hap ? sprintf("%.2f", hm) : "–", hap ? sprintf("%.2f–%.2f", least(z, rounds), most(z, rounds)) : "–", median(y, rounds), sprintf("%.2f–%.2f", least(y, rounds), most(y, rounds)), bad[t], t == "direct" ? "–" : sprintf("%.1f", median(u, rounds)), median(w, rounds), median(v, rounds)
	}
}' "$f"
}
# rounds FILE TARGET...: $ROUNDS rounds over the targets, interleaved.
rounds() {
	local f=$1 r t
	shift
	: >"$f"
	for r in $(seq "$ROUNDS"); do
		for t in "$@"; do
			echo "$r $t $(run "$t" "$CONNS" "$THREADS")" >>"$f"
		done
	done
}

# one_connection TARGET...: each target at one connection, direct first,
# in $LAT_ROUNDS rounds whose order runs forward in odd rounds and backward
# in even ones. A target's added latency is taken within each round (its
# p50 minus direct's p50 of the same round); the table gives the medians
# over rounds, and the range of the added latency. "vs nginx" is the same
# pairing against the nginx row of the table (nginx or nginx-tls): each
# round's p50 minus nginx's p50 of that round, median and range over the
# rounds, the figure the latency goal compares (a round that drifts moves
# both of its p50s, not their difference).
one_connection() {
	local r t order
	: >"$tmp/c1"
	for r in $(seq "$LAT_ROUNDS"); do
		order=("$@")
		if [ $((r % 2)) = 0 ]; then
			order=()
			for t in "$@"; do order=("$t" "${order[@]}"); done
		fi
		for t in "${order[@]}"; do
			echo "$r $t $(run "$t" 1 1)" >>"$tmp/c1"
			case $t in *valkey*) ping_p50 | sed "s/^/$r ping:$t 0 /" >>"$tmp/c1" ;; esac
		done
	done
	awk -v targets="$*" "$AWK_STATS"'
{ rps[$2, $1] = $3; p50[$2, $1] = $4; cpu[$2, $1] = $8; if ($1 > rounds) rounds = $1 }
END {
	n = split(targets, t, " ")
	ref = ""
	for (i = 1; i <= n; i++) if (t[i] == "nginx" || t[i] == "nginx-tls") ref = t[i]
	printf "  %-31s %10s %9s %11s %17s %12s %10s %17s\n", "target", "req/s", "p50 µs", "added µs", "added range", "CPU µs/req", "vs nginx", "vs nginx range"
	for (i = 1; i <= n; i++) {
		for (r = 1; r <= rounds; r++) {
			a[r] = rps[t[i], r]; b[r] = p50[t[i], r]; c[r] = p50[t[i], r] - p50["direct", r]; u[r] = cpu[t[i], r]
			d[r] = p50[t[i], r] - p50[ref, r]
		}
		vs = "–"; vsr = "–"
		if (ref != "" && t[i] != "direct" && t[i] != ref) { vs = sprintf("%+.0f", median(d, rounds)); vsr = sprintf("%+.0f to %+.0f", least(d, rounds), most(d, rounds)) }
		if (t[i] == "direct") printf "  %-31s %10.0f %9.0f %11s %17s %12s %10s %17s\n", t[i], median(a, rounds), median(b, rounds), "–", "–", "–", "–", "–"
		else printf "  %-31s %10.0f %9.0f %11s %17s %12.1f %10s %17s\n", t[i], median(a, rounds), median(b, rounds), sprintf("%+.0f", median(c, rounds)), sprintf("%+.0f to %+.0f", least(c, rounds), most(c, rounds)), median(u, rounds), vs, vsr
	}
	for (i = 1; i <= n; i++) {
		pt = "ping:" t[i]
		have = 0
		for (r = 1; r <= rounds; r++) if ((pt, r) in p50) have++
		if (have == 0) continue
		if (have < rounds) { printf "  %s: no PING in %d of %d rounds, not paired\n", t[i], rounds - have, rounds; continue }
		for (r = 1; r <= rounds; r++) { a[r] = p50[pt, r]; d[r] = p50[t[i], r] - p50[ref, r] - p50[pt, r] }
		printf "  %s: Valkey PING p50 right after it %.0f µs (%.0f to %.0f); p50 minus %s p50 minus PING p50, in each round: %+.0f µs (%+.0f to %+.0f)\n", t[i], median(a, rounds), least(a, rounds), most(a, rounds), ref, median(d, rounds), least(d, rounds), most(d, rounds)
	}
}' "$tmp/c1"
}
# ping_p50 prints the Valkey server's round trip at one connection in µs
# (PING, redis-benchmark's p50 over 20,000), nothing without a Valkey
# server or a benchmark tool. DESIGN's latency goal for the Valkey gate is
# nginx's added latency plus one store round trip: one_connection measures
# it right after each Valkey gate's run and pairs it within the round.
ping_p50() {
	local tool
	[ -n "$VK" ] || return 0
	tool=$(command -v valkey-benchmark || command -v redis-benchmark || true)
	[ -n "$tool" ] || return 0
	"$tool" -h 127.0.0.1 -p "$VK" -c 1 -n 20000 -t ping_mbulk --csv 2>/dev/null |
		awk -F'"' 'NR == 2 { printf "%.0f\n", $10 * 1000 }'
}
kib() { awk -v k="$1" '/^'"$1"':/ {print $2}' "/proc/$2/status"; }
# many TARGET...: each target at $MANY connections, with the gates' RSS.
many() {
	local t store wpid rss gor rps p50 p99 st se hwm
	printf "  %-31s %10s %9s %9s %12s %12s %11s %8s\n" target req/s "p50 µs" "p99 µs" "RSS MiB" "peak MiB" goroutines errors
	for t in "$@"; do
		store=${t#gate-}
		run "$t" "$MANY" "$THREADS" >"$tmp/many" &
		wpid=$!
		pids+=($wpid)
		rss=0
		gor="–"
		sleep "$(awk -v d="${DURATION%s}" 'BEGIN{print d/2}')"
		case $t in
		gate-*)
			rss=$(kib VmRSS "${gate_pid[$store]}")
			gor=$(curl -fs "http://127.0.0.1:${gate_api[$store]}/metrics" | awk '/^go_goroutines /{print $2}' || true)
			;;
		esac
		wait "$wpid"
		read -r rps p50 p99 st se _ <"$tmp/many"
		case $t in
		gate-*)
			hwm=$(kib VmHWM "${gate_pid[$store]}")
			printf "  %-31s %10.0f %9.0f %9.0f %12.1f %12.1f %11s %8d\n" "$t" "$rps" "$p50" "$p99" \
				"$(awk -v k="$rss" 'BEGIN{print k/1024}')" "$(awk -v k="$hwm" 'BEGIN{print k/1024}')" "${gor:-–}" $((st + se))
			;;
		*) printf "  %-31s %10.0f %9.0f %9.0f %12s %12s %11s %8d\n" "$t" "$rps" "$p50" "$p99" – – – $((st + se)) ;;
		esac
	done
}

if [ -z "$TLS_ONLY" ]; then
# --- 1. throughput ---------------------------------------------------------
if [ -z "$LAT_ONLY" ]; then
say "throughput: $ROUNDS rounds at $CONNS connections"
rounds "$tmp/results" "${targets[@]}"
echo "Throughput, $CONNS connections (median of $ROUNDS rounds; ratio range over rounds):"
throughput "$tmp/results" nginx haproxy "${targets[@]}"
echo
[ -n "$THROUGHPUT_ONLY" ] && exit 0
fi

# --- 2. one connection -----------------------------------------------------
say "latency: one connection, $LAT_ROUNDS rounds"
echo "One connection (median over $LAT_ROUNDS rounds of p50 latency; added = what the hop adds to direct in the same round):"
one_connection "${targets[@]}"
echo
[ -n "$LAT_ONLY" ] && exit 0

# --- 3. many clients -------------------------------------------------------
say "memory: $MANY connections"
echo "$MANY connections (RSS sampled during the run; peak = VmHWM over the process's life):"
many "${targets[@]:1}"
echo
fi

# --- 4. TLS ----------------------------------------------------------------
say "TLS: $ROUNDS rounds at $CONNS connections"
rounds "$tmp/tls-results" "${tls_targets[@]}"
echo "TLS (HTTPS, HTTP/1.1 keep-alive), $CONNS connections (median of $ROUNDS rounds; ÷ nginx and ÷ haproxy: their TLS rows; ÷ direct: the cleartext upstream):"
throughput "$tmp/tls-results" nginx-tls haproxy-tls "${tls_targets[@]}"
echo
say "TLS latency: one connection, $LAT_ROUNDS rounds"
echo "TLS, one connection (median over $LAT_ROUNDS rounds of p50 latency; added = what the hop adds to direct, the cleartext upstream, in the same round):"
one_connection "${tls_targets[@]}"
echo
say "TLS memory: $MANY connections"
echo "TLS, $MANY connections (at least 10 s; RSS sampled halfway; peak = VmHWM over the process's life):"
# 1,000 TLS handshakes at once take wrk a few seconds (SYNs beyond the
# backlog are retried): these runs are at least 10 s.
DURATION=$(awk -v d="${DURATION%s}" 'BEGIN{print (d < 10 ? 10 : d) "s"}') many "${tls_targets[@]:1}"
echo
if has h2load; then
	say "HTTP/2: $H2_CONNS connections x $H2_STREAMS streams"
	echo '{"step":1}' >"$tmp/h2-body"
	echo "HTTP/2 by ALPN, for information ($H2_CONNS connections x $H2_STREAMS streams, h2load -t$THREADS, $DURATION, PUT /jobs/1 on one resource):"
	printf "  %-31s %10s %10s %8s\n" target req/s "÷ nginx" errors
	h2nginx=""
	for t in "${tls_targets[@]:1}"; do
		case $t in gate-*) tokf=$tmp/tokens-${t#gate-}.lua ;; *) tokf=$tmp/tokens-$first.lua ;; esac
		tok1=$(sed -n '2s/[^0-9]//gp' "$tokf")
		out=$(h2load -t"$THREADS" -c"$H2_CONNS" -m"$H2_STREAMS" -D"${DURATION%s}" -d "$tmp/h2-body" \
			-H ':method: PUT' -H 'content-type: application/json' -H "fencing-token: $tok1" \
			"${target_url[$t]}/jobs/1" 2>&1) || { say "h2load failed on $t: $out"; exit 1; }
		grep -q 'Application protocol: h2' <<<"$out" || { say "h2load did not speak h2 to $t: $out"; exit 1; }
		rps=$(sed -nE 's/^finished in .*, ([0-9.]+) req\/s.*/\1/p' <<<"$out")
		bad=$(awk '/^requests:/ {f = $10 + $12} /^status codes:/ {n = $5 + $7 + $9} END {print f + n}' <<<"$out")
		[ "$t" = nginx-tls ] && h2nginx=$rps
		printf "  %-31s %10.0f %10s %8d\n" "$t" "$rps" "$(awk -v a="$rps" -v b="$h2nginx" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "–" }')" "$bad"
	done
	echo
else
	echo "(no h2load: the HTTP/2 row is left out; apt-get install nghttp2-client)"
	echo
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "errors = non-2xx answers + socket errors (should be 0). Target: gate ≥ 1.0× nginx and HAProxy,"
echo "added p50 ≤ nginx's + one store round trip, ≤ 64 MiB RSS at 1,000 connections; over TLS ≥ 0.8× nginx."
