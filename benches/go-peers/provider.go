package main

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/util/workqueue"
)

// componentBaseProvider is a workqueue.MetricsProvider built as Kubernetes'
// component-base builds the one its binaries use
// (k8s.io/component-base/metrics/prometheus/workqueue): seven vectors under
// the "workqueue" subsystem, each with a single "name" label, classic
// histograms with ExponentialBuckets(10e-9, 10, 10) (10 ns to 10 s), all
// registered in one registry. component-base wraps client_golang in its own
// metrics types; those wrappers act when a child is looked up (once per queue,
// at construction), while every Inc, Dec, Set and Observe a queue makes lands
// on client_golang's own Gauge, Counter and Histogram, as here.
type componentBaseProvider struct {
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, work              *prometheus.HistogramVec
}

func newComponentBaseProvider(reg prometheus.Registerer) *componentBaseProvider {
	const sub = "workqueue"
	labels := []string{"name"}
	buckets := prometheus.ExponentialBuckets(10e-9, 10, 10)
	p := &componentBaseProvider{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: sub, Name: "depth",
			Help: "Current depth of the workqueue.",
		}, labels),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: sub, Name: "adds_total",
			Help: "Adds the workqueue has handled.",
		}, labels),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: sub, Name: "queue_duration_seconds",
			Help:    "Seconds an item waits in the workqueue before it is handed out.",
			Buckets: buckets,
		}, labels),
		work: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: sub, Name: "work_duration_seconds",
			Help:    "Seconds the processing of an item took.",
			Buckets: buckets,
		}, labels),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: sub, Name: "unfinished_work_seconds",
			Help: "Seconds of processing in progress that work_duration has not yet observed.",
		}, labels),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: sub, Name: "longest_running_processor_seconds",
			Help: "Seconds the longest running processing has been running.",
		}, labels),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: sub, Name: "retries_total",
			Help: "Retries the workqueue has handled.",
		}, labels),
	}
	reg.MustRegister(p.depth, p.adds, p.latency, p.work, p.unfinished, p.longest, p.retries)
	return p
}

func (p *componentBaseProvider) NewDepthMetric(name string) workqueue.GaugeMetric {
	return p.depth.WithLabelValues(name)
}

func (p *componentBaseProvider) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.adds.WithLabelValues(name)
}

func (p *componentBaseProvider) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.latency.WithLabelValues(name)
}

func (p *componentBaseProvider) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.work.WithLabelValues(name)
}

func (p *componentBaseProvider) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.unfinished.WithLabelValues(name)
}

func (p *componentBaseProvider) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.longest.WithLabelValues(name)
}

func (p *componentBaseProvider) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.retries.WithLabelValues(name)
}

// addsOf reads the adds counter of the queue called name: a run checks
// with it that its queue really recorded metrics.
func (p *componentBaseProvider) addsOf(name string) float64 {
	var m dto.Metric
	if err := p.adds.WithLabelValues(name).Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
