package linear

import "github.com/anishathalye/porcupine"

// WithCandidates recomputes the candidates of pending acquires.
func WithCandidates(ops []porcupine.Operation) []porcupine.Operation {
	addCandidates(ops)
	return ops
}
