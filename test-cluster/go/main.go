// Command test-cluster runs a real Kubernetes control plane for tests: an
// embedded etcd, kube-apiserver and kube-controller-manager's namespace
// controller, all inside this one process, on loopback ports chosen at run
// time, with their data, certificates and credentials in a temporary
// directory.
//
// When the API server answers /readyz it writes a kubeconfig (a client CA,
// the server URL and an admin bearer token) and prints one JSON line on
// stdout, for example:
//
//	{"ready":true,"kubeconfig":"/tmp/test-cluster-1/kubeconfig","server":"https://127.0.0.1:40123",...}
//
// It then runs until its standard input reaches end of file, or it gets
// SIGTERM or SIGINT, and exits after removing the temporary directory. The
// standard-input rule is what makes it safe for a test harness: the harness
// keeps the write end of a pipe open, and when the harness exits for any
// reason (even SIGKILL) the kernel closes it, so the cluster never outlives
// the tests. Everything runs in this one process, so nothing else is left.
//
// Usage:
//
//	test-cluster [-dir DIR] [-ready-timeout 60s]
//
// Run by hand, it stops on Ctrl-D or Ctrl-C.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/component-base/version"
)

// ready is the line printed on stdout once the API server is ready.
type ready struct {
	Ready      bool   `json:"ready"`
	Kubeconfig string `json:"kubeconfig"`
	Server     string `json:"server"`
	Token      string `json:"token"`
	CAFile     string `json:"ca_file"`
	Etcd       string `json:"etcd"`
	Dir        string `json:"dir"`
	Version    string `json:"version"`
	Pid        int    `json:"pid"`
	EtcdMs     int64  `json:"etcd_ms"`
	APIMs      int64  `json:"apiserver_ms"`
	TotalMs    int64  `json:"total_ms"`
}

func main() {
	parent := flag.String("dir", "", "parent of the temporary directory (default: the system's)")
	readyTimeout := flag.Duration("ready-timeout", 60*time.Second, "how long to wait for /readyz")
	flag.Parse()

	if err := run(*parent, *readyTimeout); err != nil {
		fmt.Fprintf(os.Stderr, "test-cluster: %v\n", err)
		os.Exit(1)
	}
}

func run(parent string, readyTimeout time.Duration) error {
	start := time.Now()
	dir, err := os.MkdirTemp(parent, "test-cluster-")
	if err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	// Every way out of here removes the directory: errors return through
	// this defer, and a stop request exits through stop().
	defer removeAll(dir)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopRequested := make(chan string, 3)
	go watchStdin(stopRequested)
	go watchSignals(stopRequested)

	creds, err := writeCredentials(dir)
	if err != nil {
		return err
	}

	etcd, err := startEtcd(dir)
	if err != nil {
		return err
	}
	etcdReady := time.Since(start)

	apiStart := time.Now()
	api, err := startAPIServer(ctx, dir, etcd.endpoint, creds)
	if err != nil {
		return err
	}
	if err := waitReady(ctx, api, creds, readyTimeout, stopRequested); err != nil {
		return err
	}
	apiReady := time.Since(apiStart)
	if err := startNamespaceController(ctx, api.url, creds); err != nil {
		return err
	}

	kubeconfig, err := writeKubeconfig(dir, api.url, creds)
	if err != nil {
		return err
	}
	line, err := json.Marshal(ready{
		Ready:      true,
		Kubeconfig: kubeconfig,
		Server:     api.url,
		Token:      creds.token,
		CAFile:     creds.caFile,
		Etcd:       etcd.endpoint,
		Dir:        dir,
		Version:    version.Get().GitVersion,
		Pid:        os.Getpid(),
		EtcdMs:     etcdReady.Milliseconds(),
		APIMs:      apiReady.Milliseconds(),
		TotalMs:    time.Since(start).Milliseconds(),
	})
	if err != nil {
		return err
	}
	fmt.Println(string(line))

	select {
	case why := <-stopRequested:
		fmt.Fprintf(os.Stderr, "test-cluster: stopping (%s)\n", why)
	case err := <-api.done:
		return fmt.Errorf("kube-apiserver stopped: %v", err)
	case err := <-etcd.failed:
		return fmt.Errorf("etcd stopped: %v", err)
	}
	stop(dir)
	return nil
}

// stop ends the process without the API server's graceful shutdown, which
// waits for seconds on purpose (for load balancers), and without closing
// etcd, which waits for its clients' streams to end: the data is thrown
// away, so there is nothing to finish.
func stop(dir string) {
	removeAll(dir)
	os.Exit(0)
}

// removeAll removes dir, retrying for a moment: etcd may still be writing
// into it.
func removeAll(dir string) {
	for i := 0; i < 20; i++ {
		if err := os.RemoveAll(dir); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// watchStdin reports when standard input ends: the harness that started us
// closed it, or died.
func watchStdin(stopRequested chan<- string) {
	_, _ = io.Copy(io.Discard, os.Stdin)
	stopRequested <- "standard input closed"
}

func watchSignals(stopRequested chan<- string) {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	sig := <-signals
	stopRequested <- sig.String()
	// Further signals must not cut the clean-up short: PR_SET_PDEATHSIG
	// fires again each time the dying parent's next thread exits, so one
	// SIGKILL of a multi-threaded parent can bring several SIGTERMs.
	for range signals {
	}
}
