#!/usr/bin/env bash
# Runs fencegate's whole test suite: formatting, vet, and every test under
# -race, including the Valkey store against a real Valkey-compatible server.
#
# The Valkey tests start their own throwaway servers on free loopback ports
# (and a 3-node cluster, created with the matching CLI) and stop them when
# done; this script only makes sure the binaries exist: valkey-server with
# valkey-cli if present, else Debian's redis-server with redis-cli (package
# redis-tools, which also brings redis-benchmark for the opt-in
# FENCEGATE_VALKEY_BENCH comparison). -race needs cgo, so a C compiler too.
# Whatever is missing is installed with apt-get when running as root;
# otherwise the script stops. With FENCEGATE_REQUIRE_VALKEY=1 (set here)
# the Valkey tests fail instead of skipping when no server can be started.
#
# The PostgreSQL store's tests likewise start their own throwaway cluster
# (fencing/pgstore/pgtest: initdb in a temporary directory, run as the
# system user postgres when root, stopped at the end); this script installs
# Debian's postgresql when no initdb is found (on PATH or in
# /usr/lib/postgresql/*/bin), without the packaged "main" cluster, and sets
# FENCEGATE_REQUIRE_POSTGRES=1 so those tests fail rather than skip.
#
# Extra arguments go to `go test` (e.g. ./scripts/test.sh -run Gate ./proxy).
set -euo pipefail
cd "$(dirname "$0")/.."

has() { command -v "$1" >/dev/null 2>&1; }
# The pair valkeytest uses: valkey-server with valkey-cli, else redis-*.
have_server() { has valkey-server || has redis-server; }
have_cli() { if has valkey-server; then has valkey-cli; else has redis-cli; fi; }
have_cc() { has "$(go env CC)"; }
have_postgres() { has initdb || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; }

missing=()
if ! have_server || ! have_cli; then missing+=(redis-server redis-tools); fi
if ! have_cc; then missing+=(gcc libc6-dev); fi
if ! have_postgres; then
	missing+=(postgresql)
	# The tests make their own clusters: skip the packaged one.
	if [ "$(id -u)" = 0 ] && [ ! -e /etc/postgresql-common/createcluster.conf ]; then
		mkdir -p /etc/postgresql-common
		echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf
	fi
fi
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && has apt-get; then
	echo "test.sh: installing ${missing[*]} with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
		{ apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi
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
export FENCEGATE_REQUIRE_VALKEY=1
export FENCEGATE_REQUIRE_POSTGRES=1

unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
	echo "test.sh: not gofmt-clean:" >&2
	echo "$unformatted" >&2
	exit 1
fi
go vet ./...

if [ "$#" -eq 0 ]; then
	set -- ./...
fi
go test -race -count=1 -timeout 30m "$@"
