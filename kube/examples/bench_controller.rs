//! The Rust controllers of the controller benchmark
//! (`kube/benches/controllers.rs`), one process each, so that the benchmark
//! reads each one's resident memory and CPU time from /proc.
//!
//! ```text
//! bench_controller --impl ours|kube-runtime --kubeconfig PATH --namespace NS [--strip-managed-fields]
//!     [--shards GROUP --identity ID [--split-cache]]
//! ```
//!
//! One controller for the ConfigMaps of one namespace, four reconciles at
//! once; the reconcile reads the object from the cache (the controller's
//! reflector store hands it over: no GET), prints
//! `START ns/name resourceVersion unix_nanos` (the time its reconcile
//! started) and sleeps 1 ms (see [`work`]). `SYNCED unix_nanos` is printed once the store
//! has its first list. The process exits when its standard input closes, so
//! it never outlives the benchmark.
//!
//! * `ours`: this crate's `Controller` (`--strip-managed-fields`:
//!   [`Controller::strip_managed_fields`](tokio_workqueue_kube::Controller::strip_managed_fields));
//! * `kube-runtime`: kube-runtime's `Controller` (`--strip-managed-fields`:
//!   its watcher stream with `.modify(|o| o.managed_fields_mut().clear())`,
//!   reflected and handed to `Controller::for_stream`).
//!
//! With `--shards` (ours only, for C5), the controller is one replica of
//! shard group `GROUP` as `ID` (Leases in the namespace; lease 3 s, renew
//! deadline 2 s, retry 0.5 s), with `--split-cache` a split cache
//! ([`ShardConfig::split_cache`](tokio_workqueue_kube::shard::ShardConfig::split_cache),
//! the default label rate), and it prints `HELD n` (the objects in its
//! store) every 250 ms.
//!
//! The controller-runtime peer is `kube/benches/go-controller`.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_client::{Api, Client, Config};
use kube_runtime::WatchStreamExt;
use kube_runtime::controller::Action;
use kube_runtime::reflector::{self, Store, reflector};
use kube_runtime::watcher::{self, watcher};
use tokio_workqueue_kube::shard::{LabelRate, ShardConfig, Shards};

const CONCURRENCY: usize = 4;
const WORK: Duration = Duration::from_millis(1);

#[derive(Debug)]
struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}

impl std::error::Error for Never {}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

/// The reconcile of every implementation: note the start, sleep 1 ms.
async fn reconcile(cm: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, Never> {
    let start = unix_nanos();
    // One write per line, as the Go peer does (stdout is line-buffered).
    let _ = writeln!(
        std::io::stdout().lock(),
        "START {}/{} {} {start}",
        cm.namespace().unwrap_or_default(),
        cm.name_any(),
        cm.resource_version().unwrap_or_default(),
    );
    work().await;
    Ok(Action::await_change())
}

/// The reconcile's 1 ms of work: a sleep that lasts 1 ms, as Go's
/// `time.Sleep(time.Millisecond)` in the controller-runtime peer does.
///
/// `tokio::time::sleep` keeps a wheel of 1 ms ticks and ends a sleep at
/// the first tick after its deadline, so `sleep(1 ms)` lasts 1 to 2 ms
/// (2.2 ms per reconcile measured in C4, against Go's 1.2 ms): the
/// workload would ask twice the work of the Rust controllers. So the
/// reconcile waits on a Linux timerfd instead (microsecond resolution, one
/// `timerfd_settime` and one `read` per sleep), registered with tokio's
/// reactor. `BENCH_SLEEP=tokio` keeps `tokio::time::sleep`, to measure
/// what a plain tokio reconcile would see.
async fn work() {
    static TOKIO: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *TOKIO.get_or_init(|| std::env::var("BENCH_SLEEP").as_deref() == Ok("tokio")) {
        tokio::time::sleep(WORK).await;
    } else {
        precise::sleep(WORK).await;
    }
}

/// A sleep on a timerfd (see [`work`]).
mod precise {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::sync::Mutex;
    use std::time::Duration;

    use tokio::io::unix::AsyncFd;

    struct TimerFd(OwnedFd);

    impl AsRawFd for TimerFd {
        fn as_raw_fd(&self) -> RawFd {
            self.0.as_raw_fd()
        }
    }

    /// Timers not in use: one per reconcile running at once, made on
    /// first need. A sleep dropped early drops its timer instead.
    static IDLE: Mutex<Vec<AsyncFd<TimerFd>>> = Mutex::new(Vec::new());

    fn timer() -> AsyncFd<TimerFd> {
        // SAFETY: timerfd_create takes no pointers; a negative answer is
        // checked before the descriptor is owned.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        assert!(
            fd >= 0,
            "timerfd_create: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` was just created and nothing else owns it.
        let fd = TimerFd(unsafe { OwnedFd::from_raw_fd(fd) });
        // SAFETY: `TimerFd` owns its descriptor, which stays open and the
        // same until the `AsyncFd` drops it.
        unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
            .expect("register a timerfd")
    }

    pub(super) async fn sleep(d: Duration) {
        let timer = IDLE.lock().unwrap().pop().unwrap_or_else(timer);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: a valid descriptor and a pointer to a live itimerspec.
        let set =
            unsafe { libc::timerfd_settime(timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        assert_eq!(
            set,
            0,
            "timerfd_settime: {}",
            std::io::Error::last_os_error()
        );
        loop {
            let mut ready = timer.readable().await.expect("a timerfd's readiness");
            let mut expirations = [0u8; 8];
            // A read that would block clears the readiness and waits again.
            let read = ready.try_io(|fd| {
                // SAFETY: reads at most 8 bytes into an 8-byte buffer.
                let n = unsafe {
                    libc::read(
                        fd.as_raw_fd(),
                        expirations.as_mut_ptr().cast(),
                        expirations.len(),
                    )
                };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            if let Ok(result) = read {
                result.expect("read a timerfd");
                break;
            }
        }
        IDLE.lock().unwrap().push(timer);
    }
}

fn error_policy(_: Arc<ConfigMap>, _: &Never, _: Arc<()>) -> Action {
    Action::await_change()
}

struct Args {
    imp: String,
    kubeconfig: String,
    namespace: String,
    strip: bool,
    /// `--shards GROUP --identity ID`, and whether the cache is split.
    shards: Option<(String, String, bool)>,
}

fn args() -> Args {
    let usage = "usage: bench_controller --impl ours|kube-runtime --kubeconfig PATH --namespace NS [--strip-managed-fields] [--shards GROUP --identity ID [--split-cache]]";
    let mut imp = None;
    let mut kubeconfig = None;
    let mut namespace = None;
    let mut strip = false;
    let (mut group, mut identity, mut split) = (None, None, false);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--impl" => imp = it.next(),
            "--kubeconfig" => kubeconfig = it.next(),
            "--namespace" => namespace = it.next(),
            "--strip-managed-fields" => strip = true,
            "--shards" => group = it.next(),
            "--identity" => identity = it.next(),
            "--split-cache" => split = true,
            _ => {
                eprintln!("{usage}");
                std::process::exit(2);
            }
        }
    }
    let shards = match (group, identity) {
        (Some(group), Some(identity)) => Some((group, identity, split)),
        (None, None) if !split => None,
        _ => {
            eprintln!("--shards and --identity go together (--split-cache with them)\n{usage}");
            std::process::exit(2);
        }
    };
    match (imp, kubeconfig, namespace) {
        (Some(imp), Some(kubeconfig), Some(namespace))
            if imp == "ours" || (imp == "kube-runtime" && shards.is_none()) =>
        {
            Args {
                imp,
                kubeconfig,
                namespace,
                strip,
                shards,
            }
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}

/// Prints `HELD n`, the objects in `store`, every 250 ms.
fn announce_held(store: Store<ConfigMap>) {
    tokio::spawn(async move {
        loop {
            println!("HELD {}", store.state().len());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
}

/// Prints `SYNCED` once `store` has its first list. (A
/// `wait_until_ready` future that is pending when the store turns ready is
/// not always woken with kube-runtime 5, so each check is a fresh future.)
fn announce_sync(store: Store<ConfigMap>) {
    tokio::spawn(async move {
        loop {
            if let Ok(ready) = tokio::time::timeout(Duration::ZERO, store.wait_until_ready()).await
            {
                if ready.is_ok() {
                    println!("SYNCED {}", unix_nanos());
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
}

fn main() {
    // The runtime: tokio's multi-thread one (what `#[tokio::main]` gives),
    // or with BENCH_CONTROLLER_RUNTIME=current-thread one thread.
    let mut runtime = match std::env::var("BENCH_CONTROLLER_RUNTIME").as_deref() {
        Ok("current-thread") => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = runtime.enable_all().build().expect("a tokio runtime");
    runtime.block_on(run());
}

async fn run() {
    let args = args();
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig).expect("read the kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a client configuration from the kubeconfig");
    let client = Client::try_from(config).expect("a client");
    let shard_client = client.clone();
    let api: Api<ConfigMap> = Api::namespaced(client, &args.namespace);
    let wc = watcher::Config::default();
    // Stop when the benchmark closes our standard input (or goes away).
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        std::process::exit(0);
    });

    let results = match (args.imp.as_str(), args.strip) {
        ("ours", strip) => {
            let mut controller =
                tokio_workqueue_kube::Controller::new(api, wc).concurrency(CONCURRENCY);
            if strip {
                controller = controller.strip_managed_fields();
            }
            if let Some((group, identity, split)) = &args.shards {
                let mut config = ShardConfig::new(group, &args.namespace, identity)
                    .with_lease_duration(Duration::from_secs(3))
                    .with_renew_deadline(Duration::from_secs(2))
                    .with_retry_period(Duration::from_millis(500));
                if *split {
                    config = config.split_cache(LabelRate::DEFAULT);
                }
                controller = controller.shards(Shards::new(shard_client, config));
                announce_held(controller.store());
            }
            announce_sync(controller.store());
            controller
                .run(reconcile, error_policy, Arc::new(()))
                .map(|r| {
                    if let Err(e) = r {
                        eprintln!("bench_controller: {e}");
                    }
                })
                .boxed()
        }
        (_, false) => {
            let controller = kube_runtime::Controller::new(api, wc).with_config(
                kube_runtime::controller::Config::default().concurrency(CONCURRENCY as u16),
            );
            announce_sync(controller.store());
            controller
                .run(reconcile, error_policy, Arc::new(()))
                .map(|r| {
                    if let Err(e) = r {
                        eprintln!("bench_controller: {e}");
                    }
                })
                .boxed()
        }
        (_, true) => {
            let (reader, writer) = reflector::store();
            let stream = reflector(
                writer,
                watcher(api, wc)
                    .default_backoff()
                    .modify(|o| o.managed_fields_mut().clear()),
            )
            .applied_objects();
            let controller = kube_runtime::Controller::for_stream(stream, reader).with_config(
                kube_runtime::controller::Config::default().concurrency(CONCURRENCY as u16),
            );
            announce_sync(controller.store());
            controller
                .run(reconcile, error_policy, Arc::new(()))
                .map(|r| {
                    if let Err(e) = r {
                        eprintln!("bench_controller: {e}");
                    }
                })
                .boxed()
        }
    };
    results.for_each(|_| async {}).await;
}
