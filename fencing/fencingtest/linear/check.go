package linear

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Model is the Porcupine model of a store: the per-resource State and Step,
// partitioned by resource. skipTokens allows tokens above issued+1.
func Model(skipTokens bool) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partition,
		Init:      func() []any { return []any{NewState(skipTokens)} },
		Step: func(state, input, output any) []any {
			next := Step(state.(State), input.(Input), output.(Output))
			out := make([]any, len(next))
			for i, s := range next {
				out[i] = s
			}
			return out
		},
		Equal: func(a, b any) bool { return a.(State) == b.(State) },
		DescribeOperation: func(in, out any) string {
			i, ok1 := in.(Input)
			o, ok2 := out.(Output)
			if !ok1 || !ok2 {
				return "" // the visualization also asks about its own entries
			}
			return describe(i, o)
		},
		DescribeState: func(s any) string {
			if st, ok := s.(State); ok {
				return describeState(st)
			}
			return ""
		},
	}
	return nm.ToModel()
}

// partition splits a history by resource: resources share nothing, so the
// history is linearizable when each resource's is.
func partition(ops []porcupine.Operation) [][]porcupine.Operation {
	byRes := map[string][]porcupine.Operation{}
	var names []string
	for _, op := range ops {
		res := op.Input.(Input).Resource
		if _, ok := byRes[res]; !ok {
			names = append(names, res)
		}
		byRes[res] = append(byRes[res], op)
	}
	sort.Strings(names)
	out := make([][]porcupine.Operation, 0, len(names))
	for _, n := range names {
		out = append(out, byRes[n])
	}
	return out
}

// Verdict is the outcome of checking a history.
type Verdict struct {
	Result porcupine.CheckResult
	// Counterexample describes the shortest failing prefix of the failing
	// resource's history (empty when the history is linearizable).
	Counterexample string
	// Artifact is the HTML rendering of the shortest failing prefix, when
	// one was written.
	Artifact string
	// HistoryFile is the whole history as JSON, when one was written.
	HistoryFile string
	ops         []porcupine.Operation
	info        porcupine.LinearizationInfo
}

// CheckHistory checks ops (as History.Operations returns them) within
// budget. When the history is not linearizable it finds the shortest
// failing prefix of the resource that fails, describes it, and, when
// artifactDir is not empty, renders it as HTML there under name.
func CheckHistory(ops []porcupine.Operation, skipTokens bool, budget time.Duration, artifactDir, name string) Verdict {
	model := Model(skipTokens)
	res, info := porcupine.CheckOperationsVerbose(model, ops, budget)
	v := Verdict{Result: res, ops: ops, info: info}
	if res != porcupine.Illegal {
		return v
	}
	// Find the resource whose history fails, then its shortest prefix.
	var failing []porcupine.Operation
	for _, part := range partition(ops) {
		if porcupine.CheckOperationsTimeout(model, part, budget) == porcupine.Illegal {
			failing = part
			break
		}
	}
	if failing == nil {
		v.Counterexample = "the whole history is not linearizable, but no single resource's history failed again within the budget"
		return v
	}
	prefix := shortestFailingPrefix(model, failing, budget)
	_, pinfo := porcupine.CheckOperationsVerbose(model, prefix, budget)
	v.Counterexample = counterexample(model, prefix, pinfo)
	if artifactDir != "" {
		if err := os.MkdirAll(artifactDir, 0o755); err == nil {
			base := filepath.Join(artifactDir, fmt.Sprintf("%s-%s", safeName(name), time.Now().Format("20060102-150405.000")))
			if err := porcupine.VisualizePath(model, pinfo, base+".html"); err == nil {
				v.Artifact = base + ".html"
			}
			// The whole history, for replaying the check (LoadHistory).
			if b, err := json.Marshal(toRecords(ops)); err == nil && os.WriteFile(base+".json", b, 0o644) == nil {
				v.HistoryFile = base + ".json"
			}
		}
	}
	return v
}

// prefixAt is what an observer saw of ops at real time cut: the calls made
// by then, those not answered by then pending (they may or may not have
// taken effect).
func prefixAt(ops []porcupine.Operation, cut int64) []porcupine.Operation {
	var out []porcupine.Operation
	var last int64
	for _, op := range ops {
		if op.Call <= cut {
			last = max(last, op.Call)
			if op.Return <= cut {
				last = max(last, op.Return)
			}
		}
	}
	for _, op := range ops {
		if op.Call > cut {
			continue
		}
		if op.Return > cut {
			o := op.Output.(Output)
			if o.Result != Ambiguous {
				op.Output = Output{Result: Ambiguous, Return: o.Return}
			}
			op.Return = last + 1
			if readOnly(op.Input.(Input).Kind) {
				op.Return = cut // see History.Operations
			}
		}
		out = append(out, op)
	}
	return out
}

// shortestFailingPrefix binary-searches the earliest real-time cut whose
// prefix is already not linearizable (a prefix of a linearizable history
// is linearizable, so failure is monotone in the cut).
func shortestFailingPrefix(model porcupine.Model, ops []porcupine.Operation, budget time.Duration) []porcupine.Operation {
	var cuts []int64
	for _, op := range ops {
		cuts = append(cuts, op.Call)
	}
	sort.Slice(cuts, func(i, j int) bool { return cuts[i] < cuts[j] })
	lo, hi := 0, len(cuts)-1 // the prefix at cuts[hi] plus the rest fails
	best := ops
	for lo <= hi {
		mid := (lo + hi) / 2
		p := prefixAt(ops, cuts[mid])
		if porcupine.CheckOperationsTimeout(model, p, budget) == porcupine.Illegal {
			best, hi = p, mid-1
		} else {
			lo = mid + 1
		}
	}
	return best
}

// counterexample renders a failing prefix: its calls in real-time order and
// the longest sequence the model accepted before it got stuck.
func counterexample(model porcupine.Model, prefix []porcupine.Operation, info porcupine.LinearizationInfo) string {
	var b strings.Builder
	sorted := append([]porcupine.Operation(nil), prefix...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	res := ""
	if len(sorted) > 0 {
		res = sorted[0].Input.(Input).Resource
	}
	fmt.Fprintf(&b, "resource %q: shortest failing prefix, %d calls (times are real ns since the start; @ is the store clock in Unix ms):\n", res, len(sorted))
	const show = 40
	if len(sorted) > show {
		fmt.Fprintf(&b, "  ... %d earlier calls omitted (see the HTML artifact)\n", len(sorted)-show)
		sorted = sorted[len(sorted)-show:]
	}
	for _, op := range sorted {
		ret := fmt.Sprint(op.Return)
		if op.Output.(Output).Result == Ambiguous {
			ret = "pending"
		}
		fmt.Fprintf(&b, "  client %d [%d, %s] %s\n", op.ClientId, op.Call, ret, describe(op.Input.(Input), op.Output.(Output)))
	}
	// The longest sequential order the model accepted.
	var longest []porcupine.Operation
	for _, part := range info.PartialLinearizationsOperations() {
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	fmt.Fprintf(&b, "longest order the model accepts (%d of %d calls); no remaining call can come next:\n", len(longest), len(prefix))
	from := max(0, len(longest)-10)
	if from > 0 {
		fmt.Fprintf(&b, "  ... %d earlier\n", from)
	}
	for _, op := range longest[from:] {
		fmt.Fprintf(&b, "  %s\n", describe(op.Input.(Input), op.Output.(Output)))
	}
	return b.String()
}

func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// record is one operation as saved in a history file.
type record struct {
	Client       int
	Call, Return int64
	Input        Input
	Output       Output
}

func toRecords(ops []porcupine.Operation) []record {
	out := make([]record, len(ops))
	for i, op := range ops {
		out[i] = record{Client: op.ClientId, Call: op.Call, Return: op.Return, Input: op.Input.(Input), Output: op.Output.(Output)}
	}
	return out
}

// LoadHistory reads a history file written with a counterexample, to
// replay its check (CheckHistory) while investigating.
func LoadHistory(path string) ([]porcupine.Operation, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var recs []record
	if err := json.Unmarshal(b, &recs); err != nil {
		return nil, err
	}
	ops := make([]porcupine.Operation, len(recs))
	for i, r := range recs {
		ops[i] = porcupine.Operation{ClientId: r.Client, Call: r.Call, Return: r.Return, Input: r.Input, Output: r.Output}
	}
	return ops, nil
}
