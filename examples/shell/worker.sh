#!/bin/sh
# A fenced shell worker: run it under `fencegate run`, which holds the
# lease while it works and hands it the fencing token.
#
#   fencegate run --resource job:42 --ttl 30s --finish-on-success -- sh worker.sh
#
# It does the job in steps. Each step is one write through the write gate,
# stamped with $FENCING_TOKEN, then a checkpoint, so the next holder resumes
# where this one stopped. If the lease is lost, fencegate run sends SIGTERM
# (then SIGKILL); a write that still gets out is refused by the gate with
# 409 stale-token once a newer holder has written.
#
# Environment: FENCING_RESOURCE, FENCING_TOKEN, FENCING_OWNER and
# FENCEGATE_API_URL come from fencegate run; GATE_URL is the write gate
# (default http://127.0.0.1:8080), whose route rule maps PUT /jobs/{id} to
# the resource job:{id}; STEPS (default 5) and STEP_SECONDS (default 1)
# shape the work. Needs curl and fencegate on PATH.
set -eu
: "${GATE_URL:=http://127.0.0.1:8080}"
: "${STEPS:=5}"
: "${STEP_SECONDS:=1}"
job=${FENCING_RESOURCE#job:}

# Resume after the last checkpointed step, if a previous holder left one.
step=0
if cp=$(fencegate lease checkpoint "$FENCING_RESOURCE" 2>/dev/null); then
	step=$(printf '%s\n' "$cp" | sed -n 's/^{"state":{"step":\([0-9][0-9]*\)}.*/\1/p')
	step=${step:-0}
fi
echo "worker $FENCING_OWNER: token $FENCING_TOKEN, resuming after step $step" >&2

trap 'echo "worker $FENCING_OWNER: stopped after step $step" >&2; exit 143' TERM INT

while [ "$step" -lt "$STEPS" ]; do
	next=$((step + 1))
	# The write: refused (409) if a newer token was admitted for the job.
	# A 503 (store unavailable, or the gate's barrier still closed behind
	# an earlier holder's unfinished write) is retried after Retry-After:
	# the write is idempotent, and the token keeps a retry from landing
	# after a newer holder's write.
	if ! out=$(curl -sS --fail-with-body --retry 10 --retry-max-time 60 -X PUT \
		-H "Fencing-Token: $FENCING_TOKEN" -H 'Content-Type: application/json' \
		--data "{\"step\":$next,\"by\":\"$FENCING_OWNER\"}" "$GATE_URL/jobs/$job"); then
		echo "worker $FENCING_OWNER: write of step $next refused: $out" >&2
		exit 1
	fi
	# The checkpoint, which also renews the lease.
	fencegate lease checkpoint "$FENCING_RESOURCE" --owner "$FENCING_OWNER" \
		--token "$FENCING_TOKEN" --state "{\"step\":$next}" >/dev/null
	step=$next
	sleep "$STEP_SECONDS"
done
echo "worker $FENCING_OWNER: done after step $step" >&2
