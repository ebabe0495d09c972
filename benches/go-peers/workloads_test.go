package main

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The provider can be made once per process: its probe queue's name would
// otherwise be registered twice.
var testPeers = sync.OnceValue(func() []peer {
	provider := newComponentBaseProvider(prometheus.NewRegistry())
	viaGlobal, _ := useProvider(provider)
	return peers(provider, viaGlobal)
})

func TestKeysHaveTheWorkloadShape(t *testing.T) {
	if got := key(1234); got != "ns-34/obj-1234" {
		t.Fatalf("key(1234) = %q", got)
	}
	if i, err := keyIndex("ns-34/obj-1234"); err != nil || i != 1234 {
		t.Fatalf("keyIndex = %d, %v", i, err)
	}
}

// Every peer finishes W1 and a verified W2 with sane figures; the named ones
// pass the metrics check inside the workloads.
func TestEveryPeerRunsW1AndVerifiedW2(t *testing.T) {
	for _, p := range testPeers() {
		t.Run(p.name, func(t *testing.T) {
			figs, err := w1(p, 20_000)
			if err != nil {
				t.Fatal(err)
			}
			if figs[0].name != "items/s" || figs[0].value <= 0 {
				t.Fatalf("W1 figures %v", figs)
			}
			figs, err = w2(p, 40_000, true)
			if err != nil {
				t.Fatal(err)
			}
			if r := figs[1].value; r < float64(w2Keys)/40_000 || r > 1 {
				t.Fatalf("W2 processed/adds %v out of range", r)
			}
		})
	}
}

func TestUnnamedPeersHaveNoMetrics(t *testing.T) {
	for _, p := range testPeers() {
		if named := strings.Contains(p.name, "[metrics="); named != (p.metricAdds != nil) {
			t.Errorf("%s: named %v but metric check %v", p.name, named, p.metricAdds != nil)
		}
	}
}

// lossy is a queue that loses every key whose number ends in 7 once it has
// been processed once: W2's verification must catch it.
func lossy(consumers int, work func(string), _ bool) *running {
	keys := make(chan string, 1<<16)
	var mu sync.Mutex
	done := map[string]bool{}
	var wg sync.WaitGroup
	var processed [64]counter
	for c := range consumers {
		wg.Go(func() {
			for k := range keys {
				work(k)
				processed[c].n.Add(1)
			}
		})
	}
	return &running{
		add: func(k string) {
			mu.Lock()
			drop := strings.HasSuffix(k, "7") && done[k]
			done[k] = true
			mu.Unlock()
			if !drop {
				keys <- k
			}
		},
		drain: func() (time.Time, uint64) {
			close(keys)
			wg.Wait()
			return time.Now(), sum(processed[:])
		},
		stop: func() { close(keys); wg.Wait() },
	}
}

func TestW2VerificationCatchesALostAdd(t *testing.T) {
	_, err := w2(peer{name: "lossy", start: lossy}, 40_000, true)
	if err == nil || !strings.Contains(err.Error(), "not processed after its last add") {
		t.Fatalf("want a lost-add error, got %v", err)
	}
}

func TestMetricsCheckCatchesAQueueWithoutMetrics(t *testing.T) {
	unnamed := testPeers()[0]
	fake := peer{name: "fake", start: unnamed.start, metricAdds: func() float64 { return 0 }}
	if _, err := w1(fake, 1000); err == nil || !strings.Contains(err.Error(), "metrics counted 0 adds") {
		t.Fatalf("want a metrics error, got %v", err)
	}
}

func TestBadRequestsGetClearErrors(t *testing.T) {
	all := testPeers()
	for _, req := range []request{
		{Workload: "W9", Impl: "client-go", N: 10},
		{Workload: "W1", Impl: "nope", N: 10},
		{Workload: "W1", Impl: "client-go", N: 0},
		{Workload: "W2", Impl: "client-go", N: 10},
	} {
		if r := run(all, req); r.Error == "" || r.Figures != nil {
			t.Errorf("%+v: want an error, got %+v", req, r)
		}
	}
}
