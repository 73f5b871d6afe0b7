package valkeystore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// TestSlotTags: keySlot is the cluster's CRC16 (the reference vector of
// the cluster specification, and the server's own CLUSTER KEYSLOT on a
// sample), and slotTag has a tag for every slot.
func TestSlotTags(t *testing.T) {
	if got := keySlot("123456789"); got != 0x31C3%numSlots {
		t.Fatalf("keySlot(123456789) = %d, want %d", got, 0x31C3%numSlots)
	}
	for slot := range numSlots {
		if got := keySlot(slotTag(uint16(slot))); got != uint16(slot) {
			t.Fatalf("slotTag(%d) = %q hashes to slot %d", slot, slotTag(uint16(slot)), got)
		}
	}
	srv := valkeytest.Start(t, valkeytest.WithArgs("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"))
	for slot := 0; slot < numSlots; slot += 509 {
		key := "fencegate:ping{" + slotTag(uint16(slot)) + "}"
		if got := srv.MustDo("CLUSTER", "KEYSLOT", key); got != strconv.Itoa(slot) {
			t.Fatalf("server puts %s in slot %s, want %d", key, got, slot)
		}
		if got, want := srv.MustDo("CLUSTER", "KEYSLOT", "k"+strconv.Itoa(slot)), keySlot("k"+strconv.Itoa(slot)); got != strconv.Itoa(int(want)) {
			t.Fatalf("server slot of k%d = %s, keySlot = %d", slot, got, want)
		}
	}
}

// TestClusterDeadReplica: a cluster of three primaries, one of them with a
// replica that the client knows. Once the replica is killed (and while the
// client still lists it), Ping, List, Open and the data path work: replicas
// play no part in them. Killing a primary that has no replica (so no
// failover can happen) fails Ping and List, naming that primary.
func TestClusterDeadReplica(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	replica := cl.AddReplica(t, 1)
	prefix := freshPrefix()
	s := open(t, cl.URL(), prefix)
	ctx := context.Background()
	knows := func() bool { _, ok := s.client.Nodes()[replica.Addr()]; return ok }
	if !knows() {
		t.Fatalf("the client does not know the replica %s: the test would not exercise it", replica.Addr())
	}

	// Leases on every shard (30 resources spread over three primaries).
	held := map[string]fencing.Lease{}
	for i := range 30 {
		res := fmt.Sprint("dr", i)
		held[res] = mustAcquire(t, s, res, "alice")
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping with every node up: %v", err)
	}

	replica.Kill()
	if !knows() {
		t.Fatal("the client forgot the dead replica at once: the test would not exercise it")
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping with a dead replica: %v, want nil (replicas serve nothing)", err)
	}
	got, err := s.List(ctx, fencing.ListRequest{Prefix: "dr"})
	if err != nil {
		t.Fatalf("List with a dead replica: %v", err)
	}
	if len(got) != len(held) {
		t.Fatalf("List with a dead replica: %d leases, want %d", len(got), len(held))
	}
	for _, l := range got {
		if h := held[l.Resource]; h.Token != l.Token || l.Owner != "alice" {
			t.Fatalf("List: %+v, want %+v", l, h)
		}
	}
	for res, l := range held {
		mustAdmit(t, s, res, l.Token)
		if n := mustAcquire(t, s, res+"-new", "bob"); n.Token == 0 {
			t.Fatalf("Acquire(%s-new) with a dead replica: token 0", res)
		}
	}

	// A gate starting now (the cluster still lists the replica: it marks it
	// failed only after its node timeout) starts, and says what it skipped.
	var logs bytes.Buffer
	s2, err := Open(ctx, Options{URL: cl.URL(), KeyPrefix: prefix, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("Open with a dead replica: %v", err)
	}
	if _, listed := s2.client.Nodes()[replica.Addr()]; listed && !strings.Contains(logs.String(), "not a primary does not answer") {
		t.Errorf("Open skipped the dead replica %s without a warning: %q", replica.Addr(), logs.String())
	}
	s2.Close()
	if !knows() {
		t.Fatal("the client forgot the dead replica during the test: Ping and List above may not have seen it")
	}

	// A primary without a replica dies: nothing can take over its slots.
	victim := cl.Nodes[2]
	id := strings.TrimSpace(victim.MustDo("CLUSTER", "MYID"))
	victim.Kill()
	err = s.Ping(ctx)
	if !fencing.IsStoreFault(err) || !strings.Contains(err.Error(), id) {
		t.Fatalf("Ping with a dead primary: %v, want a store fault naming the primary %s", err, id)
	}
	if _, err := s.List(ctx, fencing.ListRequest{}); !fencing.IsStoreFault(err) {
		t.Fatalf("List with a dead primary: %v, want a store fault", err)
	}
}

// TestCheckpointStateMissing: checkpoint metadata whose state key is gone
// or unusable reads as no checkpoint, in ReadCheckpoint and in Status alike;
// a state that is not JSON is an error, never a state. A new checkpoint
// repairs the resource.
func TestCheckpointStateMissing(t *testing.T) {
	srv := valkeytest.Start(t)
	prefix := freshPrefix()
	s := open(t, srv.URL(), prefix)
	ctx := context.Background()
	l := mustAcquire(t, s, "cp", "alice")
	save := func(state string) {
		t.Helper()
		if _, err := s.Checkpoint(ctx, fencing.CheckpointRequest{Resource: "cp", Owner: "alice", Token: l.Token, State: json.RawMessage(state)}); err != nil {
			t.Fatalf("Checkpoint: %v", err)
		}
	}
	key := prefix + ":{cp}:state"
	for _, c := range []struct {
		name   string
		damage [][]string
	}{
		{"deleted", [][]string{{"DEL", key}}},
		{"empty", [][]string{{"SET", key, ""}}},
		{"not a string", [][]string{{"DEL", key}, {"HSET", key, "f", "v"}}},
	} {
		srv.MustDo("DEL", key)
		save(`{"step":1}`)
		for _, cmd := range c.damage {
			srv.MustDo(cmd...)
		}
		cp, err := s.ReadCheckpoint(ctx, "cp")
		if !errors.Is(err, fencing.ErrNoCheckpoint) {
			t.Fatalf("%s state: ReadCheckpoint = %+v, %v; want ErrNoCheckpoint", c.name, cp, err)
		}
		st, err := s.Status(ctx, "cp")
		if err != nil || st.Checkpoint != nil {
			t.Fatalf("%s state: Status checkpoint %+v, %v; want none", c.name, st.Checkpoint, err)
		}
		if st.Lease == nil || st.Lease.Token != l.Token {
			t.Fatalf("%s state: Status lease %+v, want the live lease %d", c.name, st.Lease, l.Token)
		}
	}

	srv.MustDo("DEL", key)
	save(`{"step":2}`)
	srv.MustDo("SET", key, "{not json")
	cp, err := s.ReadCheckpoint(ctx, "cp")
	if err == nil || errors.Is(err, fencing.ErrNoCheckpoint) || fencing.IsStoreFault(err) {
		t.Fatalf("state overwritten with invalid JSON: ReadCheckpoint = %q, %v; want an internal error", cp.State, err)
	}

	save(`{"step":3}`)
	cp, err = s.ReadCheckpoint(ctx, "cp")
	if err != nil || string(cp.State) != `{"step":3}` || cp.Token != l.Token {
		t.Fatalf("after a new checkpoint: %q %d %v", cp.State, cp.Token, err)
	}
	if st, err := s.Status(ctx, "cp"); err != nil || st.Checkpoint == nil || st.Checkpoint.SizeBytes != len(`{"step":3}`) {
		t.Fatalf("Status after a new checkpoint: %+v, %v", st.Checkpoint, err)
	}
}
