#!/usr/bin/env bash
# Runs fencegate's test suite: formatting, vet, and every test.
#
#   ./scripts/test.sh                  the full suite, as CI runs it: -race,
#                                      external servers required
#   ./scripts/test.sh --quick          the inner loop: no -race, tests that
#                                      need an external server skip
#                                      (same as FENCEGATE_QUICK=1)
#   ./scripts/test.sh -run Gate ./proxy   extra arguments go to `go test`
#
# Progress, from the first second: each step is announced with the seconds
# since the start (installing, gofmt, go vet, building, testing), a step that
# runs long says every 15 s that it still runs (go vet and the first -race
# build compile everything: minutes on a cold cache), then each top-level
# test is shown as it ends (PASS/FAIL/SKIP, package, duration), a failing
# test's output in full, and go test's own closing `ok`/`FAIL` line per
# package.
#
# Full mode needs, and installs with apt-get when running as root:
#   - valkey-server with valkey-cli, else Debian's redis-server with
#     redis-cli (package redis-tools, which also brings redis-benchmark for
#     the opt-in FENCEGATE_VALKEY_BENCH comparison): the Valkey store's tests
#     start throwaway servers on free loopback ports and a 3-node cluster;
#   - PostgreSQL (package postgresql, without its packaged "main" cluster):
#     the PostgreSQL store's tests start their own throwaway cluster
#     (fencing/pgstore/pgtest: initdb in a temporary directory, run as the
#     system user postgres when root, stopped at the end);
#   - nginx (Debian's has the DAV module): the WebDAV end-to-end test;
#   - promtool (package prometheus) to check the alert rules and dashboard.
#     Debian packages promtool only with the Prometheus server; no lighter
#     install exists (go install .../prometheus/cmd/promtool fetches and
#     compiles every service-discovery SDK of Prometheus, far heavier), so
#     the package is installed without starting its server (policy-rc.d);
#   - curl, zsh and fish: the shell worker example and the completion scripts;
#   - openssl: docs/tls.md's test certificate recipe (docs' TestTLSRecipe);
#   - python3: the Python worker example;
#   - a C compiler, as -race needs cgo.
# With FENCEGATE_REQUIRE_VALKEY, _POSTGRES, _NGINX and _PROMTOOL set to 1
# (here, in full mode) tests fail instead of skipping when these are missing;
# a missing curl, zsh, fish, python3 or openssl stops full mode before any test.
set -euo pipefail
cd "$(dirname "$0")/.."

start_s=$SECONDS
# say prints a progress line with the seconds since the start.
say() { printf 'test.sh: [%4ds] %s\n' "$((SECONDS - start_s))" "$*" >&2; }
# heartbeat SECONDS LABEL CMD...: runs CMD, saying every SECONDS that LABEL
# still runs.
heartbeat() {
	local every="$1" label="$2" rc=0 hb
	shift 2
	(while sleep "$every"; do say "$label: still running"; done) &
	hb=$!
	"$@" || rc=$?
	kill "$hb" 2>/dev/null || true
	wait "$hb" 2>/dev/null || true
	return "$rc"
}
say "starting ($(go version | cut -d' ' -f3), $(nproc 2>/dev/null || echo '?') CPUs)"

quick="${FENCEGATE_QUICK:-0}"
if [ "${1:-}" = "--quick" ]; then
	quick=1
	shift
fi

has() { command -v "$1" >/dev/null 2>&1; }
# The pair valkeytest uses: valkey-server with valkey-cli, else redis-*.
have_server() { has valkey-server || has redis-server; }
have_cli() { if has valkey-server; then has valkey-cli; else has redis-cli; fi; }
have_cc() { has "$(go env CC)"; }
have_postgres() { has initdb || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; }
have_nginx() { has nginx || [ -x /usr/sbin/nginx ]; }

# Debian packages the full suite needs: add a line per tool.
missing=()
if [ "$quick" != 1 ]; then
	if ! have_server || ! have_cli; then missing+=(redis-server redis-tools); fi
	if ! have_cc; then missing+=(gcc libc6-dev); fi
	if ! has promtool; then missing+=(prometheus); fi
	if ! have_nginx; then missing+=(nginx); fi
	if ! have_postgres; then
		missing+=(postgresql)
		# The tests make their own clusters: skip the packaged one.
		if [ "$(id -u)" = 0 ] && [ ! -e /etc/postgresql-common/createcluster.conf ]; then
			mkdir -p /etc/postgresql-common
			echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf
		fi
	fi
	# The CLI's end-to-end tests: curl for the shell worker, every shell
	# whose completion script is checked.
	if ! has curl || ! has zsh || ! has fish; then missing+=(curl zsh fish); fi
	# The examples' tests run a Python worker (standard library only).
	if ! has python3; then missing+=(python3); fi
	# docs/tls.md's certificate recipe, run by the docs' tests.
	if ! has openssl; then missing+=(openssl); fi
fi
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && has apt-get; then
	say "installing ${missing[*]} with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	# Packages install their services (prometheus, nginx, redis) without
	# starting them: the tests start their own throwaway servers.
	policy=""
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
	fi
	apt_install() {
		apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
			{ apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
	}
	rc=0
	heartbeat 15 "apt-get install" apt_install || rc=$?
	if [ -n "$policy" ]; then rm -f "$policy"; fi
	[ "$rc" = 0 ] || exit "$rc"
fi

race=()
if [ "$quick" = 1 ]; then
	export FENCEGATE_QUICK=1
	echo "test.sh: quick mode: no -race, tests needing external servers skip; CI runs the full mode" >&2
else
	if ! have_server; then
		echo "test.sh: no valkey-server or redis-server on PATH and none could be installed;" >&2
		echo "         install one (e.g. apt-get install redis-server) and run again" >&2
		exit 1
	fi
	if ! have_cli; then
		echo "test.sh: the cluster tests need valkey-cli (with valkey-server) or redis-cli (with redis-server);" >&2
		echo "         install it (e.g. apt-get install redis-tools) and run again" >&2
		exit 1
	fi
	if [ "$(go env CGO_ENABLED)" != 1 ]; then
		echo "test.sh: go test -race needs cgo: install a C compiler (e.g. apt-get install gcc libc6-dev) and do not set CGO_ENABLED=0" >&2
		exit 1
	fi
	if ! have_postgres; then
		echo "test.sh: no PostgreSQL server binaries (initdb) and none could be installed;" >&2
		echo "         install them (e.g. apt-get install postgresql) and run again" >&2
		exit 1
	fi
	if ! have_nginx; then
		echo "test.sh: the WebDAV end-to-end test needs nginx and none could be installed;" >&2
		echo "         install it (e.g. apt-get install nginx) and run again" >&2
		exit 1
	fi
	for bin in curl zsh fish python3 openssl; do
		if ! has "$bin"; then
			echo "test.sh: the CLI, example and docs end-to-end tests need $bin and it could not be installed;" >&2
			echo "         install it (e.g. apt-get install curl zsh fish python3 openssl) and run again" >&2
			exit 1
		fi
	done
	export FENCEGATE_REQUIRE_VALKEY=1 FENCEGATE_REQUIRE_POSTGRES=1 FENCEGATE_REQUIRE_NGINX=1 FENCEGATE_REQUIRE_PROMTOOL=1
	race=(-race)
fi

say "checking gofmt"
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
	echo "test.sh: not gofmt-clean:" >&2
	echo "$unformatted" >&2
	exit 1
fi
say "go vet ./... (compiles every package)"
heartbeat 15 "go vet" go vet ./...
# The binary off Linux: the general engine serves there, and fencegate run
# is Unix only (cmd/fencegate/runproc_*.go); nothing else may stop the
# build of those platforms.
say "go build ./cmd/fencegate for darwin, freebsd and windows"
for os in darwin freebsd windows; do
	GOOS=$os heartbeat 15 "go build ($os)" go build -o /dev/null ./cmd/fencegate
done

if [ "$#" -eq 0 ]; then
	# The longest packages first: go test starts packages in the order
	# given (./... then adds the rest, each once), so the slowest run beside
	# the many short ones instead of alone at the end.
	set -- ./proxy ./cmd/fencegate ./fencing/valkeystore ./examples ./fencing/pgstore ./...
fi
progress="$(mktemp -d)"
trap 'rm -rf "$progress"' EXIT
go build -o "$progress/testprogress" ./scripts/testprogress
say "go test ${race[*]} $* (building the test binaries first; each package is shown as it starts)"
run_tests() { go test "${race[@]}" -count=1 -timeout 30m -json "$@" 2>&1 | "$progress/testprogress"; }
rc=0
heartbeat 60 "go test" run_tests "$@" || rc=$?
say "done, exit status $rc"
exit "$rc"
