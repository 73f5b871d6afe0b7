# Shared by the load and soak scripts (bench.sh, bench-leases.sh, soak.sh):
# each, once in the repository's root, sets NAME (its name, for messages)
# and sources it:
#
#   NAME=bench.sh
#   . scripts/lib.sh
#
# It makes the script's one temporary directory ($tmp, removed on exit)
# and stops every process whose PID the script adds to pids, by PID, on
# exit; an interrupt exits 130 through the same cleanup.

has() { command -v "$1" >/dev/null 2>&1; }
say() { echo "$NAME: $*" >&2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-${NAME%.sh}.XXXXXX")
pids=()
# cleanup_more holds what a script adds to the cleanup (a second
# directory, say); it runs after the processes are stopped.
cleanup_more=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	for p in "${cleanup_more[@]}"; do rm -rf "$p"; done
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
