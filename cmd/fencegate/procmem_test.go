package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// procStatus reads a memory field of /proc/PID/status (VmRSS, VmHWM),
// given there in kB, in bytes.
func procStatus(pid int, field string) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// procMemory is procStatus, failing t on an error.
func procMemory(t *testing.T, pid int, field string) int64 {
	t.Helper()
	n, err := procStatus(pid, field)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
