package record

import (
	"fmt"

	"github.com/fencegate/fencegate/fencing"
)

func leaseLost(resource string) error {
	return fmt.Errorf("%w: the caller does not hold the live lease on %q", fencing.ErrLeaseLost, resource)
}

func leaseNotHeld(resource string, token fencing.Token) error {
	return fmt.Errorf("%w: no live lease on %q holds token %d", fencing.ErrLeaseNotHeld, resource, token)
}
