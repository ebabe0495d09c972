//! C1 controller under an initial-list backlog (shared/bench/WORKLOADS.md):
//! this crate's `Controller` beside kube-runtime's, on one local API server,
//! with the same reconcile.
//!
//! The server holds N ConfigMaps (10,000; N/20 in quick mode). A controller
//! with concurrency 4 whose reconcile sleeps 1 ms starts; 100 ms later one
//! ConfigMap (the last created, so the last of the list) is changed.
//! Figures: the changed object's latency from the API write to the start of
//! its reconcile; the time from the start until every object was reconciled
//! once; and the GET requests made while reconciling.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Api;
use kube_client::api::{Patch, PatchParams, PostParams};
use kube_local_apiserver::{LocalApiServer, Verb};
use kube_runtime::controller::Action;
use kube_runtime::watcher;
use serde_json::json;
use tokio::time::Instant;

use super::{Config, Report};

const NAMESPACE: &str = "c1";
const CONCURRENCY: usize = 4;
const WORK: Duration = Duration::from_millis(1);
const CHANGE_AFTER: Duration = Duration::from_millis(100);

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

/// Makes the namespace and fills it with `n` ConfigMaps, 16 creates at a
/// time.
async fn seed(client: kube_client::Client, n: usize) {
    let mut ns = k8s_openapi::api::core::v1::Namespace::default();
    ns.metadata.name = Some(NAMESPACE.into());
    Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create the namespace");
    let api: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
    let api = &api;
    futures::stream::iter(0..n)
        .for_each_concurrent(16, |i| {
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
async fn run_once(server: &LocalApiServer, imp: &str, n: usize, run: usize) -> (f64, f64, f64) {
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
    let ctx = Arc::new(Ctx {
        seen: Mutex::new(Seen::default()),
        n,
        marker: format!("{imp}-{run}"),
    });
    let before = server.requests();
    let start = Instant::now();
    let stream = match imp {
        "tokio-workqueue" => {
            tokio_workqueue::kube::Controller::new(api.clone(), watcher::Config::default())
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
            "C1 {imp}: not every object was reconciled in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    driver.abort();
    let _ = driver.await;
    let gets = server.requests().since(&before).of(Verb::Get, "configmaps");
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

/// C1, both implementations taking turns run by run.
pub(super) fn c1(cfg: &Config, report: &mut Report) {
    const WORKLOAD: &str = "C1";
    if !cfg.wants(WORKLOAD) {
        return;
    }
    let imps = ["tokio-workqueue", "kube-runtime"];
    if !imps.iter().any(|i| cfg.runs_impl(i)) {
        return;
    }
    eprintln!("running {WORKLOAD}...");
    let n = cfg.n(10_000);
    let rt = super::runtime();
    rt.block_on(async {
        let server = LocalApiServer::start().await;
        seed(server.client(), n).await;
        for run in 0..=cfg.runs {
            for imp in imps {
                if !cfg.runs_impl(imp) {
                    continue;
                }
                let (latency, all, gets) = run_once(&server, imp, n, run).await;
                if cfg.verbose {
                    eprintln!("  C1 {imp} run {run}: changed {latency:.2} ms, all {all:.1} ms, {gets} GETs");
                }
                if run > 0 {
                    report.push(imp, WORKLOAD, "changed latency ms", latency);
                    report.push(imp, WORKLOAD, "all reconciled ms", all);
                    report.push(imp, WORKLOAD, "GETs while reconciling", gets);
                }
            }
        }
    });
}

/// C1's target verdicts.
pub(super) fn verdicts(report: &Report, lines: &mut Vec<(String, Option<bool>)>) {
    let m = |imp: &str, f: &str| report.median(imp, "C1", f);
    let (ours, theirs) = ("tokio-workqueue", "kube-runtime");
    if let (Some(a), Some(b)) = (
        m(ours, "changed latency ms"),
        m(theirs, "changed latency ms"),
    ) {
        let r = a / b;
        lines.push((
            format!("C1 changed object's latency vs kube-runtime: {r:.4}x ({a:.2} vs {b:.2} ms; target <= 0.05x)"),
            Some(r <= 0.05),
        ));
    }
    if let (Some(a), Some(b)) = (m(ours, "all reconciled ms"), m(theirs, "all reconciled ms")) {
        let r = a / b;
        lines.push((
            format!(
                "C1 all reconciled vs kube-runtime: {r:.3}x ({a:.0} vs {b:.0} ms; target <= 1.1x)"
            ),
            Some(r <= 1.1),
        ));
    }
    if let Some(g) = report
        .rows
        .iter()
        .find(|r| r.imp == ours && r.workload == "C1" && r.figure == "GETs while reconciling")
        .map(|r| r.max())
    {
        lines.push((
            format!("C1 GETs while reconciling: {g:.0} at most (target 0)"),
            Some(g == 0.0),
        ));
    }
}
