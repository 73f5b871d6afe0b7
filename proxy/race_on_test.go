//go:build race

package proxy

// raceEnabled: the race detector is on, which changes allocation counts.
const raceEnabled = true
