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
// SIGTERM or SIGINT, and exits after removing the temporary directory.
// While it runs, it reads commands from standard input, one a line, and
// answers each with one JSON line on stdout:
//
//	compact    compacts etcd up to its current revision: {"compacted":REV}
//
// (an unknown command or a failure answers {"error":"..."}). The
// standard-input rule is what makes it safe for a test harness: the harness
// keeps the write end of a pipe open, and when the harness exits for any
// reason (even SIGKILL) the kernel closes it, so the cluster never outlives
// the tests. Everything runs in this one process, so nothing else is left.
//
// Usage:
//
//	test-cluster [-dir DIR | -data DIR] [-port N] [-ready-timeout 60s]
//	             [-etcd-compaction-interval 5m] [-watch-cache=true]
//
// Run by hand, it stops on Ctrl-D or Ctrl-C.
//
// For fault tests, -data names the directory to use instead of a temporary
// one: created if missing, reused (etcd's data, the credentials, the
// serving certificate) if it holds an earlier run's. Like a temporary
// directory it is removed when the cluster stops in order (standard input
// closed, a signal), but not when it is killed (SIGKILL), so a harness
// can kill the cluster and start it again on its data; -port keeps the API server's
// port across such restarts, so clients reconnect to the same address.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
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
	data := flag.String("data", "", "the directory for the cluster's data instead of a temporary one, reused if it holds an earlier run's (removed at an orderly stop, kept if killed)")
	readyTimeout := flag.Duration("ready-timeout", 60*time.Second, "how long to wait for /readyz")
	var o faultOptions
	flag.IntVar(&o.port, "port", 0, "the API server's loopback port (0: a free one)")
	flag.DurationVar(&o.compactionInterval, "etcd-compaction-interval", 5*time.Minute, "kube-apiserver's --etcd-compaction-interval")
	flag.BoolVar(&o.watchCache, "watch-cache", true, "kube-apiserver's --watch-cache")
	flag.Parse()

	if err := run(*parent, *data, *readyTimeout, o); err != nil {
		fmt.Fprintf(os.Stderr, "test-cluster: %v\n", err)
		os.Exit(1)
	}
}

func run(parent, data string, readyTimeout time.Duration, o faultOptions) error {
	start := time.Now()
	dir := data
	if data != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
	} else {
		var err error
		dir, err = os.MkdirTemp(parent, "test-cluster-")
		if err != nil {
			return fmt.Errorf("temporary directory: %w", err)
		}
	}
	// Every way out of here but SIGKILL removes the directory: errors
	// return through this defer, and a stop request exits through stop().
	defer removeAll(dir)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopRequested := make(chan string, 3)
	commands := make(chan string)
	go watchStdin(stopRequested, commands)
	go watchSignals(stopRequested)

	creds, err := loadCredentials(dir)
	if err != nil {
		return err
	}
	if creds == nil {
		if creds, err = writeCredentials(dir); err != nil {
			return err
		}
	}

	etcd, err := startEtcd(dir)
	if err != nil {
		return err
	}
	etcdReady := time.Since(start)

	apiStart := time.Now()
	api, err := startAPIServer(ctx, dir, etcd.endpoint, creds, o)
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

	for {
		select {
		case why := <-stopRequested:
			fmt.Fprintf(os.Stderr, "test-cluster: stopping (%s)\n", why)
			stop(dir)
			return nil
		case command := <-commands:
			answer(ctx, command, etcd)
		case err := <-api.done:
			return fmt.Errorf("kube-apiserver stopped: %v", err)
		case err := <-etcd.failed:
			return fmt.Errorf("etcd stopped: %v", err)
		}
	}
}

// answer runs one command read from standard input and prints its answer,
// one JSON line on stdout.
func answer(ctx context.Context, command string, etcd *etcdServer) {
	var reply any
	switch command {
	case "compact":
		if rev, err := etcd.compact(ctx); err != nil {
			reply = map[string]string{"error": err.Error()}
		} else {
			reply = map[string]int64{"compacted": rev}
		}
	default:
		reply = map[string]string{"error": fmt.Sprintf("unknown command %q", command)}
	}
	line, _ := json.Marshal(reply)
	fmt.Println(string(line))
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

// watchStdin passes on the commands read from standard input, one a line,
// and reports when it ends: the harness that started us closed it, or
// died.
func watchStdin(stopRequested chan<- string, commands chan<- string) {
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		if command := lines.Text(); command != "" {
			commands <- command
		}
	}
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
