//! The `Manager` on a local API server of its own (these tests read its
//! request counts and inject faults, which act on the whole server): one
//! watch per distinct source whatever the number of controllers, no
//! reconcile before every cache synced, the probes and the metrics
//! endpoint, a drain on shutdown, a dead controller on `/healthz`, and the
//! errors of bad input.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube_client::{Api, Client, ResourceExt};
use kube_local_apiserver::{Fault, LocalApiServer, Verb};
use kube_runtime::reflector::ObjectRef;
use kube_runtime::watcher;
use tokio::time::Instant;
use tokio_workqueue_kube::{Action, Manager, ManagerError};

use crate::manager_common::{Running, configmaps_owning_secrets, get, http};

const LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug)]
struct TestError;

impl std::fmt::Display for TestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("test error")
    }
}

impl std::error::Error for TestError {}

fn policy<K>(_: Arc<K>, _: &TestError, _: Arc<Ctx>) -> Action {
    Action::await_change()
}

/// Every reconcile's controller, key and start, written by the reconcile.
#[derive(Default)]
struct Ctx {
    starts: Mutex<Vec<(&'static str, String, Instant)>>,
}

impl Ctx {
    fn record(&self, controller: &'static str, name: String) {
        self.starts
            .lock()
            .unwrap()
            .push((controller, name, Instant::now()));
    }

    fn names(&self, controller: &str) -> Vec<String> {
        let mut names: Vec<_> = self
            .starts
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _, _)| *c == controller)
            .map(|(_, n, _)| n.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    fn first_start(&self) -> Option<Instant> {
        self.starts.lock().unwrap().iter().map(|s| s.2).min()
    }
}

async fn seed(client: &Client) {
    configmaps_owning_secrets(client, "default", 3).await;
}

/// Three controllers whose sources overlap: ConfigMaps owning Secrets,
/// Secrets, and Secrets again with ConfigMaps mapped onto them.
fn three_controllers(manager: &mut Manager, ctx: &Arc<Ctx>) {
    let client = manager.client();
    let configmaps = manager
        .controller_for::<ConfigMap>(watcher::Config::default())
        .owns(
            Api::<Secret>::all(client.clone()),
            watcher::Config::default(),
        )
        .run(
            |cm: Arc<ConfigMap>, ctx: Arc<Ctx>| async move {
                ctx.record("configmaps", cm.name_any());
                tokio::time::sleep(Duration::from_millis(1)).await;
                Ok::<_, TestError>(Action::await_change())
            },
            policy,
            ctx.clone(),
        );
    let secrets = manager
        .controller_for::<Secret>(watcher::Config::default())
        .run(
            |s: Arc<Secret>, ctx: Arc<Ctx>| async move {
                ctx.record("secrets", s.name_any());
                Ok::<_, TestError>(Action::await_change())
            },
            policy,
            ctx.clone(),
        );
    let mapped = manager
        .controller_for::<Secret>(watcher::Config::default())
        .watches(
            Api::<ConfigMap>::all(client),
            watcher::Config::default(),
            |cm: ConfigMap| {
                let name = cm.name_any().replace("cm-", "secret-");
                Some(ObjectRef::new(&name).within("default"))
            },
        )
        .run(
            |s: Arc<Secret>, ctx: Arc<Ctx>| async move {
                ctx.record("mapped", s.name_any());
                Ok::<_, TestError>(Action::await_change())
            },
            policy,
            ctx.clone(),
        );
    manager
        .add("configmaps", configmaps)
        .unwrap()
        .add("secrets", secrets)
        .unwrap()
        .add("mapped", mapped)
        .unwrap();
}

async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    http(addr, method, path, None).await
}

async fn until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_share_one_watch_per_source_and_reconcile_from_the_cache() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    seed(&client).await;
    let before = server.requests();

    let ctx = Arc::new(Ctx::default());
    let mut manager = Manager::new(client);
    three_controllers(&mut manager, &ctx);
    let run = Running::start(manager);

    until(|| {
        ctx.names("configmaps").len() == 3
            && ctx.names("secrets").len() == 3
            && ctx.names("mapped").len() == 3
    })
    .await;
    let requests = server.requests().since(&before);
    // Distinct sources: ConfigMaps (the first's main, the third's
    // `watches`), Secrets' metadata (the first's `owns`), Secrets (the
    // second's and the third's main). Alone, the three would open five.
    assert_eq!(requests.of(Verb::Watch, "configmaps"), 1, "{requests:?}");
    assert_eq!(requests.of(Verb::Watch, "secrets"), 2, "{requests:?}");
    assert_eq!(requests.of(Verb::List, "configmaps"), 1, "{requests:?}");
    assert_eq!(requests.of(Verb::List, "secrets"), 2, "{requests:?}");
    // Every reconcile read its object from the shared store.
    assert_eq!(requests.verb(Verb::Get), 0, "{requests:?}");

    run.stop(LIMIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_controller_reconciles_before_every_cache_synced() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    seed(&client).await;
    // The Secrets' lists are slow: the ConfigMaps' cache syncs long before.
    let slow = Duration::from_millis(600);
    server.inject(
        Fault::delay(slow)
            .verb(Verb::List)
            .resource("secrets")
            .times(2),
    );

    let ctx = Arc::new(Ctx::default());
    let mut manager = Manager::new(client);
    three_controllers(&mut manager, &ctx);
    manager.serve("127.0.0.1:0").unwrap();
    let addr = manager.local_addr().unwrap();
    let started = Instant::now();
    let run = Running::start(manager);

    // While the Secrets list, the manager is not ready.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("secrets"), "{body}");
    assert_eq!(get(addr, "/healthz").await.0, 200);

    until(|| ctx.names("configmaps").len() == 3).await;
    let first = ctx.first_start().unwrap();
    assert!(
        first - started >= slow,
        "a reconcile started {:?} after the start, before the slow cache synced",
        first - started
    );
    assert_eq!(get(addr, "/readyz").await.0, 200);

    run.stop(LIMIT).await;
}

/// A shared watch whose list keeps failing is retried after a backoff, not
/// in a loop: it runs on a task of its own, which the controllers' trigger
/// backoffs do not pace. (Unpaced, it re-listed as fast as the server
/// answered, and a client that failed without I/O spun in one poll, which
/// hung the runtime's shutdown.) kube-runtime's default backoff waits
/// 0.8 s, then 1.6 s: over 1.5 s, two or three lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_shared_watch_is_retried_after_a_backoff() {
    let server = LocalApiServer::start().await;
    server.inject(Fault::status(500).verb(Verb::List).resource("configmaps"));
    let ctx = Arc::new(Ctx::default());
    let mut manager = Manager::new(server.client());
    let results = manager
        .controller_for::<ConfigMap>(watcher::Config::default())
        .run(
            |cm: Arc<ConfigMap>, ctx: Arc<Ctx>| async move {
                ctx.record("configmaps", cm.name_any());
                Ok::<_, TestError>(Action::await_change())
            },
            policy,
            ctx.clone(),
        );
    manager.add("configmaps", results).unwrap();
    let run = Running::start(manager);
    // Real time: the backoff runs on tokio's clock, which is not paused.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let lists = server.requests().of(Verb::List, "configmaps");
    assert!(
        (1..=4).contains(&lists),
        "{lists} lists of a failing watch in 1.5 s"
    );
    run.stop(LIMIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_every_controller_and_stops_the_endpoint_last() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    seed(&client).await;
    let ctx = Arc::new(Ctx::default());
    let mut manager = Manager::new(client);
    // Slow reconciles, one at a time: keys are still queued at shutdown.
    let slow = manager
        .controller_for::<ConfigMap>(watcher::Config::default())
        .concurrency(1)
        .run(
            |cm: Arc<ConfigMap>, ctx: Arc<Ctx>| async move {
                ctx.record("slow", cm.name_any());
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, TestError>(Action::await_change())
            },
            policy,
            ctx.clone(),
        );
    manager.add("slow", slow).unwrap();
    manager.serve("127.0.0.1:0").unwrap();
    let addr = manager.local_addr().unwrap();
    let run = Running::start(manager);
    until(|| !ctx.names("slow").is_empty()).await;
    run.stop(LIMIT).await;
    // Drained: every queued key was reconciled before `run` returned.
    assert_eq!(ctx.names("slow"), ["cm-0", "cm-1", "cm-2"]);
    // And the endpoint is closed.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_ends_turns_healthz_red_and_the_others_go_on() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    seed(&client).await;
    let ctx = Arc::new(Ctx::default());
    let mut manager = Manager::new(client);
    three_controllers(&mut manager, &ctx);
    manager
        .add(
            "broken",
            futures::stream::empty::<Result<(), std::io::Error>>(),
        )
        .unwrap();
    manager.serve("127.0.0.1:0").unwrap();
    let addr = manager.local_addr().unwrap();
    let run = Running::start(manager);

    until(|| ctx.names("secrets").len() == 3).await;
    let (status, body) = get(addr, "/healthz").await;
    assert_eq!(status, 500);
    assert!(body.contains("broken"), "{body}");
    // Paths and methods it does not serve.
    assert_eq!(get(addr, "/nope").await.0, 404);
    assert_eq!(request(addr, "POST", "/healthz").await.0, 405);

    run.stop(LIMIT).await;
}

#[cfg(feature = "prometheus")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_serve_every_controllers_families() {
    use prometheus_client::registry::Registry;
    use tokio_workqueue_kube::metrics::{ControllerMetrics, PrometheusMetrics};

    let server = LocalApiServer::start().await;
    let client = server.client();
    seed(&client).await;
    let ctx = Arc::new(Ctx::default());
    let mut registry = Registry::default();
    let mut manager = Manager::new(client);
    for name in ["configmaps", "more-configmaps"] {
        let queue_metrics = PrometheusMetrics::new();
        queue_metrics.register(&mut registry);
        let controller_metrics = ControllerMetrics::new();
        controller_metrics.register(&mut registry);
        let results = manager
            .controller_for::<ConfigMap>(watcher::Config::default())
            .queue(
                tokio_workqueue::Builder::new()
                    .name(name)
                    .metrics(queue_metrics.clone()),
            )
            .metrics(controller_metrics)
            .run(
                move |cm: Arc<ConfigMap>, ctx: Arc<Ctx>| async move {
                    ctx.record("any", cm.name_any());
                    Ok::<_, TestError>(Action::await_change())
                },
                policy,
                ctx.clone(),
            );
        manager.add(name, results).unwrap();
    }
    manager.metrics(registry);
    manager.serve("127.0.0.1:0").unwrap();
    let addr = manager.local_addr().unwrap();
    let run = Running::start(manager);
    until(|| ctx.starts.lock().unwrap().len() >= 6).await;
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    for family in ["workqueue_adds_total", "controller_runtime_reconcile_total"] {
        for name in ["configmaps", "more-configmaps"] {
            assert!(
                body.lines()
                    .any(|l| l.starts_with(family) && l.contains(&format!("\"{name}\""))),
                "{family} of {name} missing:\n{body}"
            );
        }
    }
    run.stop(LIMIT).await;
}

#[tokio::test]
async fn bad_input_gets_clear_errors() {
    let server = LocalApiServer::start().await;
    let mut manager = Manager::new(server.client());
    manager
        .add("a", futures::stream::empty::<Result<(), std::io::Error>>())
        .unwrap();
    let twice = manager
        .add("a", futures::stream::empty::<Result<(), std::io::Error>>())
        .err()
        .unwrap();
    assert!(matches!(twice, ManagerError::DuplicateName(ref n) if n == "a"));
    assert!(twice.to_string().contains("\"a\""), "{twice}");

    let invalid = manager.serve("localhost:http").err().unwrap();
    assert!(
        matches!(invalid, ManagerError::InvalidAddress { .. }),
        "{invalid:?}"
    );
    assert!(invalid.to_string().contains("localhost:http"), "{invalid}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let in_use = manager.serve(&addr).err().unwrap();
    assert!(matches!(in_use, ManagerError::Bind { .. }), "{in_use:?}");
    assert!(in_use.to_string().contains(&addr), "{in_use}");

    manager.serve("127.0.0.1:0").unwrap();
    assert!(matches!(
        manager.serve("127.0.0.1:0").err().unwrap(),
        ManagerError::ServeTwice
    ));
}

#[test]
fn the_manager_is_send_and_debug() {
    fn check<T: Send + std::fmt::Debug>() {}
    check::<Manager>();
}
