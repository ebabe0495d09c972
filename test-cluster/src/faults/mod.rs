//! Faults on the real API server: a cluster of a test's own that can be
//! restarted with its data and compacted on request, and a TCP proxy per
//! client that can delay, stall, reset and cut its connections.
//!
//! The shared real cluster ([`real_cluster`](crate::real_cluster)) is left
//! alone: a fault test starts a [`ChaosCluster`] of its own (4 to 7 s),
//! with the same binary.
//!
//! # The faults, each a call
//!
//! | call | what happens | what clients see |
//! | --- | --- | --- |
//! | [`ChaosCluster::restart`] | the cluster's process is killed (SIGKILL: etcd and kube-apiserver at once, nothing flushed or drained) and started again on its kept data directory and the same port | every connection and watch breaks at once; requests fail (connection refused) for the 2 to 5 s the restart takes; kube-apiserver's watch cache starts afresh, so watches resumed at an older resourceVersion may get 410 Gone |
//! | [`ChaosCluster::compact`] | etcd's history is compacted up to its current revision, as kube-apiserver does every [`compaction_interval`](ChaosClusterBuilder::compaction_interval) | a watch or list that reaches etcd at an older resourceVersion gets 410 Gone (with the watch cache off, [`watch_cache(false)`](ChaosClusterBuilder::watch_cache), every resumed watch does) |
//! | [`FaultProxy::delay`] | each chunk of bytes through one proxy is held for a while, both ways | slow responses, late watch events |
//! | [`FaultProxy::stall`] | no byte passes through one proxy until healed; connections stay open | half-open connections: requests and watches hang without an error |
//! | [`FaultProxy::reset`] | every connection through one proxy gets a TCP RST | every request and watch of that client fails at once; new connections work |
//! | [`FaultProxy::cut`] | connections through one proxy are reset, new ones too, until healed | that client has lost the API server while those on other proxies keep it |
//! | [`ChaosClusterBuilder::compaction_interval`] | kube-apiserver's `--etcd-compaction-interval` (kube-apiserver's default 5 min) | compactions every few seconds, so a client that falls behind gets 410 Gone |
//!
//! [`FaultProxy::heal`] ends a proxy's delay, stall and cut.
//!
//! ```no_run
//! # async fn example() -> Result<(), String> {
//! use kube_test_cluster::faults::ChaosCluster;
//!
//! let mut cluster = ChaosCluster::builder()
//!     .compaction_interval(std::time::Duration::from_secs(5))
//!     .start()
//!     .await?;
//! let proxy = cluster.proxy().await;
//! let client = kube_client::Client::try_from(cluster.client_config_via(&proxy).await)
//!     .map_err(|e| e.to_string())?;
//! // ... run the code under test with `client` ...
//! proxy.cut(); // this client has lost the API server
//! proxy.heal();
//! cluster.restart().await?; // every client loses it for a few seconds
//! cluster.compact().await?; // older resourceVersions are gone
//! # drop(client);
//! # Ok(()) }
//! ```
//!
//! A cluster stops when it is dropped (its data directory is removed), or
//! at the latest when the process ends, as the shared cluster does.

mod proxy;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube_client::config::{KubeConfigOptions, Kubeconfig};

pub use proxy::{FaultProxy, ProxyState};

use crate::real::{self, process};

/// How long [`ChaosCluster::compact`] waits for etcd.
const COMPACT_LIMIT: Duration = Duration::from_secs(30);

/// The settings of a [`ChaosCluster`], from [`ChaosCluster::builder`].
#[derive(Debug, Clone)]
pub struct ChaosClusterBuilder {
    compaction_interval: Duration,
    watch_cache: bool,
}

impl Default for ChaosClusterBuilder {
    fn default() -> Self {
        ChaosClusterBuilder {
            compaction_interval: Duration::from_secs(300),
            watch_cache: true,
        }
    }
}

impl ChaosClusterBuilder {
    /// kube-apiserver's `--etcd-compaction-interval`: how often it compacts
    /// etcd's history (5 minutes by default, as in kube-apiserver; at
    /// least a second). A few seconds make resumed watches meet 410 Gone.
    #[must_use]
    pub fn compaction_interval(mut self, interval: Duration) -> Self {
        self.compaction_interval = interval.max(Duration::from_secs(1));
        self
    }

    /// kube-apiserver's `--watch-cache` (on by default, as in
    /// kube-apiserver). Off, every watch and list is served by etcd, so
    /// every watch resumed at a compacted resourceVersion gets 410 Gone.
    #[must_use]
    pub fn watch_cache(mut self, on: bool) -> Self {
        self.watch_cache = on;
        self
    }

    /// Builds the binary if needed (minutes, once; see the crate
    /// documentation) and starts the cluster: a few seconds.
    pub async fn start(self) -> Result<ChaosCluster, String> {
        blocking(move || ChaosCluster::start_blocking(self)).await
    }
}

/// A real cluster (kube-apiserver and etcd, one child process, as the
/// shared one) of a test's own, with faults the test calls: see the
/// [module documentation](self).
#[derive(Debug)]
pub struct ChaosCluster {
    options: ChaosClusterBuilder,
    binary: PathBuf,
    /// The data directory, kept across restarts.
    dir: PathBuf,
    log: PathBuf,
    /// The running child's id in the process registry.
    id: u64,
    pid: u32,
    server: String,
    port: u16,
    kubeconfig: PathBuf,
    restarts: u32,
}

impl ChaosCluster {
    /// The settings, to start one with.
    pub fn builder() -> ChaosClusterBuilder {
        ChaosClusterBuilder::default()
    }

    fn start_blocking(options: ChaosClusterBuilder) -> Result<ChaosCluster, String> {
        let binary = real::binary()?;
        let logs = real::cache_root().join("logs");
        let log = process::log_path(&logs, &format!("-chaos-{}", unique()))?;
        let dir = std::env::temp_dir().join(format!(
            "test-cluster-chaos-{}-{}",
            std::process::id(),
            unique()
        ));
        let mut cluster = ChaosCluster {
            options,
            binary,
            dir,
            log,
            id: u64::MAX,
            pid: 0,
            server: String::new(),
            port: 0,
            kubeconfig: PathBuf::new(),
            restarts: 0,
        };
        let run = process::start(&cluster.binary, &cluster.args(), &cluster.log)?;
        cluster.started(run)?;
        Ok(cluster)
    }

    /// The child's command line: the data directory, the port (0 at
    /// first, then the one it got, so restarts keep it) and the options.
    fn args(&self) -> Vec<String> {
        vec![
            "-data".to_string(),
            self.dir.display().to_string(),
            "-port".to_string(),
            self.port.to_string(),
            "-etcd-compaction-interval".to_string(),
            format!("{}ms", self.options.compaction_interval.as_millis()),
            format!("-watch-cache={}", self.options.watch_cache),
        ]
    }

    /// Takes in what a started child reported.
    fn started(&mut self, run: process::Started) -> Result<(), String> {
        let port = run
            .server
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("no port in the server URL {}", run.server))?;
        self.id = run.id;
        self.pid = run.pid;
        self.server = run.server;
        self.port = port;
        self.kubeconfig = run.kubeconfig;
        Ok(())
    }

    /// The API server's URL, `https://127.0.0.1:PORT`: the same across
    /// restarts.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The API server's address, for [`FaultProxy::start`].
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The kubeconfig it wrote (server, CA, admin token): the same across
    /// restarts.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The cluster's process id (it changes with each restart).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The data directory (etcd's data, credentials, kubeconfig): kept
    /// across restarts, removed when the cluster stops (dropped, or the
    /// process ends).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster's log (its standard error, every run's), under
    /// `target/test-cluster/logs/`.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// How many times it was restarted.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// A client configuration straight to the API server, read from the
    /// kubeconfig as any kube-client program would.
    ///
    /// # Panics
    ///
    /// If the kubeconfig the cluster wrote cannot be read.
    pub async fn client_config(&self) -> kube_client::Config {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.kubeconfig.display()));
        let mut config =
            kube_client::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap_or_else(|e| panic!("the chaos cluster's kubeconfig: {e}"));
        config.connect_timeout = Some(Duration::from_secs(5));
        config
    }

    /// A client configuration that reaches the API server through `proxy`
    /// (which must forward to [`addr`](ChaosCluster::addr)); TLS is
    /// verified as usual, since the serving certificate names 127.0.0.1.
    ///
    /// # Panics
    ///
    /// As [`client_config`](ChaosCluster::client_config).
    pub async fn client_config_via(&self, proxy: &FaultProxy) -> kube_client::Config {
        let mut config = self.client_config().await;
        config.cluster_url = format!("https://{}", proxy.addr())
            .parse()
            .expect("a proxy's URL parses");
        config
    }

    /// A new [`FaultProxy`] in front of the API server, on the calling
    /// tokio runtime.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    pub async fn proxy(&self) -> FaultProxy {
        FaultProxy::start(self.addr())
            .await
            .unwrap_or_else(|e| panic!("starting a proxy: {e}"))
    }

    /// Kills the cluster's process (SIGKILL: a crash) and starts it again
    /// on the same data directory and port; returns once the API server is
    /// ready again, with how long it was down (from the kill to ready).
    /// What was written before the kill is kept: etcd runs without fsync,
    /// but only the process dies, not the machine, so its writes are in
    /// the page cache.
    pub async fn restart(&mut self) -> Result<Duration, String> {
        let id = self.id;
        let (binary, args, log) = (self.binary.clone(), self.args(), self.log.clone());
        let started = Instant::now();
        let run = blocking(move || {
            process::kill(id)?;
            process::start(&binary, &args, &log)
        })
        .await?;
        self.started(run)?;
        self.restarts += 1;
        Ok(started.elapsed())
    }

    /// Compacts etcd's history up to its current revision now; returns
    /// that revision. Afterwards a watch or list that reaches etcd at an
    /// older resourceVersion gets 410 Gone.
    pub async fn compact(&self) -> Result<u64, String> {
        let id = self.id;
        let answer = blocking(move || process::command(id, "compact", COMPACT_LIMIT)).await?;
        let value: serde_json::Value = serde_json::from_str(&answer)
            .map_err(|e| format!("the cluster's answer {answer:?}: {e}"))?;
        match (value["compacted"].as_u64(), value["error"].as_str()) {
            (Some(revision), _) => Ok(revision),
            (None, Some(error)) => Err(format!("compaction failed: {error}")),
            _ => Err(format!("the cluster's answer to compact: {answer}")),
        }
    }
}

impl Drop for ChaosCluster {
    fn drop(&mut self) {
        // The child removes the directory when it stops in order.
        process::stop_one(self.id);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A number unique in this process, for names.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Runs `f` off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(value) => value,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("a blocking task: {e}"),
        },
    }
}
