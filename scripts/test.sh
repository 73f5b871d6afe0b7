#!/usr/bin/env bash
# Runs fencegate's whole test suite: formatting, vet, and every test under
# -race, including the Valkey store against a real Valkey-compatible server.
#
# The Valkey tests start their own throwaway servers on free loopback ports
# (and a 3-node cluster) and stop them when done; this script only makes sure
# a server binary exists: valkey-server if present, else Debian's
# redis-server, installed with apt-get when missing and running as root.
# With FENCEGATE_REQUIRE_VALKEY=1 (set here) those tests fail instead of
# skipping when no server can be started.
#
# Extra arguments go to `go test` (e.g. ./scripts/test.sh -run Gate ./proxy).
set -euo pipefail
cd "$(dirname "$0")/.."

have_server() { command -v valkey-server >/dev/null 2>&1 || command -v redis-server >/dev/null 2>&1; }
have_cli() { command -v valkey-cli >/dev/null 2>&1 || command -v redis-cli >/dev/null 2>&1; }

if ! have_server || ! have_cli; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "test.sh: installing redis-server (a Valkey-compatible server) with apt-get" >&2
		export DEBIAN_FRONTEND=noninteractive
		apt-get install -y --no-install-recommends redis-server redis-tools >/dev/null 2>&1 ||
			{ apt-get update >/dev/null && apt-get install -y --no-install-recommends redis-server redis-tools >/dev/null; }
	fi
fi
if ! have_server; then
	echo "test.sh: no valkey-server or redis-server on PATH and none could be installed;" >&2
	echo "         install one (e.g. apt-get install redis-server) and run again" >&2
	exit 1
fi
export FENCEGATE_REQUIRE_VALKEY=1

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
