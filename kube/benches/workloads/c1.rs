//! C1 controller under an initial-list backlog (shared/bench/WORKLOADS.md):
//! this crate's `Controller` beside kube-runtime's, on one API server, with
//! the same reconcile.
//!
//! The server holds N ConfigMaps (10,000; N/20 in quick mode). A controller
//! with concurrency 4 whose reconcile sleeps 1 ms starts; 100 ms later one
//! ConfigMap (the last created, so the last of the list) is changed.
//! Figures: the changed object's latency from the API write to the start of
//! its reconcile; the time from the start until every object was reconciled
//! once; and the GET requests made while reconciling.
//!
//! Two sittings of the same code, one per [`Server`]: `C1` on the in-process
//! local API server, which counts requests itself, and `C1-real` on the real
//! kube-apiserver and etcd of `kube-test-cluster`, whose GETs are read from
//! its own `apiserver_request_total` metric. Without Go, or if the real
//! cluster cannot start, C1-real prints why and the rest of the benchmark
//! runs on.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Patch, PatchParams, PostParams};
use kube_client::{Api, Client};
use kube_local_apiserver::{LocalApiServer, Verb};
use kube_runtime::controller::Action;
use kube_runtime::watcher;
use serde_json::json;
use tokio::time::Instant;

use crate::report::Report;
use crate::settings::{Config, runtime};

const NAMESPACE: &str = "c1";
const CONCURRENCY: usize = 4;
const WORK: Duration = Duration::from_millis(1);
const CHANGE_AFTER: Duration = Duration::from_millis(100);
/// Creates in flight while seeding: enough to keep a real API server busy.
const SEED_CONCURRENCY: usize = 32;
/// The two implementations, taking turns run by run.
const IMPS: [&str; 2] = ["tokio-workqueue", "kube-runtime"];

/// The API server a sitting runs against.
enum Server {
    /// The in-process local API server (`C1`): it counts requests itself.
    Local(LocalApiServer),
    /// The real kube-apiserver of `kube-test-cluster` (`C1-real`), with a
    /// client made in the sitting's runtime.
    Real(Client),
}

impl Server {
    fn client(&self) -> Client {
        match self {
            Server::Local(server) => server.client(),
            Server::Real(client) => client.clone(),
        }
    }

    /// Single-object GETs of ConfigMaps the server has answered so far.
    async fn configmap_gets(&self) -> u64 {
        match self {
            Server::Local(server) => server.requests().of(Verb::Get, "configmaps"),
            Server::Real(client) => {
                let text = client
                    .request_text(
                        http::Request::get("/metrics")
                            .body(Vec::new())
                            .expect("a GET /metrics request"),
                    )
                    .await
                    .expect("kube-apiserver's /metrics");
                configmap_gets_in(&text).unwrap_or_else(|e| panic!("C1-real: {e}"))
            }
        }
    }
}

/// The sum of kube-apiserver's `apiserver_request_total` series with
/// `verb="GET"` and `resource="configmaps"` in a `/metrics` text (verb GET is
/// a single object: lists and watches are LIST and WATCH). An error when no
/// ConfigMap series is there at all (the seeding's creates make some), so
/// that a renamed metric or label cannot pass for zero GETs.
fn configmap_gets_in(metrics: &str) -> Result<u64, String> {
    const METRIC: &str = "apiserver_request_total{";
    let has = |labels: &str, label: &str| {
        labels.starts_with(label) || labels.contains(&format!(",{label}"))
    };
    let mut configmap_series = 0;
    let mut gets = 0.0;
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(METRIC) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            return Err(format!("unreadable /metrics line {line:?}"));
        };
        if !has(labels, r#"resource="configmaps""#) {
            continue;
        }
        configmap_series += 1;
        if has(labels, r#"verb="GET""#) {
            let value = value.split_whitespace().next().unwrap_or_default();
            gets += value
                .parse::<f64>()
                .map_err(|e| format!("the value of /metrics line {line:?}: {e}"))?;
        }
    }
    if configmap_series == 0 {
        return Err(
            "kube-apiserver's /metrics has no apiserver_request_total series for configmaps".into(),
        );
    }
    Ok(gets as u64)
}

/// What one reconcile run observed.
#[derive(Default)]
struct Seen {
    /// Names reconciled at least once.
    names: HashSet<String>,
    /// When the changed object's reconcile started with the new content.
    changed_started: Option<Instant>,
    /// When the last distinct object's first reconcile started.
    all_done: Option<Instant>,
}

struct Ctx {
    seen: Mutex<Seen>,
    n: usize,
    marker: String,
}

#[derive(Debug)]
struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}

impl std::error::Error for Never {}

/// The reconcile both controllers run: note the start, sleep 1 ms.
async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Never> {
    let now = Instant::now();
    {
        let mut seen = ctx.seen.lock().unwrap();
        let is_changed = cm
            .data
            .as_ref()
            .and_then(|d| d.get("v"))
            .is_some_and(|v| *v == ctx.marker);
        if is_changed && seen.changed_started.is_none() {
            seen.changed_started = Some(now);
        }
        let name = cm.metadata.name.clone().unwrap_or_default();
        if seen.names.insert(name) && seen.names.len() == ctx.n {
            seen.all_done = Some(now);
        }
    }
    tokio::time::sleep(WORK).await;
    Ok(Action::await_change())
}

fn error_policy(_: Arc<ConfigMap>, _: &Never, _: Arc<Ctx>) -> Action {
    Action::await_change()
}

fn name(i: usize) -> String {
    format!("obj-{i}")
}

/// Makes the namespace and fills it with `n` ConfigMaps,
/// [`SEED_CONCURRENCY`] creates at a time.
async fn seed(client: Client, n: usize) {
    let mut ns = k8s_openapi::api::core::v1::Namespace::default();
    ns.metadata.name = Some(NAMESPACE.into());
    Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create the namespace");
    let api: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
    let api = &api;
    futures::stream::iter(0..n)
        .for_each_concurrent(SEED_CONCURRENCY, |i| {
            let api = api.clone();
            async move {
                let mut cm = ConfigMap::default();
                cm.metadata.name = Some(name(i));
                cm.data = Some([("v".to_string(), "0".to_string())].into());
                api.create(&PostParams::default(), &cm)
                    .await
                    .expect("seed a ConfigMap");
            }
        })
        .await;
}

/// One run of one implementation: (changed latency ms, all reconciled ms,
/// GETs while reconciling).
async fn run_once(
    server: &Server,
    workload: &str,
    imp: &str,
    n: usize,
    run: usize,
) -> (f64, f64, f64) {
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
    let ctx = Arc::new(Ctx {
        seen: Mutex::new(Seen::default()),
        n,
        marker: format!("{imp}-{run}"),
    });
    let before = server.configmap_gets().await;
    let start = Instant::now();
    let stream = match imp {
        "tokio-workqueue" => {
            tokio_workqueue_kube::Controller::new(api.clone(), watcher::Config::default())
                .concurrency(CONCURRENCY)
                .run(reconcile, error_policy, ctx.clone())
                .map(|r| r.is_ok())
                .boxed()
        }
        _ => kube_runtime::Controller::new(api.clone(), watcher::Config::default())
            .with_config(
                kube_runtime::controller::Config::default().concurrency(CONCURRENCY as u16),
            )
            .run(reconcile, error_policy, ctx.clone())
            .map(|r| r.is_ok())
            .boxed(),
    };
    let driver = tokio::spawn(stream.for_each(|_| async {}));
    tokio::time::sleep(CHANGE_AFTER).await;
    let changed = name(n - 1);
    let written = Instant::now();
    api.patch(
        &changed,
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "v": ctx.marker } })),
    )
    .await
    .expect("change one ConfigMap");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        {
            let seen = ctx.seen.lock().unwrap();
            if seen.all_done.is_some() && seen.changed_started.is_some() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{workload} {imp}: not every object was reconciled in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    driver.abort();
    let _ = driver.await;
    let gets = server.configmap_gets().await - before;
    let seen = ctx.seen.lock().unwrap();
    let latency = seen
        .changed_started
        .expect("checked")
        .saturating_duration_since(written);
    let all = seen
        .all_done
        .expect("checked")
        .saturating_duration_since(start);
    (
        latency.as_secs_f64() * 1e3,
        all.as_secs_f64() * 1e3,
        gets as f64,
    )
}

/// C1 on the local API server, then C1-real on the real kube-apiserver.
pub fn c1(cfg: &Config, report: &mut Report) {
    if !IMPS.iter().any(|i| cfg.runs_impl(i)) {
        return;
    }
    if cfg.wants("C1") {
        let rt = runtime();
        rt.block_on(async {
            let server = Server::Local(LocalApiServer::start().await);
            sitting(cfg, report, "C1", &server).await;
        });
    }
    if cfg.wants("C1-real") {
        // Blocking: a first build of the cluster takes minutes (once).
        eprintln!("starting the real test cluster for C1-real...");
        if let Err(why) = kube_test_cluster::try_real_cluster() {
            eprintln!("C1-real could not run: {why}");
            return;
        }
        let rt = runtime();
        rt.block_on(async {
            let client = kube_test_cluster::client(kube_test_cluster::Backend::Real).await;
            sitting(cfg, report, "C1-real", &Server::Real(client)).await;
        });
    }
}

/// One workload's sitting on `server`: seed once, then a warm-up and the
/// timed runs, both implementations taking turns run by run.
async fn sitting(cfg: &Config, report: &mut Report, workload: &str, server: &Server) {
    eprintln!("running {workload}...");
    let n = cfg.n(10_000);
    let seeding = Instant::now();
    seed(server.client(), n).await;
    if cfg.verbose {
        eprintln!(
            "  {workload}: seeded {n} ConfigMaps in {:.1} s",
            seeding.elapsed().as_secs_f64()
        );
    }
    for run in 0..=cfg.runs {
        for imp in IMPS {
            if !cfg.runs_impl(imp) {
                continue;
            }
            let (latency, all, gets) = run_once(server, workload, imp, n, run).await;
            if cfg.verbose {
                eprintln!(
                    "  {workload} {imp} run {run}: changed {latency:.2} ms, all {all:.1} ms, {gets} GETs"
                );
            }
            if run > 0 {
                report.push(imp, workload, "changed latency ms", latency);
                report.push(imp, workload, "all reconciled ms", all);
                report.push(imp, workload, "GETs while reconciling", gets);
            }
        }
    }
}

/// The target verdicts of C1 and C1-real.
pub fn verdicts(report: &Report, lines: &mut Vec<(String, Option<bool>)>) {
    for workload in ["C1", "C1-real"] {
        workload_verdicts(report, workload, lines);
    }
}

fn workload_verdicts(report: &Report, workload: &str, lines: &mut Vec<(String, Option<bool>)>) {
    let m = |imp: &str, f: &str| report.median(imp, workload, f);
    let [ours, theirs] = IMPS;
    if let (Some(a), Some(b)) = (
        m(ours, "changed latency ms"),
        m(theirs, "changed latency ms"),
    ) {
        let r = a / b;
        lines.push((
            format!("{workload} changed object's latency vs kube-runtime: {r:.4}x ({a:.2} vs {b:.2} ms; target <= 0.05x)"),
            Some(r <= 0.05),
        ));
    }
    if let (Some(a), Some(b)) = (m(ours, "all reconciled ms"), m(theirs, "all reconciled ms")) {
        let r = a / b;
        lines.push((
            format!(
                "{workload} all reconciled vs kube-runtime: {r:.3}x ({a:.0} vs {b:.0} ms; target <= 1.1x)"
            ),
            Some(r <= 1.1),
        ));
    }
    if let Some(g) = report
        .rows
        .iter()
        .find(|r| r.imp == ours && r.workload == workload && r.figure == "GETs while reconciling")
        .map(|r| r.max())
    {
        lines.push((
            format!("{workload} GETs while reconciling: {g:.0} at most (target 0)"),
            Some(g == 0.0),
        ));
    }
}
