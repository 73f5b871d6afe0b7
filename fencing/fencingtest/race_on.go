//go:build race

package fencingtest

// raceEnabled reports whether the race detector is on; it changes
// allocation counts (sync.Pool drops items at random under it).
const raceEnabled = true
