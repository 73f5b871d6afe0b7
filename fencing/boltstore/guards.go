package boltstore

import "github.com/fencegate/fencegate/fencing"

// What the store can do, checked when it compiles; fencing.CapabilitiesOf
// finds the same (fencing/storemetrics tests that it does, through the
// decorator).
var (
	_ fencing.Store          = (*Store)(nil)
	_ fencing.QuickAdmitter  = (*Store)(nil)
	_ fencing.Retainer       = (*Store)(nil)
	_ fencing.HoldRecorder   = (*Store)(nil)
	_ fencing.InFlightKeeper = (*Store)(nil)
)
