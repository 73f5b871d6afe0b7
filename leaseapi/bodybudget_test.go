package leaseapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"
	"testing/iotest"
)

// TestBodyBudgetBounds: reservations fit the total and the client's share
// (half), neither below the floor; what is given back can be taken again;
// empty bodies take nothing.
func TestBodyBudgetBounds(t *testing.T) {
	b := newBodyBudget(400, 50)
	if b.total != 400 || b.perClient != 200 {
		t.Fatalf("budget %d, %d per client; want 400, 200", b.total, b.perClient)
	}
	steps := []struct {
		take   bool // take, else give
		client string
		n      int64
		ok     bool
	}{
		{true, "a", 200, true},
		{true, "a", 1, false}, // a's share is spent
		{true, "b", 150, true},
		{true, "c", 49, true},
		{true, "d", 2, false}, // the total is spent
		{true, "d", 1, true},
		{true, "d", 0, true}, // an empty body holds nothing
		{false, "a", 60, true},
		{true, "d", 60, true},
		{true, "a", 1, false}, // the total again, though a has room
		{false, "d", 61, true},
		{true, "a", 60, true},
	}
	for i, s := range steps {
		if s.take {
			if got := b.take(s.client, s.n); got != s.ok {
				t.Fatalf("step %d: take(%s, %d) = %v, want %v (held %d, by client %v)", i, s.client, s.n, got, s.ok, b.held(), b.byClient)
			}
		} else {
			b.give(s.client, s.n)
		}
	}
	for _, c := range []string{"a", "b", "c", "d"} {
		b.give(c, b.byClient[c])
	}
	if b.held() != 0 || len(b.byClient) != 0 {
		t.Fatalf("all given back: held %d, by client %v", b.held(), b.byClient)
	}

	// Large bodies leave the reserve (an eighth) to small ones, whatever
	// they hold; small ones may take it all.
	r := newBodyBudget(64*smallBody, smallBody+1)
	if r.reserve != 8*smallBody {
		t.Fatalf("reserve %d, want %d", r.reserve, 8*smallBody)
	}
	for i, s := range []struct {
		client string
		n      int64
		ok     bool
	}{
		{"a", 28 * smallBody, true},
		{"b", 28 * smallBody, true},
		{"c", smallBody + 1, false}, // into the reserve
		{"c", smallBody, true},      // a small body may
		{"c", 7 * smallBody, false}, // nor a large one
	} {
		if got := r.take(s.client, s.n); got != s.ok {
			t.Fatalf("reserve step %d: take(%s, %d) = %v, want %v (held %d)", i, s.client, s.n, got, s.ok, r.held())
		}
	}
	for range 7 {
		if !r.take("d", smallBody) {
			t.Fatalf("small bodies could not take the reserve: held %d of %d", r.held(), r.total)
		}
	}
	if r.held() != r.total || r.take("e", 1) {
		t.Fatalf("held %d of %d, and one more byte taken", r.held(), r.total)
	}

	for _, c := range []struct{ total, floor, wantTotal, wantPer int64 }{
		{0, 10, DefaultBodyMemory, DefaultBodyMemory / 2},
		{-1, 10, DefaultBodyMemory, DefaultBodyMemory / 2},
		{100, 60, 100, 60}, // the share is one largest body at least
		{10, 40, 40, 40},   // and so is the total
	} {
		b := newBodyBudget(c.total, c.floor)
		if b.total != c.wantTotal || b.perClient != c.wantPer {
			t.Errorf("newBodyBudget(%d, %d): %d, %d per client; want %d, %d", c.total, c.floor, b.total, b.perClient, c.wantTotal, c.wantPer)
		}
	}
}

// TestReadBodySizedFromLength: a body of declared length is read into one
// buffer of that length (and the byte that sees its end), not grown by
// doubling; without a length, or with a read error, readBody answers as
// io.ReadAll does.
func TestReadBodySizedFromLength(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 1<<20+7)
	for _, r := range []func() io.Reader{
		func() io.Reader { return bytes.NewReader(body) },
		func() io.Reader { return iotest.HalfReader(bytes.NewReader(body)) },
		func() io.Reader { return iotest.DataErrReader(bytes.NewReader(body)) },
	} {
		got, err := readBody(r(), int64(len(body)), 2<<20)
		if err != nil || !bytes.Equal(got, body) || cap(got) != len(body)+1 {
			t.Fatalf("declared length: %d bytes (cap %d), %v; want %d bytes, cap %d", len(got), cap(got), err, len(body), len(body)+1)
		}
		if got, err := readBody(r(), -1, 2<<20); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("no declared length: %d bytes, %v", len(got), err)
		}
	}
	// Longer than declared (a reader that is not net/http's): all of it.
	if got, err := readBody(bytes.NewReader(body), 10, 2<<20); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("longer than declared: %d bytes, %v", len(got), err)
	}
	// A read error after some bytes: those bytes, and the error.
	broken := errors.New("connection reset")
	r := io.MultiReader(bytes.NewReader(body[:100]), iotest.ErrReader(broken))
	if got, err := readBody(r, int64(len(body)), 2<<20); !errors.Is(err, broken) || !bytes.Equal(got, body[:100]) {
		t.Fatalf("read error: %d bytes, %v", len(got), err)
	}
}

// TestGrowingHoldTakesMoreOnlyPastItsReservation: a body of unknown length
// that ends at its first reservation reads whole with the budget spent; one
// byte past it takes the rest of its limit, or fails with errOverBudget
// when the budget cannot.
func TestGrowingHoldTakesMoreOnlyPastItsReservation(t *testing.T) {
	const limit = 16 * smallBody
	for _, c := range []struct {
		size    int
		spent   bool // the budget spent by another client meanwhile
		err     error
		holding int64
	}{
		{smallBody, true, nil, smallBody},
		{smallBody + 1, true, errOverBudget, smallBody},
		{3 * smallBody, false, nil, limit},
	} {
		b := newBodyBudget(64*smallBody, smallBody)
		h := bodyHold{budget: b, client: "c", n: smallBody}
		if !b.take(h.client, h.n) {
			t.Fatal("no room for the first reservation")
		}
		for i := 0; c.spent && i < 64; i++ {
			for b.take(fmt.Sprint("other ", i), smallBody) {
			}
		}
		raw, err := readBody(&growingHold{r: bytes.NewReader(bytes.Repeat([]byte("x"), c.size)), h: &h, limit: limit}, -1, limit)
		if !errors.Is(err, c.err) || h.n != c.holding || err == nil && len(raw) != c.size {
			t.Errorf("a body of %d bytes, budget spent %v: %d bytes read, %v, holding %d; want %v, holding %d",
				c.size, c.spent, len(raw), err, h.n, c.err, c.holding)
		}
	}
}
