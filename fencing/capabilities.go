package fencing

// Capabilities are what a Store can do beyond the Store interface, each
// nil when the store cannot. A server asks once, with CapabilitiesOf,
// when it starts, and uses only what is there: no type assertion through
// a decorator, no probe by an empty call.
type Capabilities struct {
	// Quick answers some admissions at once (the memory and file stores).
	Quick QuickAdmitter
	// Batch admits several writes in one round trip (the Valkey store).
	Batch BatchAdmitter
	// Marks opens connections that read high-water marks for a caller's
	// own poller (the Valkey store; it opens none where its setup has no
	// mark readers, see OpenMarkReader).
	Marks MarkReaders
	// Retain reports what the store's retention removed (the memory, file
	// and PostgreSQL stores).
	Retain Retainer
	// Holds keeps a gate's barrier holds across a restart (the memory and
	// file stores).
	Holds HoldRecorder
	// Keep lets the gate's local barrier keep the records of its writes in
	// flight from the retention sweep (the memory and file stores).
	Keep InFlightKeeper
	// Shared is the store's shared barrier (the Valkey and PostgreSQL
	// stores).
	Shared SharedBarrier
}

// CapabilityReporter is a Store that says itself what it can do, rather
// than by the interfaces its type implements: a decorator, which reports
// its inner store's capabilities (wrapped as it wraps the store, or as
// they are), and nil for what the inner store lacks even though the
// decorator's type could forward it.
type CapabilityReporter interface {
	Capabilities() Capabilities
}

// CapabilitiesOf reports what s can do: s's own report when it is a
// CapabilityReporter, and otherwise each optional interface s's type
// implements.
func CapabilitiesOf(s Store) Capabilities {
	if r, ok := s.(CapabilityReporter); ok {
		return r.Capabilities()
	}
	var c Capabilities
	c.Quick, _ = s.(QuickAdmitter)
	c.Batch, _ = s.(BatchAdmitter)
	c.Marks, _ = s.(MarkReaders)
	c.Retain, _ = s.(Retainer)
	c.Holds, _ = s.(HoldRecorder)
	c.Keep, _ = s.(InFlightKeeper)
	c.Shared, _ = s.(SharedBarrier)
	return c
}
