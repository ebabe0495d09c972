package main

import (
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// queueName is the name of every named queue. Each run makes a fresh queue
// under the same name, so its metrics land on the same Prometheus children
// run after run, as a controller's queue would after a restart of it.
const queueName = "bench"

// peer is one Go work queue under test.
type peer struct {
	name string
	// start makes a fresh queue and starts consumers goroutines that run
	// work on each key handed out, then mark it done. forDrain: the run
	// will call drain (W2), so consumers keep what a drain watches.
	start func(consumers int, work func(string), forDrain bool) *running
	// metricAdds reads the adds counter of the named queue (nil when the
	// queue has no metrics): a run checks it moved, so that a row called
	// "metrics" really recorded metrics.
	metricAdds func() float64
}

// running is a peer started for one run.
type running struct {
	add func(key string)
	// drain is called once the producers are finished: it waits until
	// nothing is queued or in flight, then stops the queue, and returns
	// the end of the last processing and the number of processings.
	drain func() (end time.Time, processed uint64)
	// stop shuts the queue down and waits for its consumers (W1, after the
	// last expected key was processed; not timed).
	stop func()
}

// counter is a per-consumer count on its own cache line, so consumers on
// both cores do not share one.
type counter struct {
	n atomic.Uint64
	_ [56]byte
}

func sum(cs []counter) uint64 {
	var s uint64
	for i := range cs {
		s += cs[i].n.Load()
	}
	return s
}

// clientGo is client-go's workqueue.Typed, unnamed (no metrics) or named
// with provider.
func clientGo(provider *componentBaseProvider, viaGlobal bool) func(int, func(string), bool) *running {
	return func(consumers int, work func(string), _ bool) *running {
		cfg := workqueue.TypedQueueConfig[string]{}
		if provider != nil {
			cfg.Name = queueName
			if !viaGlobal {
				cfg.MetricsProvider = provider
			}
		}
		q := workqueue.NewTypedWithConfig(cfg)
		counts := make([]counter, consumers)
		var wg sync.WaitGroup
		for c := range consumers {
			wg.Go(func() {
				for {
					key, shutdown := q.Get()
					if shutdown {
						return
					}
					work(key)
					q.Done(key)
					counts[c].n.Add(1)
				}
			})
		}
		return &running{
			add: q.Add,
			// After ShutDown, Get still hands out what is queued (Done
			// re-queues a key added while it was in flight) and reports
			// shutdown only once the queue is empty, so the last consumer
			// leaves exactly when nothing is queued or in flight.
			drain: func() (time.Time, uint64) {
				q.ShutDown()
				wg.Wait()
				return time.Now(), sum(counts)
			},
			stop: func() {
				q.ShutDown()
				wg.Wait()
			},
		}
	}
}

// quiet is how long a priority queue must look drained (nothing ready,
// no consumer between Get and Done, no processing finished) before a W2
// drain believes it: a key on its way from the queue's hand-out goroutine
// to a consumer is in neither count for a moment.
const quiet = 5 * time.Millisecond

// priorityQueue is controller-runtime's priorityqueue, unnamed (no
// metrics) or named (its own metrics, in controller-runtime's registry).
func priorityQueue(named bool) func(int, func(string), bool) *running {
	return func(consumers int, work func(string), forDrain bool) *running {
		name := ""
		if named {
			name = queueName
		}
		q := priorityqueue.New[string](name)
		counts := make([]counter, consumers)
		// lastDone[c]: when consumer c last finished a key, in ns since base.
		lastDone := make([]counter, consumers)
		base := time.Now()
		var inFlight atomic.Int64
		var wg sync.WaitGroup
		for c := range consumers {
			wg.Go(func() {
				for {
					key, shutdown := q.Get()
					if shutdown {
						return
					}
					if !forDrain {
						work(key)
						q.Done(key)
						counts[c].n.Add(1)
						continue
					}
					inFlight.Add(1)
					work(key)
					q.Done(key)
					inFlight.Add(-1)
					counts[c].n.Add(1)
					lastDone[c].n.Store(uint64(time.Since(base)))
				}
			})
		}
		stop := func() {
			q.ShutDown()
			wg.Wait()
		}
		return &running{
			add: q.Add,
			// ShutDown drops what is queued and the queue cannot be asked
			// about keys in flight, so watch it: Len() merges the add
			// buffer and counts what is ready.
			drain: func() (time.Time, uint64) {
				var since time.Time
				seen := ^uint64(0)
				for {
					now := time.Now()
					if q.Len() == 0 && inFlight.Load() == 0 {
						if n := sum(counts); n != seen {
							seen, since = n, now
						} else if now.Sub(since) >= quiet {
							break
						}
					} else {
						seen = ^uint64(0)
					}
					time.Sleep(200 * time.Microsecond)
				}
				stop()
				var last uint64
				for i := range lastDone {
					last = max(last, lastDone[i].n.Load())
				}
				return base.Add(time.Duration(last)), sum(counts)
			},
			stop: stop,
		}
	}
}

// peers lists the Go queues under test; provider backs the named client-go
// queue, through client-go's global provider when viaGlobal.
func peers(provider *componentBaseProvider, viaGlobal bool) []peer {
	return []peer{
		{name: "client-go", start: clientGo(nil, false)},
		{
			name:       "client-go[metrics=prometheus]",
			start:      clientGo(provider, viaGlobal),
			metricAdds: func() float64 { return provider.addsOf(queueName) },
		},
		{name: "controller-runtime-pq", start: priorityQueue(false)},
		{
			name:       "controller-runtime-pq[metrics=own]",
			start:      priorityQueue(true),
			metricAdds: controllerRuntimeAdds,
		},
	}
}

// controllerRuntimeAdds reads workqueue_adds_total{name="bench"} from
// controller-runtime's registry, where its priority queue's metrics go.
func controllerRuntimeAdds() float64 {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		return -1
	}
	for _, f := range families {
		if f.GetName() != "workqueue_adds_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "name" && l.GetValue() == queueName {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// useProvider installs provider the way component-base does, with
// workqueue.SetProvider, and reports whether that took: the provider is
// set once per process, and controller-runtime's metrics package (linked
// here for the priority queue) sets its own from an init function, which
// runs first. When it did not take, the named client-go queue is given
// provider in its TypedQueueConfig instead (the same provider object, so
// the queue's metric calls are the same).
func useProvider(provider *componentBaseProvider) (viaGlobal bool, how string) {
	workqueue.SetProvider(provider)
	const probe = "provider-probe"
	q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: probe})
	q.Add("probe")
	q.ShutDown()
	if provider.addsOf(probe) == 1 {
		return true, "global (workqueue.SetProvider)"
	}
	return false, "TypedQueueConfig.MetricsProvider " +
		"(workqueue.SetProvider did not take: controller-runtime's init set the global provider first)"
}
