package fencingtest

import "testing"

// Run runs the conformance suite against the stores h opens, one subtest
// per property. Each subtest opens its own store with h.Open. Cases that
// need a reopen are skipped when Instance.Reopen is nil; cases that need
// expiry sleep about 1.2 s when Instance.Advance is nil.
func Run(t *testing.T, h Harness) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSuite(t, h)
			if c.sleeps && s.realClock() {
				// Overlap the real-clock sleeps of the expiry cases.
				t.Parallel()
			}
			c.fn(s)
		})
	}
}

// RunCase runs the one case of the suite named name (as in the subtest
// names), for a store that runs it again in another setup.
func RunCase(t *testing.T, h Harness, name string) {
	t.Helper()
	for _, c := range cases {
		if c.name == name {
			t.Run(c.name, func(t *testing.T) { c.fn(newSuite(t, h)) })
			return
		}
	}
	t.Fatalf("fencingtest: no case %q", name)
}

type testCase struct {
	name   string
	fn     func(s *suite)
	sleeps bool // waits for an expiry: sleeps ~1.2 s with a real clock
}

// cases lists the suite in order; names are stable (CI filters by them).
var cases = []testCase{
	// Tokens and leases.
	{"TokenMonotonicAcrossRelease", testTokenMonotonicAcrossRelease, false},
	{"TokenMonotonicAcrossExpiry", testTokenMonotonicAcrossExpiry, true},
	{"TokenMonotonicAcrossReopen", testTokenMonotonicAcrossReopen, false},
	{"SameOwnerReacquireExtends", testSameOwnerReacquireExtends, false},
	{"OtherOwnerGetsLeaseHeld", testOtherOwnerGetsLeaseHeld, false},
	{"ForgedOwnerOrTokenRefused", testForgedOwnerOrTokenRefused, false},
	{"RenewExtends", testRenewExtends, false},
	{"ReleaseTwice", testReleaseTwice, false},
	{"ReleaseByOtherOrOlderToken", testReleaseByOtherOrOlderToken, false},
	{"RenewAfterExpiryLost", testRenewAfterExpiryLost, true},
	{"ExpiryFollowsClock", testExpiryFollowsClock, true},
	// Admission.
	{"AdmitTokenNotIssued", testAdmitTokenNotIssued, false},
	{"AdmitStaleToken", testAdmitStaleToken, false},
	{"AdmitEqualTokenRepeatedly", testAdmitEqualTokenRepeatedly, false},
	{"HighWaterSurvivesReleaseAndExpiry", testHighWaterSurvivesReleaseAndExpiry, true},
	{"HighWaterSurvivesReopen", testHighWaterSurvivesReopen, false},
	{"ForgedHugeTokenRefused", testForgedHugeTokenRefused, false},
	{"AdmitRequireLive", testAdmitRequireLive, false},
	{"AdmitRequireLiveAfterExpiry", testAdmitRequireLiveAfterExpiry, true},
	// Checkpoints and history.
	{"CheckpointSavesAndRenews", testCheckpointSavesAndRenews, false},
	{"CheckpointAnyJSONValue", testCheckpointAnyJSONValue, false},
	{"NoCheckpoint", testNoCheckpoint, false},
	{"PreviousReleasedFinished", testPreviousReleasedFinished, false},
	{"PreviousReleasedUnfinished", testPreviousReleasedUnfinished, false},
	{"PreviousExpired", testPreviousExpired, true},
	{"CheckpointSurvivesReopen", testCheckpointSurvivesReopen, false},
	// Reads.
	{"StatusUnknownResource", testStatusUnknownResource, false},
	{"ListPrefixLimitOrder", testListPrefixLimitOrder, false},
	{"ListOmitsExpired", testListOmitsExpired, true},
	{"ListPagesEveryLeaseOnce", testListPagesEveryLeaseOnce, false},
	{"ListPagesWhileLeasesChange", testListPagesWhileLeasesChange, false},
	// Concurrency.
	{"ConcurrentAcquireOneOwner", testConcurrentAcquireOneOwner, false},
	{"ConcurrentAcquireReleaseUniqueTokens", testConcurrentAcquireReleaseUniqueTokens, false},
	{"ConcurrentAdmitNeverLowers", testConcurrentAdmitNeverLowers, false},
	// Bounds.
	{"BadResourceRefused", testBadResourceRefused, false},
	{"BadOwnerRefused", testBadOwnerRefused, false},
	{"BadTTLRefused", testBadTTLRefused, false},
	{"BadTokenRefused", testBadTokenRefused, false},
	{"CheckpointTooLarge", testCheckpointTooLarge, false},
	{"CheckpointInvalidJSON", testCheckpointInvalidJSON, false},
	{"BadListRequestRefused", testBadListRequestRefused, false},
	// Faults.
	{"ClosedStoreFailsClosed", testClosedStoreFailsClosed, false},
	// Tokens on the clock and retention (DESIGN §12).
	{"TokensFollowClock", testTokensFollowClock, false},
	{"RetentionRemovesIdle", testRetentionRemovesIdle, true},
	{"RetentionKeepsWrittenRecord", testRetentionKeepsWrittenRecord, false},
	{"RetentionCountsFromTheExpiry", testRetentionCountsFromTheExpiry, false},
	{"DeletedRecord", testDeletedRecord, false},
	{"ClockSteppedBack", testClockSteppedBack, false},
	{"RemovalAfterClockSteppedBack", testRemovalAfterClockSteppedBack, false},
	{"RestoreFromOlderCopy", testRestoreFromOlderCopy, false},
}
