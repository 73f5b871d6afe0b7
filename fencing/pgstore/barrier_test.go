package pgstore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/fencingtest"
	"github.com/fencegate/fencegate/fencing/pgstore/pgtest"
)

// newHolder hands res to a new owner and returns its token.
func newHolder(t *testing.T, s *Store, res, owner string) fencing.Token {
	t.Helper()
	ctx := context.Background()
	st, err := s.Status(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if st.Lease != nil {
		if _, err := s.Release(ctx, fencing.ReleaseRequest{Resource: res, Owner: st.Lease.Owner, Token: st.Lease.Token}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := s.Acquire(ctx, fencing.AcquireRequest{Resource: res, Owner: owner, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return l.Token
}

// barrierRows counts the barrier table's rows for res.
func barrierRows(t testing.TB, s *Store, res string) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+s.schema+`.barrier WHERE resource = $1`, res).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func registerEntry(t *testing.T, s *Store, res, gate string, tok fencing.Token, hold time.Duration) (fencing.BarrierEntry, bool) {
	t.Helper()
	_, e, lower, err := s.AdmitRegister(context.Background(), fencing.AdmitRequest{Resource: res, Token: tok}, gate, hold)
	if err != nil {
		t.Fatalf("AdmitRegister(%d): %v", tok, err)
	}
	if id, err := entryID(e); err != nil || e.ID != gate+":"+strconv.FormatInt(id, 10) {
		t.Fatalf("entry id %q does not name gate %s (%v)", e.ID, gate, err)
	}
	return e, lower
}

// barrierHarness opens gates over one fresh schema for the shared
// barrier's conformance suite, with views of the barrier table.
func barrierHarness() fencingtest.BarrierHarness {
	return fencingtest.BarrierHarness{
		Open: func(t testing.TB, n int) fencingtest.BarrierInstance {
			schema := freshSchema()
			var gates []fencing.Store
			for range n {
				gates = append(gates, open(t, schema))
			}
			view := open(t, schema)
			return fencingtest.BarrierInstance{
				Gates:   gates,
				Entries: func(t testing.TB, res string) int { return barrierRows(t, view, res) },
				Deadline: func(t testing.TB, e fencing.BarrierEntry) time.Time {
					t.Helper()
					id, err := entryID(e)
					if err != nil {
						t.Fatal(err)
					}
					var deadline time.Time
					if err := view.pool.QueryRow(context.Background(), `SELECT deadline FROM `+schema+`.barrier WHERE id = $1`, id).Scan(&deadline); err != nil {
						t.Fatal(err)
					}
					return deadline
				},
				Now: func(t testing.TB) time.Time {
					t.Helper()
					var now time.Time
					if err := view.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
						t.Fatal(err)
					}
					return now
				},
			}
		},
		NotifyOnly: func() func() {
			recheck := barrierRecheck
			barrierRecheck = time.Hour
			return func() { barrierRecheck = recheck }
		},
	}
}

// TestSharedBarrier runs the shared barrier's conformance suite with two
// stores (two gates) on one schema.
func TestSharedBarrier(t *testing.T) {
	pgtest.Need(t, cluster)
	fencingtest.RunSharedBarrier(t, barrierHarness())
}

// TestSharedBarrierFailsClosed: a wait whose store closes, or whose
// listening connection the server ends, returns a store fault.
func TestSharedBarrierFailsClosed(t *testing.T) {
	ctx := context.Background()
	schema := freshSchema()
	g1, g2 := open(t, schema), open(t, schema)
	const res = "closing"
	a := newHolder(t, g1, res, "a")
	ea, _ := registerEntry(t, g1, res, "g1", a, time.Minute)
	b := newHolder(t, g1, res, "b")
	eb, _ := registerEntry(t, g2, res, "g2", b, time.Minute)

	// The server ends the listening connection.
	done := make(chan error, 1)
	go func() { _, err := g2.WaitLower(ctx, eb); done <- err }()
	var pid uint32
	for give := time.Now().Add(30 * time.Second); pid == 0; {
		if time.Now().After(give) {
			t.Fatal("the wait never listened")
		}
		time.Sleep(10 * time.Millisecond)
		g2.listen.mu.Lock()
		if g := g2.listen.gen; g != nil && isDone(g.ready) {
			pid = g.pid
		}
		g2.listen.mu.Unlock()
	}
	if _, err := g1.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int32(pid)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("WaitLower whose listening connection was ended: %v, want ErrUnavailable", err)
	}

	// The next wait listens again; closing the store ends it.
	go func() { _, err := g2.WaitLower(ctx, eb); done <- err }()
	time.Sleep(100 * time.Millisecond)
	g2.Close()
	if err := <-done; !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("WaitLower on a closed store: %v, want ErrUnavailable", err)
	}
	if _, err := g2.WaitLower(ctx, eb); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("WaitLower after Close: %v, want ErrUnavailable", err)
	}
	if _, _, _, err := g2.AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: b}, "g2", time.Minute); !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("AdmitRegister after Close: %v, want ErrUnavailable", err)
	}
	_ = g1.Leave(ctx, ea)
}

// TestWaitLowerFailsClosedWhenTheBarrierRowsGo: a write waiting behind a
// lower one whose entries the database then loses (deleted here, as a
// failover to a standby that missed them or a restore would) is refused,
// not let through as if the lower write had ended: it would otherwise
// reach the upstream while the lower one is still in flight.
func TestWaitLowerFailsClosedWhenTheBarrierRowsGo(t *testing.T) {
	ctx := context.Background()
	schema := freshSchema()
	g1, g2 := open(t, schema), open(t, schema)
	const res = "lost-rows"
	a := newHolder(t, g1, res, "a")
	ea, _ := registerEntry(t, g1, res, "g1", a, time.Minute)
	b := newHolder(t, g1, res, "b")
	eb, behind := registerEntry(t, g2, res, "g2", b, time.Minute)
	if !behind {
		t.Fatal("b's write is not behind a's")
	}
	done := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := g2.WaitLower(wctx, eb)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // waiting
	if _, err := g1.pool.Exec(ctx, `DELETE FROM `+schema+`.barrier WHERE resource = $1`, res); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("b's write after the database lost the barrier rows: %v, want a refusal (ErrUnavailable)", err)
	}
	_ = g1.Leave(ctx, ea)
}

// TestAdmitRegisterLostCommitIsAmbiguous: a registration whose commit's
// reply is lost is ErrAmbiguous, as Admit's would be. The write is at the
// mark (a first one raised it), so its one batch of statements registers
// and commits on its Sync.
func TestAdmitRegisterLostCommitIsAmbiguous(t *testing.T) {
	c := pgtest.Need(t, cluster)
	schema := freshSchema()
	p := newFaultProxy(t, "127.0.0.1:"+strconv.Itoa(c.Port()))
	s := openVia(t, p.addr(), schema, 5*time.Second)
	tok := newHolder(t, s, "amb", "a")
	first, _ := registerEntry(t, s, "amb", "g1", tok, time.Minute)
	if err := s.Leave(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	p.dropSync.Store(true)
	_, _, _, err := s.AdmitRegister(context.Background(), fencing.AdmitRequest{Resource: "amb", Token: tok}, "g1", time.Minute)
	if !errors.Is(err, fencing.ErrAmbiguous) || errors.Is(err, fencing.ErrUnavailable) {
		t.Fatalf("AdmitRegister with its commit's reply lost: %v, want ErrAmbiguous", err)
	}
	// The server received the COMMIT; only its reply was lost. It may not
	// have finished the commit when the client gave up (on a busy machine
	// it often has not): read once it has ended that connection.
	p.lostReplyProcessed()
	other := open(t, schema)
	if n := barrierRows(t, other, "amb"); n != 1 {
		st, err := other.Status(context.Background(), "amb")
		t.Fatalf("%d entries after the lost reply, want the committed one (token %d; the record: issued %d, high water %d, %v)",
			n, tok, st.Issued, st.HighWater, err)
	}
}

// TestAdmitRegisterOrdersRaises: many gates admit writes at a holder's
// mark while the next holder's first write raises it. Every write admitted
// at the old mark must have registered before the raise read the entries:
// no old entry may be inserted after the raising one (the shared row lock
// of admissions at the mark against the raise's exclusive one).
func TestAdmitRegisterOrdersRaises(t *testing.T) {
	ctx := context.Background()
	schema := freshSchema()
	gates := []*Store{open(t, schema), open(t, schema), open(t, schema)}
	const res = "race"
	for round := 0; round < 5; round++ {
		a := newHolder(t, gates[0], res, "a")
		b := newHolder(t, gates[0], res, "b") // issued; a's writes still pass until b's first
		var wg sync.WaitGroup
		stop := make(chan struct{})
		// The writers at the old mark stop before the test can end: a
		// failure below must not leave them calling t.Error after it.
		halted := false
		halt := func() {
			if !halted {
				halted = true
				close(stop)
				wg.Wait()
			}
		}
		for i := 0; i < 6; i++ {
			wg.Add(1)
			go func(s *Store) {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _, _, err := s.AdmitRegister(ctx, fencing.AdmitRequest{Resource: res, Token: a}, "old", time.Minute)
					if errors.Is(err, fencing.ErrStaleToken) {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			}(gates[i%len(gates)])
		}
		time.Sleep(50 * time.Millisecond)
		var eb fencing.BarrierEntry
		var lower bool
		func() {
			defer halt()
			eb, lower = registerEntry(t, gates[1], res, "new", b, time.Minute)
		}()
		if !lower {
			t.Fatal("the raising write saw no entry of the writes admitted at the old mark")
		}
		id, _ := entryID(eb)
		var late int
		if err := gates[0].pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.barrier o, `+schema+`.barrier n
			WHERE n.id = $1 AND o.resource = n.resource AND o.token < n.token AND o.deadline > n.deadline`, id).Scan(&late); err != nil {
			t.Fatal(err)
		}
		if late > 0 {
			t.Fatalf("round %d: %d writes at the old mark registered after the raise", round, late)
		}
		if _, err := gates[0].pool.Exec(ctx, `DELETE FROM `+schema+`.barrier`); err != nil {
			t.Fatal(err)
		}
	}
}
