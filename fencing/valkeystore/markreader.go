package valkeystore

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/tidwall/redcon"
	"github.com/valkey-io/valkey-go"

	"github.com/fencegate/fencegate/fencing"
)

// A mark reader (fencing.MarkReaders) is a connection of its own to a
// single node, for a caller that drives it from its own poller (a gate's
// event loop). It sends what AdmitBatch's first pipeline sends, one
// HMGET issued hw floor per request, and settles the requests at the mark
// as AdmitBatch does; every other request is left to Admit or AdmitBatch.
// It speaks RESP2 (the protocol a new connection starts in) and parses the
// replies with redcon, each once frameReply has framed it (markframe.go):
// a reply that is not RESP2, or could not end within maxMarkReplyBytes,
// fails the reader at once.
//
// There is none in a cluster (a request's node follows the slot map the
// client keeps), with Sentinel (the primary changes), over TLS, with
// replicas to read from, or with WaitReplicas (every admission there waits
// for replicas through Admit's path): markReaderOption is then nil.

// markReaderOption is how the store's client reaches its one node: what a
// mark reader dials and how it introduces itself.
type markReaderOption struct {
	addr           string
	user, password string
	db             int
	name           string
	dialTimeout    time.Duration
}

// maxMarkReplyBytes bounds a reply to a mark reader (frameReply): a server
// sending more for one is not answering HMGET.
const maxMarkReplyBytes = 1 << 20

// newMarkReaderOption is the mark readers' setting for a client made from
// copt, or nil when the store has none (see above).
func newMarkReaderOption(copt valkey.ClientOption, mode valkey.ClientMode, waitReplicas int) *markReaderOption {
	if mode != valkey.ClientModeStandalone || len(copt.InitAddress) != 1 || copt.TLSConfig != nil ||
		copt.Sentinel.MasterSet != "" || len(copt.Standalone.ReplicaAddress) > 0 || waitReplicas > 0 {
		return nil
	}
	return &markReaderOption{addr: copt.InitAddress[0], user: copt.Username, password: copt.Password,
		db: copt.SelectDB, name: copt.ClientName, dialTimeout: copt.Dialer.Timeout}
}

// OpenMarkReader implements fencing.MarkReaders: it dials the store's node,
// authenticates, selects the URL's database and names the connection as
// the store's client does, within the dial and command timeouts. It returns
// nil and no error when the store has no mark readers (see above), and on
// platforms other than Linux.
func (s *Store) OpenMarkReader(ctx context.Context) (fencing.MarkReader, error) {
	o := s.markReaders
	if o == nil || !markReadersSupported {
		return nil, nil
	}
	if err := s.checkOpen("admit"); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.dialTimeout+s.cmdTimeout)
	defer cancel()
	d := net.Dialer{Timeout: o.dialTimeout}
	conn, err := d.DialContext(ctx, "tcp", o.addr)
	if err != nil {
		return nil, fmt.Errorf("%w: mark reader: %w", fencing.ErrUnavailable, err)
	}
	defer conn.Close() // the reader keeps a duplicate of its socket
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if err := o.introduce(conn); err != nil {
		return nil, err
	}
	return newMarkReader(s, conn.(*net.TCPConn))
}

// introduce sends AUTH, SELECT and CLIENT SETNAME as configured and checks
// that each is answered OK.
func (o *markReaderOption) introduce(conn net.Conn) error {
	var cmds [][]string
	switch {
	case o.password != "" && o.user != "":
		cmds = append(cmds, []string{"AUTH", o.user, o.password})
	case o.password != "":
		cmds = append(cmds, []string{"AUTH", o.password})
	}
	if o.db != 0 {
		cmds = append(cmds, []string{"SELECT", strconv.Itoa(o.db)})
	}
	if o.name != "" {
		cmds = append(cmds, []string{"CLIENT", "SETNAME", o.name})
	}
	if len(cmds) == 0 {
		return nil
	}
	var out []byte
	for _, c := range cmds {
		out = appendCommand(out, c...)
	}
	if _, err := conn.Write(out); err != nil {
		return fmt.Errorf("%w: mark reader: %w", fencing.ErrUnavailable, err)
	}
	var in []byte
	buf := make([]byte, 512)
	for _, c := range cmds {
		for {
			n, r, err := readReply(in)
			if err != nil {
				return fmt.Errorf("%w (the reply to %s)", err, c[0])
			}
			if n > 0 {
				in = in[n:]
				if r.Type != redcon.String || string(r.Data) != "OK" {
					// c[0] only: AUTH's arguments hold the password.
					return fmt.Errorf("%w: mark reader: %s answered %q", fencing.ErrUnavailable, c[0], clip(r.Data))
				}
				break
			}
			k, err := conn.Read(buf)
			if err != nil {
				return fmt.Errorf("%w: mark reader: %s: %w", fencing.ErrUnavailable, c[0], err)
			}
			in = append(in, buf[:k]...)
		}
	}
	return nil
}

// appendCommand appends args as a RESP command (an array of bulk strings).
func appendCommand(dst []byte, args ...string) []byte {
	dst = append(dst, '*')
	dst = strconv.AppendInt(dst, int64(len(args)), 10)
	dst = append(dst, "\r\n"...)
	for _, a := range args {
		dst = append(dst, '$')
		dst = strconv.AppendInt(dst, int64(len(a)), 10)
		dst = append(dst, "\r\n"...)
		dst = append(dst, a...)
		dst = append(dst, "\r\n"...)
	}
	return dst
}

// markCall is a request of a mark reader's batch.
type markCall struct {
	sent   bool // a read was sent for it (it needs no live lease and is valid)
	before seenRecord
	known  bool
}

// snapshot records in each call of calls that is sent what was seen of its
// request's resource (see lost), under one hold of the lock.
func (m *seenMarks) snapshot(reqs []fencing.AdmitRequest, calls []markCall) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range calls {
		if c := &calls[i]; c.sent {
			c.before, c.known = m.byRes[reqs[i].Resource]
		}
	}
}

// markReplies settles a batch from its replies, in the order the reads
// were sent; it is the part of a mark reader that does no I/O.
type markReplies struct {
	s     *Store
	reqs  []fencing.AdmitRequest
	calls []markCall
	sent  int // reads sent
	got   int // replies parsed
	next  int // the call the next reply answers
	out   []fencing.Admission
	ok    []bool
	in    []byte // bytes read and not parsed yet
}

// start records what the store had seen of reqs and appends the reads to
// dst.
func (m *markReplies) start(dst []byte, reqs []fencing.AdmitRequest) []byte {
	s := m.s
	m.reqs, m.sent, m.got, m.next, m.in = reqs, 0, 0, 0, m.in[:0]
	m.calls = grow(m.calls, len(reqs))
	m.out = grow(m.out, len(reqs))
	m.ok = grow(m.ok, len(reqs))
	for i, req := range reqs {
		c := &m.calls[i]
		*c = markCall{}
		m.out[i], m.ok[i] = fencing.Admission{}, false
		if req.RequireLive || req.Validate() != nil {
			continue // only admit.lua can answer it
		}
		c.sent = true
		dst = appendCommand(dst, "HMGET", s.recKey(req.Resource), "issued", "hw", "floor")
		m.sent++
	}
	s.seen.snapshot(reqs, m.calls) // before the reads go out
	return dst
}

// grow returns s with length n, reusing its array when large enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// add parses the replies in b (appended to what was left unparsed before)
// and reports whether every reply is in. A reply past the batch's, or one
// frameReply refuses, is a protocol error.
func (m *markReplies) add(b []byte) (bool, error) {
	m.in = append(m.in, b...)
	in := m.in
	for m.got < m.sent {
		for !m.calls[m.next].sent {
			m.next++
		}
		n, r, err := readReply(in)
		if err != nil {
			return false, err
		}
		if n == 0 {
			break
		}
		in = in[n:]
		m.settle(m.next, r)
		m.next++
		m.got++
	}
	m.in = append(m.in[:0], in...)
	if m.got < m.sent {
		return false, nil // frameReply bounds what a reply not yet whole keeps
	}
	if len(m.in) > 0 {
		return false, fmt.Errorf("%w: mark reader: %d bytes after the batch's replies", fencing.ErrUnavailable, len(m.in))
	}
	return true, nil
}

// settle judges call i from its reply r: settled when r reads its record at
// the mark (see atMark) and the record is the one the store last saw
// (a record that lost writes is left to Admit, which lifts it).
func (m *markReplies) settle(i int, r redcon.RESP) {
	if r.Type != redcon.Array || r.Count != 3 {
		return // an error (NOAUTH, LOADING, WRONGTYPE, ...): the script answers
	}
	var f [3]fencing.Token
	ok, k := true, 0
	r.ForEach(func(e redcon.RESP) bool {
		if e.Type != redcon.Bulk {
			ok = false
			return false
		}
		f[k], ok = parseToken(string(e.Data))
		k++
		return ok
	})
	req, c := m.reqs[i], m.calls[i]
	issued, hw, floor := f[0], f[1], f[2]
	if !ok || k != 3 || !atMark(req.Token, issued, hw, floor) || c.before.lost(c.known, issued, hw, floor) || !m.s.keptRecently(c.before, c.known) {
		return
	}
	m.s.seen.observe(req.Resource, issued, hw, floor)
	m.out[i] = fencing.Admission{Resource: req.Resource, Token: req.Token, HighWater: hw, Issued: issued}
	m.ok[i] = true
}

// atMark reports whether admit.lua admits token, for a request that needs
// no live lease, on a record read as issued, hw and floor, without
// raising anything: the token is the high-water mark, issued, and above
// the floor.
func atMark(token, issued, hw, floor fencing.Token) bool {
	return token == hw && token <= issued && token > floor
}
