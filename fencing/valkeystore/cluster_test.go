package valkeystore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fencing"
	"github.com/fencegate/fencegate/fencing/valkeystore/valkeytest"
)

// TestClusterNodeLoss restarts one primary of a 3-node cluster without
// persistence: it comes back owning its slots, with no data (as after a
// failover to an empty replica). Resources on that node refuse their old
// tokens and issue greater ones; resources on the other nodes are untouched.
func TestClusterNodeLoss(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	prefix := freshPrefix()
	s := open(t, cl.URL(), prefix)
	ctx := context.Background()
	before := map[string]fencing.Lease{}
	for i := range 30 {
		res := fmt.Sprint("cn", i)
		l := mustAcquire(t, s, res, "alice")
		mustAdmit(t, s, res, l.Token)
		before[res] = l
	}
	victim := cl.Nodes[1]
	victim.Restart()
	for range 200 {
		if info, err := victim.Do("CLUSTER", "INFO"); err == nil && strings.Contains(info, "cluster_state:ok") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	lost := 0
	for res, l := range before {
		var st fencing.Status
		var err error
		for range 100 { // the client may need to reconnect to the node
			if st, err = s.Status(ctx, res); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("Status(%s) after the node restart: %v", res, err)
		}
		if st.Issued == 0 {
			lost++
			wantRefused(t, s, res, l.Token)
			nl := mustAcquire(t, s, res, "bob")
			if nl.Token <= l.Token {
				t.Fatalf("%s: token after the node lost its data %d, want > %d", res, nl.Token, l.Token)
			}
			wantRefused(t, s, res, l.Token)
			continue
		}
		if st.Issued != l.Token || st.HighWater != l.Token || st.Lease == nil || st.Lease.Owner != "alice" {
			t.Fatalf("%s on a surviving node: status %+v, want untouched", res, st)
		}
		mustAdmit(t, s, res, l.Token)
	}
	if lost == 0 || lost == len(before) {
		t.Fatalf("%d of %d resources lost: the test did not exercise both a lost and a surviving node", lost, len(before))
	}
	t.Logf("%d of %d resources were on the restarted node", lost, len(before))
}
