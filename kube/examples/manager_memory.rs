//! Three controllers over the same ConfigMaps: resident memory and watch
//! connections with a `Manager` (one shared cache) against three
//! independent `Controller`s (three caches), measured in the same run.
//!
//! The parent starts the local API server in its own process and fills it
//! with ConfigMaps of about 1 KiB; each variant then runs in a child
//! process of its own (so its resident memory is its alone), which connects
//! over HTTP, waits until every controller reconciled every object once,
//! and reports its resident memory beside its baseline (the same process
//! before any controller started). The parent reads the watches and lists
//! each child opened from the server's request counts.
//!
//! Each child also counts the bytes its allocations hold (a counting global
//! allocator over the system one): resident memory is what the issue asks
//! about, and includes what the allocator keeps after the lists' and the
//! queues' transient allocations are freed; live bytes show what the
//! process still holds, and peak live bytes the most it held at once (the
//! allocator gives little back below its peak, so resident memory follows
//! the peak: every listed key queued in every controller at once, beside
//! the cache).
//!
//! ```text
//! cargo run --release -p tokio-workqueue-kube --example manager_memory            # 10,000 ConfigMaps
//! cargo run --release -p tokio-workqueue-kube --example manager_memory -- 2000    # fewer
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::{Client, Config};
use kube_local_apiserver::{LocalApiServer, Verb};
use kube_runtime::controller::Action;
use kube_runtime::watcher;
use tokio_workqueue_kube::{Controller, Manager};

const CONTROLLERS: usize = 3;

/// The system allocator, counting the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
/// The most `LIVE` has been.
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; the counter
// only adds and subtracts the sizes asked for.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            let live = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(live, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Debug)]
struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}

impl std::error::Error for Never {}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

async fn child(variant: &str, url: &str, objects: usize) {
    let config = Config::new(url.parse().expect("server URL"));
    let client = Client::try_from(config).expect("client");
    let baseline = rss_bytes();
    let live_before = LIVE.load(Ordering::Relaxed);
    let seen: Arc<Vec<AtomicUsize>> =
        Arc::new((0..CONTROLLERS).map(|_| AtomicUsize::new(0)).collect());
    let reconcile = |i: usize| {
        move |_: Arc<ConfigMap>, seen: Arc<Vec<AtomicUsize>>| async move {
            seen[i].fetch_add(1, Ordering::Relaxed);
            Ok::<_, Never>(Action::await_change())
        }
    };
    let policy = |_: Arc<ConfigMap>, _: &Never, _: Arc<Vec<AtomicUsize>>| Action::await_change();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = futures::future::FutureExt::shared(async move {
        let _ = stopped.await;
    });
    let task = match variant {
        "manager" => {
            let mut manager = Manager::new(client);
            for i in 0..CONTROLLERS {
                let results = manager
                    .controller_for::<ConfigMap>(watcher::Config::default())
                    .run(reconcile(i), policy, seen.clone());
                manager.add(&format!("c{i}"), results).unwrap();
            }
            manager.shutdown_on(stopped.clone());
            tokio::spawn(async move {
                manager.run().await.unwrap();
            })
        }
        _ => {
            let mut all = Vec::new();
            for i in 0..CONTROLLERS {
                let results = Controller::new(
                    Api::<ConfigMap>::all(client.clone()),
                    watcher::Config::default(),
                )
                .graceful_shutdown_on(stopped.clone())
                .run(reconcile(i), policy, seen.clone());
                all.push(tokio::spawn(results.for_each(|_| async {})));
            }
            tokio::spawn(async move {
                for task in all {
                    let _ = task.await;
                }
            })
        }
    };
    while seen.iter().any(|n| n.load(Ordering::Relaxed) < objects) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the allocator settle what the lists left behind.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let synced = rss_bytes();
    let live = LIVE.load(Ordering::Relaxed).saturating_sub(live_before);
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(live_before);
    println!("{baseline} {synced} {live} {peak}");
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--child") {
        let objects = args[at + 3].parse()?;
        child(&args[at + 1], &args[at + 2], objects).await;
        return Ok(());
    }
    let objects: usize = args.get(1).map_or(Ok(10_000), |n| n.parse())?;
    let server = LocalApiServer::start().await;
    let url = server.client_config().cluster_url.to_string();
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let filler = "x".repeat(1000);
    for i in 0..objects {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("cm-{i}"));
        cm.data = Some(BTreeMap::from([("data".into(), filler.clone())]));
        api.create(&PostParams::default(), &cm).await?;
    }
    println!(
        "{CONTROLLERS} controllers over {objects} ConfigMaps of about 1 KiB, each variant in its own process"
    );
    println!(
        "variant       watches  lists  baseline MiB  synced MiB  growth MiB  live MiB  peak live MiB"
    );
    let mut growth = Vec::new();
    for variant in ["independent", "manager", "independent", "manager"] {
        let before = server.requests();
        let exe = std::env::current_exe()?;
        let url = url.clone();
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(exe)
                .args(["--child", variant, &url, &objects.to_string()])
                .output()
        })
        .await??;
        if !out.status.success() {
            return Err(format!("{variant}: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        let text = String::from_utf8(out.stdout)?;
        let mut figures = text
            .split_whitespace()
            .map(|n| n.parse::<f64>().unwrap_or(0.0));
        let mut next = || figures.next().unwrap_or(0.0);
        let (baseline, synced, live, peak) = (next(), next(), next(), next());
        let requests = server.requests().since(&before);
        let mib = |b: f64| b / (1024.0 * 1024.0);
        println!(
            "{variant:<12} {:>8} {:>6} {:>13.1} {:>11.1} {:>11.1} {:>9.1} {:>14.1}",
            requests.of(Verb::Watch, "configmaps"),
            requests.of(Verb::List, "configmaps"),
            mib(baseline),
            mib(synced),
            mib(synced - baseline),
            mib(live),
            mib(peak)
        );
        growth.push((variant, synced - baseline, live));
    }
    let of = |name: &str, figure: fn(&(&str, f64, f64)) -> f64| {
        let v: Vec<f64> = growth.iter().filter(|g| g.0 == name).map(figure).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    println!(
        "manager / independent memory growth: {:.2}x (target about 1/3); live bytes: {:.2}x",
        of("manager", |g| g.1) / of("independent", |g| g.1),
        of("manager", |g| g.2) / of("independent", |g| g.2)
    );
    Ok(())
}
