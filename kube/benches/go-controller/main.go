// Command go-controller is the controller-runtime peer of the controller
// benchmark (kube/benches/controllers.rs): a controller-runtime manager with
// default options (priority queue on) and one controller for the ConfigMaps
// of one namespace, whose reconcile reads the object from the cache (no
// GET), prints "START ns/name resourceVersion unix_nanos" and sleeps 1 ms,
// four reconciles at once. It prints "SYNCED unix_nanos" once the cache has
// synced and exits when its standard input closes (so it never outlives the
// benchmark).
//
//	go-controller --kubeconfig PATH --namespace NS [--strip-managed-fields]
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// out is standard output, written one line per call (one write each, as
// the Rust controllers do).
var out = os.Stdout

type reconciler struct {
	client client.Client
}

func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	start := time.Now().UnixNano()
	var cm corev1.ConfigMap
	if err := r.client.Get(ctx, req.NamespacedName, &cm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	fmt.Fprintf(out, "START %s/%s %s %d\n", cm.Namespace, cm.Name, cm.ResourceVersion, start)
	time.Sleep(time.Millisecond)
	return reconcile.Result{}, nil
}

func main() {
	// --kubeconfig is controller-runtime's own flag (pkg/client/config).
	namespace := flag.String("namespace", "", "the namespace whose ConfigMaps are reconciled")
	strip := flag.Bool("strip-managed-fields", false, "strip managedFields from the cache (cache.TransformStripManagedFields)")
	flag.Parse()
	if flag.Lookup("kubeconfig").Value.String() == "" || *namespace == "" {
		fmt.Fprintln(os.Stderr, "usage: go-controller --kubeconfig PATH --namespace NS [--strip-managed-fields]")
		os.Exit(2)
	}
	ctrl.SetLogger(logr.Discard())
	cfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeconfig:", err)
		os.Exit(1)
	}
	cacheOpts := cache.Options{
		DefaultNamespaces: map[string]cache.Config{*namespace: {}},
	}
	if *strip {
		cacheOpts.DefaultTransform = cache.TransformStripManagedFields()
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Cache: cacheOpts,
		// No metrics or health listener: the benchmark runs several
		// controllers and reads nothing from them.
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
	err = ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(&reconciler{client: mgr.GetClient()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "controller:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		cancel()
		time.Sleep(2 * time.Second)
		os.Exit(0)
	}()
	go func() {
		informer, err := mgr.GetCache().GetInformer(ctx, &corev1.ConfigMap{})
		if err != nil {
			return
		}
		if toolscache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			fmt.Fprintf(out, "SYNCED %d\n", time.Now().UnixNano())
		}
	}()
	if err := mgr.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}
