// Command go-peers runs W1, W1 at 100k and W2 of shared/bench/WORKLOADS.md on
// the work queues Go controllers use, so that benches/workloads.rs can set
// them beside tokio-workqueue in the same sitting:
//
//   - client-go's workqueue (workqueue.NewTypedWithConfig), unnamed (no
//     metrics) and named with a Prometheus provider built as Kubernetes'
//     component-base builds its own (provider.go);
//   - controller-runtime's priority queue (priorityqueue.New), unnamed and
//     named (its own metrics, in controller-runtime's registry).
//
// Usage:
//
//	go-peers -list                                   # the implementations, one JSON line
//	go-peers -workload W1 -impl client-go -n 1000000 [-runs 6] [-verify]
//	go-peers -plan < requests                        # one JSON request a line
//
// A request line is {"workload":"W1"|"W2","impl":NAME,"n":N,"verify":BOOL}.
// Every mode first prints a "hello" line (Go and module versions, GOMAXPROCS,
// how the client-go provider was installed), then one JSON line per run:
// {"workload":..,"impl":..,"n":..,"figures":[[NAME,VALUE],..]} or, when a run
// failed, {"workload":..,"impl":..,"n":..,"error":MESSAGE}. The Rust benchmark
// keeps one -plan process for its sitting and sends it one run at a time,
// between runs of its own. For W1, n is the number of keys; for W2, the total
// number of adds (n/4 per producer).
//
// As in the Rust harness: GOMAXPROCS=2 unless the environment sets it (the
// Rust side uses a 2-worker tokio runtime; with --threads=N, N workers and
// GOMAXPROCS=N), keys "ns-{i % 100}/obj-{i}" built before the clock, 4
// consumers started before the clock that loop Get -> work -> Done, a fresh queue per
// run, and the same clocks and end conditions: W1 from the first add to the
// last key's processing, W2 from the first producer's start to the moment
// nothing is queued or in flight, W2's producers yielding (runtime.Gosched)
// every 100 adds, and W2 verified (every key processed after its last add,
// at least 1,000 processings) when the request says verify, which the Rust
// side asks for in the warm-up and in quick mode, as for its own queues.
//
// What differs from the Rust harness:
//
//   - Every run also calls runtime.GC() after building its keys, so that
//     garbage of the previous run is not collected on this run's clock (the
//     Rust side frees memory as it goes and makes a fresh runtime per run).
//   - Goroutines, not tokio tasks: the producers, consumers and the queues'
//     own goroutines are scheduled by Go on 2 Ps, in a process of their own
//     that sits idle while the Rust runs go (and the other way round).
//   - Keys: a Go add passes a string (a pointer and a length), while a Rust
//     WorkQueue<String> takes an owned String, so the Rust W2 producers clone
//     a key (an allocation, freed again when the add is de-duplicated) for
//     each add and the Go ones do not. W1's keys are moved in, no copy on
//     either side.
//   - End of W2 for the priority queue: its ShutDown drops what is queued
//     and it cannot be asked about keys in flight, so the drain polls it
//     (every 200 us) until Len() == 0, no consumer is between Get and Done
//     and no processing has finished for 5 ms, and takes the last Done as
//     the end. For this its consumers count keys in flight and read the
//     clock after each Done (in W2 only). Its Add only appends to a buffer
//     that one goroutine later merges, so nearly every W2 add is merged
//     into a queued key and much of its run is that merge after the last
//     add: W2 reports the drain time after the last add beside adds/s.
//   - client-go with metrics: component-base installs its provider with
//     workqueue.SetProvider. That takes once per process, and
//     controller-runtime's metrics package, linked here for the priority
//     queue, installs its own from an init function first. This program
//     calls SetProvider all the same and probes whether it took; when it did
//     not, it hands the same provider to the named queue in
//     TypedQueueConfig.MetricsProvider, which makes the same metric calls.
//     The hello line says which. component-base wraps client_golang in its
//     own metric types; those act when a queue looks up its children, not
//     on each Inc, Observe or Set, which land on client_golang's types here
//     as there.
//   - Every run with metrics checks afterwards that the queue's adds counter
//     rose by exactly its number of processings, so that a metrics row
//     cannot silently run without metrics.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// request is one run the caller asks for.
type request struct {
	Workload string `json:"workload"`
	Impl     string `json:"impl"`
	N        int    `json:"n"`
	Verify   bool   `json:"verify"`
}

// result is one run's outcome: figures, or an error.
type result struct {
	Workload string   `json:"workload"`
	Impl     string   `json:"impl"`
	N        int      `json:"n"`
	Figures  [][2]any `json:"figures,omitempty"`
	Error    string   `json:"error,omitempty"`
}

func main() {
	list := flag.Bool("list", false, "print the implementations and exit")
	plan := flag.Bool("plan", false, "read JSON requests from stdin, one a line")
	workload := flag.String("workload", "", "W1 or W2")
	impl := flag.String("impl", "", "the implementation (see -list)")
	n := flag.Int("n", 0, "W1: keys; W2: adds in all")
	runs := flag.Int("runs", 1, "runs to make of -workload on -impl")
	verify := flag.Bool("verify", false, "W2: check every key was processed after its last add")
	flag.Parse()

	// The Rust benchmark sets GOMAXPROCS to its --threads (default 2);
	// run by hand without it, the same default as the Rust side.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(2)
	}
	provider := newComponentBaseProvider(prometheus.NewRegistry())
	viaGlobal, how := useProvider(provider)
	all := peers(provider, viaGlobal)

	out := json.NewEncoder(os.Stdout)
	emit := func(v any) {
		if err := out.Encode(v); err != nil {
			fmt.Fprintln(os.Stderr, "go-peers: writing stdout:", err)
			os.Exit(1)
		}
	}
	emit(map[string]any{"hello": hello(how)})

	switch {
	case *list:
		names := make([]string, len(all))
		for i, p := range all {
			names[i] = p.name
		}
		emit(map[string]any{"impls": names})
	case *plan:
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			var req request
			if err := json.Unmarshal(in.Bytes(), &req); err != nil {
				emit(result{Error: fmt.Sprintf("bad request %q: %v", in.Text(), err)})
				continue
			}
			emit(run(all, req))
		}
		if err := in.Err(); err != nil {
			fmt.Fprintln(os.Stderr, "go-peers: reading stdin:", err)
			os.Exit(1)
		}
	default:
		req := request{Workload: *workload, Impl: *impl, N: *n, Verify: *verify}
		failed := false
		for range *runs {
			r := run(all, req)
			failed = failed || r.Error != ""
			emit(r)
		}
		if failed {
			os.Exit(1)
		}
	}
}

// run makes one run of req.
func run(all []peer, req request) result {
	res := result{Workload: req.Workload, Impl: req.Impl, N: req.N}
	var p *peer
	for i := range all {
		if all[i].name == req.Impl {
			p = &all[i]
		}
	}
	var figures []figure
	var err error
	switch {
	case p == nil:
		err = fmt.Errorf("unknown implementation %q (see -list)", req.Impl)
	case req.Workload == "W1":
		figures, err = w1(*p, req.N)
	case req.Workload == "W2":
		figures, err = w2(*p, req.N, req.Verify)
	default:
		err = fmt.Errorf("unknown workload %q (W1 or W2)", req.Workload)
	}
	if err != nil {
		res.Error = err.Error()
		return res
	}
	for _, f := range figures {
		res.Figures = append(res.Figures, [2]any{f.name, f.value})
	}
	return res
}

// hello describes what this binary measures with.
func hello(provider string) map[string]any {
	h := map[string]any{
		"go":                 runtime.Version(),
		"gomaxprocs":         runtime.GOMAXPROCS(0),
		"client-go provider": provider,
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			switch d.Path {
			case "k8s.io/client-go", "sigs.k8s.io/controller-runtime", "github.com/prometheus/client_golang":
				h[d.Path] = d.Version
			}
		}
	}
	return h
}
