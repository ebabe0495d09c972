package main

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The consumers of W1 and W2; W2's distinct keys and producers.
const (
	consumers   = 4
	w2Keys      = 1000
	w2Producers = 4
)

// figure is one measured value of a run, named as the Rust harness names it.
type figure struct {
	name  string
	value float64
}

// key is key i in the Kubernetes form the workloads use.
func key(i int) string {
	return "ns-" + strconv.Itoa(i%100) + "/obj-" + strconv.Itoa(i)
}

func keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = key(i)
	}
	return ks
}

// keyIndex is the number i of a key made by key.
func keyIndex(k string) (int, error) {
	return strconv.Atoi(k[strings.LastIndexByte(k, '-')+1:])
}

// checkMetrics makes sure a queue with metrics counted one add for every
// processing of the run (a client-go or priority-queue add that de-duplicates
// into a queued key counts none), so that a "metrics" row really paid for
// its metrics.
func checkMetrics(p peer, before float64, processed uint64) error {
	if p.metricAdds == nil {
		return nil
	}
	if got := p.metricAdds() - before; got != float64(processed) {
		return fmt.Errorf("%s: its metrics counted %.0f adds for %d processings", p.name, got, processed)
	}
	return nil
}

// w1 is W1 fifo-drain: 1 producer adds n distinct keys; 4 consumers. The
// clock runs from the first add until the last key's processing.
func w1(p peer, n int) ([]figure, error) {
	if n < 1 {
		return nil, fmt.Errorf("W1 needs at least 1 key, got %d", n)
	}
	ks := keys(n)
	runtime.GC()
	var before float64
	if p.metricAdds != nil {
		before = p.metricAdds()
	}
	var left atomic.Int64
	left.Store(int64(n))
	ended := make(chan time.Time, 1)
	work := func(string) {
		if left.Add(-1) == 0 {
			ended <- time.Now()
		}
	}
	r := p.start(consumers, work, false)
	type adds struct {
		start, last time.Time
		left        int64
	}
	produced := make(chan adds, 1)
	go func() {
		start := time.Now()
		for _, k := range ks {
			r.add(k)
		}
		l := left.Load()
		produced <- adds{start, time.Now(), l}
	}()
	end := <-ended
	a := <-produced
	r.stop()
	if err := checkMetrics(p, before, uint64(n)); err != nil {
		return nil, err
	}
	drain := 0.0
	if secs := end.Sub(a.last).Seconds(); a.left > 0 && secs > 0 {
		drain = float64(a.left) / secs
	}
	return []figure{
		{"items/s", float64(n) / end.Sub(a.start).Seconds()},
		{"left at last add", float64(a.left)},
		{"adds/s beside consumers", float64(n) / a.last.Sub(a.start).Seconds()},
		{"drain items/s after", drain},
	}, nil
}

// w2 is W2 hot-keys: 4 producers add adds/4 keys each out of 1,000, yielding
// every 100 adds; 4 consumers. The clock runs from the first producer's
// start until nothing is queued or in flight. With verify, every key must
// have been processed after its last add.
func w2(p peer, adds int, verify bool) ([]figure, error) {
	if adds < w2Producers || adds%w2Producers != 0 {
		return nil, fmt.Errorf("W2 needs a positive multiple of %d adds, got %d", w2Producers, adds)
	}
	perProducer := adds / w2Producers
	names := keys(w2Keys)
	// Adds of each key so far, and the most a processing of it saw.
	added := make([]atomic.Uint64, w2Keys)
	seen := make([]atomic.Uint64, w2Keys)
	var bad atomic.Pointer[error]
	runtime.GC()
	var before float64
	if p.metricAdds != nil {
		before = p.metricAdds()
	}
	work := func(string) {}
	if verify {
		work = func(k string) {
			i, err := keyIndex(k)
			if err != nil || i < 0 || i >= w2Keys {
				err = fmt.Errorf("%s: W2 handed out %q, not a W2 key", p.name, k)
				bad.CompareAndSwap(nil, &err)
				return
			}
			a := added[i].Load()
			for s := seen[i].Load(); s < a && !seen[i].CompareAndSwap(s, a); s = seen[i].Load() {
			}
		}
	}
	r := p.start(consumers, work, true)
	starts := make([]time.Time, w2Producers)
	ends := make([]time.Time, w2Producers)
	var wg sync.WaitGroup
	for pr := range w2Producers {
		wg.Go(func() {
			starts[pr] = time.Now()
			for j := range perProducer {
				i := (pr*7919 + j) % w2Keys
				if verify {
					added[i].Add(1)
				}
				r.add(names[i])
				if (j+1)%100 == 0 {
					runtime.Gosched()
				}
			}
			ends[pr] = time.Now()
		})
	}
	wg.Wait()
	end, processed := r.drain()
	start, lastAdd := starts[0], ends[0]
	for pr := range w2Producers {
		if starts[pr].Before(start) {
			start = starts[pr]
		}
		if ends[pr].After(lastAdd) {
			lastAdd = ends[pr]
		}
	}
	if err := bad.Load(); err != nil {
		return nil, *err
	}
	if verify {
		if processed < w2Keys {
			return nil, fmt.Errorf("%s: W2 processed %d < %d", p.name, processed, w2Keys)
		}
		for i := range w2Keys {
			if a, s := added[i].Load(), seen[i].Load(); a != s {
				return nil, fmt.Errorf("%s: W2 key %d not processed after its last add (%d adds, a processing saw %d)", p.name, i, a, s)
			}
		}
	}
	if err := checkMetrics(p, before, processed); err != nil {
		return nil, err
	}
	return []figure{
		{"adds/s", float64(adds) / end.Sub(start).Seconds()},
		{"processed/adds", float64(processed) / float64(adds)},
		// The last producer may be descheduled between its last add and
		// reading the clock while the queue empties: that reads as 0.
		{"drain ms after last add", max(end.Sub(lastAdd), 0).Seconds() * 1e3},
	}, nil
}
