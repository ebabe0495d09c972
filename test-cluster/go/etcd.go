package main

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/embed"
)

// etcdServer is a single-member etcd running inside this process. It is
// never closed: it ends with the process (see stop).
type etcdServer struct {
	// endpoint is the client URL, with the port the kernel picked.
	endpoint string
	// failed reports an error etcd hit while running.
	failed <-chan error
	// etcd is the embedded server, for compaction on request.
	etcd *embed.Etcd
}

// compact compacts etcd's history up to its current revision, as
// kube-apiserver's periodic compaction does, and returns that revision:
// afterwards a watch or a list from an older resourceVersion that reaches
// etcd gets 410 Gone.
func (s *etcdServer) compact(ctx context.Context) (int64, error) {
	rev := s.etcd.Server.KV().Rev()
	if _, err := s.etcd.Server.Compact(ctx, &pb.CompactionRequest{Revision: rev, Physical: true}); err != nil {
		return 0, fmt.Errorf("compact at revision %d: %w", rev, err)
	}
	return rev, nil
}

// startEtcd starts etcd with its data under dir (a data directory left by
// an earlier run is reopened, its data kept) and returns once it serves
// clients. Its ports are chosen by the kernel (port 0), so two clusters on
// one machine never collide. fsync is off: the data lives only as long as
// the tests, and fsync on a shared disk would make every write slow.
func startEtcd(dir string) (*etcdServer, error) {
	loopback := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg := embed.NewConfig()
	cfg.Name = "test-cluster"
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.ListenClientUrls = []url.URL{loopback}
	cfg.AdvertiseClientUrls = []url.URL{loopback}
	cfg.ListenPeerUrls = []url.URL{loopback}
	cfg.AdvertisePeerUrls = []url.URL{loopback}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{"stderr"}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd failed while starting: %v", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("etcd not ready after 30s")
	}
	if len(e.Clients) == 0 {
		e.Close()
		return nil, fmt.Errorf("etcd has no client listener")
	}
	return &etcdServer{
		endpoint: "http://" + e.Clients[0].Addr().String(),
		failed:   e.Err(),
		etcd:     e,
	}, nil
}
