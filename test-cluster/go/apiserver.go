package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/rest"
	basecompatibility "k8s.io/component-base/compatibility"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// apiServer is kube-apiserver running inside this process.
type apiServer struct {
	// url is https://127.0.0.1:PORT.
	url string
	// done receives what app.Run returned, should it ever return.
	done <-chan error
}

// errStopRequested is returned when a stop was asked for before the API
// server was ready.
var errStopRequested = errors.New("stop requested before the cluster was ready")

// faultOptions are the settings a fault test chooses: how often
// kube-apiserver compacts etcd, whether it serves watches from its watch
// cache, and the port it listens on (0: one the kernel picks).
type faultOptions struct {
	compactionInterval time.Duration
	watchCache         bool
	port               int
}

// apiServerFlags are the kube-apiserver command-line flags the cluster runs
// with, so what runs here is what `kube-apiserver <flags>` would run.
func apiServerFlags(dir, etcd string, c *credentials, o faultOptions) []string {
	return []string{
		"--etcd-servers=" + etcd,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--tls-cert-file=" + c.tlsCert,
		"--tls-private-key-file=" + c.tlsKey,
		"--token-auth-file=" + c.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + c.saKey,
		"--service-account-signing-key-file=" + c.saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		// No controller manager runs, so nothing would create the service
		// accounts this plugin waits for.
		"--disable-admission-plugins=ServiceAccount",
		// The endpoint of the "kubernetes" Service would be a loopback
		// address, which Endpoints validation rejects.
		"--endpoint-reconciler-type=none",
		// kube-apiserver's own default is 5m; a fault test asks for
		// seconds, so that resumed watches meet compacted revisions.
		"--etcd-compaction-interval=" + o.compactionInterval.String(),
		fmt.Sprintf("--watch-cache=%t", o.watchCache),
	}
}

// startAPIServer starts kube-apiserver on a loopback listener (on
// o.port, or a free port the kernel gives when it is 0), the way cmd/kube-apiserver does apart from that listener
// and the signal handling (this process handles signals itself).
func startAPIServer(ctx context.Context, dir, etcd string, c *credentials, o faultOptions) (*apiServer, error) {
	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(apiServerFlags(dir, etcd, c, o)); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}

	// Go's listeners set SO_REUSEADDR, so a restarted cluster gets its
	// port back at once even with connections of its previous run in
	// TIME_WAIT.
	listener, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", o.port))
	if err != nil {
		return nil, fmt.Errorf("listen on a loopback port: %w", err)
	}
	port := listener.Addr().(*net.TCPAddr).Port
	s.SecureServing.Listener = listener
	s.SecureServing.BindPort = port

	// What the kube-apiserver command does before running.
	registry := s.GenericServerRunOptions.ComponentGlobalsRegistry
	if err := registry.Set(); err != nil {
		listener.Close()
		return nil, err
	}
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	if err := logsapi.ValidateAndApply(s.Logs, registry.FeatureGateFor(basecompatibility.DefaultKubeComponent)); err != nil {
		listener.Close()
		return nil, err
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		listener.Close()
		return nil, fmt.Errorf("kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		listener.Close()
		return nil, fmt.Errorf("kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}

	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, completed) }()
	return &apiServer{url: fmt.Sprintf("https://127.0.0.1:%d", port), done: done}, nil
}

// waitReady polls /readyz (as the admin, verifying the serving certificate)
// until it answers 200, the server fails, a stop is requested or the
// timeout passes.
func waitReady(ctx context.Context, api *apiServer, c *credentials, timeout time.Duration, stopRequested <-chan string) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.caPEM)
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	defer client.CloseIdleConnections()
	deadline := time.After(timeout)
	lastErr := "no answer yet"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.url+"/readyz", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		if resp, err := client.Do(req); err != nil {
			lastErr = err.Error()
		} else {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			lastErr = fmt.Sprintf("%s: %s", resp.Status, body)
		}
		select {
		case err := <-api.done:
			return fmt.Errorf("kube-apiserver stopped while starting: %v", err)
		case why := <-stopRequested:
			return fmt.Errorf("%w (%s)", errStopRequested, why)
		case <-deadline:
			return fmt.Errorf("kube-apiserver not ready after %s: %s", timeout, lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
