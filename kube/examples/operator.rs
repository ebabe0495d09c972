//! An operator: three controllers in one process on a `Manager`, sharing
//! their caches, one leader election, liveness and readiness probes and a
//! metrics endpoint.
//!
//! - `configmaps` reconciles ConfigMaps labelled `app=demo` and owns the
//!   Secret it keeps beside each (`<name>-copy`, the ConfigMap's data);
//! - `secrets` reconciles those Secrets (it only counts them here);
//! - `mirrors` reconciles the same Secrets again, triggered by their
//!   ConfigMaps through a mapper.
//!
//! The three use three sources (labelled ConfigMaps, Secrets, and Secrets'
//! metadata), so the manager opens three watches where three independent
//! controllers would open five.
//!
//! By default it starts the local API server in-process, makes a few
//! ConfigMaps, changes one, prints what each controller did and what
//! `/readyz`, `/healthz` and `/metrics` answer, shuts down (a drain, then
//! the Lease is released) and exits:
//!
//! ```text
//! cargo run -p tokio-workqueue-kube --example operator --features prometheus
//! ```
//!
//! Against the cluster in `KUBECONFIG` (`NAMESPACE` picks the namespace,
//! `default` otherwise; it needs get/list/watch/create/update on ConfigMaps
//! and Secrets and the Lease rights of leader election), until Ctrl-C, with
//! the endpoint on `0.0.0.0:8080` (`ENDPOINT` changes it):
//!
//! ```text
//! cargo run -p tokio-workqueue-kube --example operator --features rustls,prometheus -- --cluster
//! ```
//!
//! With `--shards`, the three controllers share one shard membership
//! instead of one election (`Manager::shards`): every replica reconciles
//! its share of the keys, and each holds one Lease,
//! `operator-example-{POD_NAME}`, whatever the number of controllers. Run
//! it in several terminals with different `POD_NAME`s (and `--cluster`) to
//! see the keys split; alone, one replica owns them all:
//!
//! ```text
//! cargo run -p tokio-workqueue-kube --example operator --features prometheus -- --shards
//! POD_NAME=operator-1 cargo run -p tokio-workqueue-kube --example operator --features rustls,prometheus -- --cluster --shards
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use kube_runtime::controller::Action;
use kube_runtime::reflector::ObjectRef;
use kube_runtime::watcher;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_workqueue::Builder;
use tokio_workqueue_kube::Manager;
use tokio_workqueue_kube::leader::{LeaderElection, LeaseConfig};
use tokio_workqueue_kube::metrics::{ControllerMetrics, PrometheusMetrics};
use tokio_workqueue_kube::shard::{ShardConfig, Shards};

#[derive(Debug)]
struct Error(kube::Error);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "API call failed: {}", self.0)
    }
}

impl std::error::Error for Error {}

struct Ctx {
    client: Client,
    /// Reconciles per controller, for the summary.
    counts: [AtomicUsize; 3],
}

impl Ctx {
    fn did(&self, controller: usize, what: String) {
        self.counts[controller].fetch_add(1, Ordering::Relaxed);
        println!(
            "  {:<10} {what}",
            ["configmaps", "secrets", "mirrors"][controller]
        );
    }
}

/// Keeps `<name>-copy` equal to the ConfigMap's data, owned by it.
async fn reconcile_configmap(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = cm.namespace().unwrap_or_else(|| "default".into());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut copy = Secret::default();
    copy.metadata.name = Some(format!("{}-copy", cm.name_any()));
    copy.metadata.owner_references = cm.controller_owner_ref(&()).map(|o| vec![o]);
    copy.data = Some(
        cm.data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
            .collect(),
    );
    secrets
        .patch(
            copy.metadata.name.as_deref().unwrap(),
            &PatchParams::apply("operator-example").force(),
            &Patch::Apply(&copy),
        )
        .await
        .map_err(Error)?;
    ctx.did(
        0,
        format!("{ns}/{} -> Secret {}-copy", cm.name_any(), cm.name_any()),
    );
    Ok(Action::await_change())
}

async fn reconcile_secret(secret: Arc<Secret>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    ctx.did(
        1,
        format!(
            "{} ({} keys)",
            secret.name_any(),
            secret.data.iter().flatten().count()
        ),
    );
    Ok(Action::await_change())
}

async fn reconcile_mirror(secret: Arc<Secret>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    ctx.did(2, format!("{} (its ConfigMap changed)", secret.name_any()));
    Ok(Action::await_change())
}

fn retry<K>(_: Arc<K>, error: &Error, _: Arc<Ctx>) -> Action {
    eprintln!("  reconcile failed: {error}");
    Action::requeue(Duration::from_secs(5))
}

/// A controller's queue and controller metrics, registered in `registry`.
fn metrics<K: tokio_workqueue::Key>(
    name: &str,
    registry: &mut Registry,
) -> (Builder<K>, ControllerMetrics) {
    let queue = PrometheusMetrics::new();
    queue.register(registry);
    let controller = ControllerMetrics::new();
    controller.register(registry);
    (Builder::new().name(name).metrics(queue), controller)
}

/// The status line and body of `GET path` on the endpoint.
async fn probe(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return ("closed".into(), String::new());
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n");
    let _ = stream.write_all(request.as_bytes()).await;
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response).await;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or("").to_owned();
    (status, body.to_owned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let on_cluster = std::env::args().any(|a| a == "--cluster");
    let sharded = std::env::args().any(|a| a == "--shards");
    let (client, _local) = if on_cluster {
        (Client::try_default().await?, None)
    } else {
        let server = kube_local_apiserver::LocalApiServer::start().await;
        (server.client(), Some(server))
    };
    let ns = std::env::var("NAMESPACE").unwrap_or_else(|_| "default".into());
    let identity = std::env::var("POD_NAME").unwrap_or_else(|_| "operator-0".into());

    let ctx = Arc::new(Ctx {
        client: client.clone(),
        counts: Default::default(),
    });
    let mut registry = Registry::default();
    let mut manager = Manager::new(client.clone());
    if sharded {
        let config = ShardConfig::new("operator-example", &ns, identity);
        manager.shards(Shards::new(client.clone(), config))?;
    } else {
        manager.leader_election(LeaderElection::new(
            client.clone(),
            LeaseConfig::new("operator-example", &ns, identity),
        ))?;
    }

    let demo = watcher::Config::default().labels("app=demo");
    let (queue, controller_metrics) = metrics("configmaps", &mut registry);
    let configmaps = manager
        .controller(
            Api::<ConfigMap>::namespaced(client.clone(), &ns),
            demo.clone(),
        )
        .owns(
            Api::<Secret>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
        )
        .queue(queue)
        .metrics(controller_metrics)
        .run(reconcile_configmap, retry, ctx.clone());
    let (queue, controller_metrics) = metrics("secrets", &mut registry);
    let secrets = manager
        .controller(
            Api::<Secret>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
        )
        .queue(queue)
        .metrics(controller_metrics)
        .run(reconcile_secret, retry, ctx.clone());
    let (queue, controller_metrics) = metrics("mirrors", &mut registry);
    let mirrors = manager
        .controller(
            Api::<Secret>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
        )
        .watches(
            Api::<ConfigMap>::namespaced(client.clone(), &ns),
            demo,
            |cm: ConfigMap| {
                let ns = cm.namespace().unwrap_or_default();
                Some(ObjectRef::new(&format!("{}-copy", cm.name_any())).within(&ns))
            },
        )
        .queue(queue)
        .metrics(controller_metrics)
        .run(reconcile_mirror, retry, ctx.clone());
    manager
        .add("configmaps", configmaps)?
        .add("secrets", secrets)?
        .add("mirrors", mirrors)?
        .metrics(registry);

    if on_cluster {
        let endpoint = std::env::var("ENDPOINT").unwrap_or_else(|_| "0.0.0.0:8080".into());
        manager.serve(&endpoint)?;
        println!("serving /healthz, /readyz and /metrics on {endpoint}; Ctrl-C to stop");
        manager.run().await?;
        return Ok(());
    }

    manager.serve("127.0.0.1:0")?;
    let addr = manager.local_addr().expect("bound");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    manager.shutdown_on(async move {
        let _ = stopped.await;
    });
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for name in ["alpha", "beta", "gamma"] {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.labels = Some(BTreeMap::from([("app".into(), "demo".into())]));
        cm.data = Some(BTreeMap::from([(
            "greeting".into(),
            format!("hello {name}"),
        )]));
        cms.create(&PostParams::default(), &cm).await?;
    }
    println!("three ConfigMaps made; the manager starts (endpoint on {addr})");
    let run = tokio::spawn(manager.run());

    let (status, _) = probe(addr, "/readyz").await;
    println!("/readyz right after the start: {status}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ctx.counts[0].load(Ordering::Relaxed) < 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("changing beta:");
    cms.patch(
        "beta",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "data": { "greeting": "hello again" } })),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    for path in ["/readyz", "/healthz"] {
        let (status, body) = probe(addr, path).await;
        println!("{path}: {status} {}", body.trim());
    }
    let (status, body) = probe(addr, "/metrics").await;
    println!("/metrics: {status}; reconciles by controller:");
    for line in body.lines().filter(|l| {
        l.starts_with("controller_runtime_reconcile_total") && l.contains("result=\"success\"")
    }) {
        println!("  {line}");
    }

    let _ = stop.send(());
    run.await??;
    let (status, _) = probe(addr, "/healthz").await;
    println!("after shutdown the endpoint is {status}");
    let counts: Vec<_> = ctx
        .counts
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    println!(
        "reconciles: configmaps {}, secrets {}, mirrors {}",
        counts[0], counts[1], counts[2]
    );
    if counts.contains(&0) {
        return Err("a controller reconciled nothing".into());
    }
    Ok(())
}
