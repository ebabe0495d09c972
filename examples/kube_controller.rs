//! A ConfigMap controller built on tokio-workqueue: a kube-runtime watcher
//! feeds a prioritised work queue, and `run_controller` reconciles the keys.
//!
//! Without a cluster (starts the local API server of the
//! `kube-local-apiserver` crate on 127.0.0.1, makes a few changes, and exits
//! by itself after a few seconds):
//!
//! ```text
//! cargo run --example kube_controller --features kube
//! ```
//!
//! Against the cluster `KUBECONFIG` points at (runs until Ctrl-C; reads
//! ConfigMaps, never writes). Real clusters speak https, hence rustls:
//!
//! ```text
//! KUBECONFIG=~/.kube/config cargo run --example kube_controller --features kube-rustls
//! ```
//!
//! Set `NAMESPACE` to watch one namespace instead of all of them.
//!
//! What the reconciler does is illustrative: it fetches the ConfigMap,
//! reports its size, fails once for ConfigMaps labelled
//! `example.tokio-workqueue/fail-once=true` (to show the rate-limited
//! requeue) and asks to be run again later for ConfigMaps annotated with
//! `example.tokio-workqueue/recheck-seconds`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{Api, Client};
use kube_local_apiserver::LocalApiServer;
use kube_runtime::{WatchStreamExt, watcher};
use tokio_workqueue::WorkQueue;
use tokio_workqueue::kube::{
    Action, ObjectRef, ReconcileError, Reconciled, Requeued, WatchQueueExt, run_controller,
};

/// The reconciler's shared state.
struct Context {
    client: Client,
    /// Keys that already failed once (for the fail-once label).
    failed_once: Mutex<HashSet<ObjectRef<ConfigMap>>>,
}

#[derive(Debug)]
enum Error {
    Kube(kube_client::Error),
    Deliberate,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Kube(e) => write!(f, "API error: {e}"),
            Error::Deliberate => f.write_str("failing once on purpose (fail-once label)"),
        }
    }
}

impl std::error::Error for Error {}

/// Brings the world in line with ConfigMap `key`. Here it only looks.
async fn reconcile(key: ObjectRef<ConfigMap>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = key.namespace.as_deref().unwrap_or("default");
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let Some(cm) = api.get_opt(&key.name).await.map_err(Error::Kube)? else {
        println!("  {ns}/{}: gone, nothing to clean up", key.name);
        return Ok(Action::Done);
    };
    let labels = cm.metadata.labels.clone().unwrap_or_default();
    if labels
        .get("example.tokio-workqueue/fail-once")
        .map(String::as_str)
        == Some("true")
        && ctx.failed_once.lock().unwrap().insert(key.clone())
    {
        return Err(Error::Deliberate);
    }
    let keys = cm.data.as_ref().map_or(0, |d| d.len());
    println!(
        "  {ns}/{}: {keys} data key(s) at resourceVersion {}",
        key.name,
        cm.metadata.resource_version.as_deref().unwrap_or("?")
    );
    let recheck = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("example.tokio-workqueue/recheck-seconds"))
        .and_then(|s| s.parse().ok());
    Ok(match recheck {
        Some(secs) => Action::requeue(Duration::from_secs(secs)),
        None => Action::Done,
    })
}

/// Creates or changes ConfigMap `ns/name` on the local server, with labels
/// and annotations (a backdoor write: it makes the same watch events as an
/// API write).
fn put_configmap(
    server: &LocalApiServer,
    ns: &str,
    name: &str,
    data: &[(&str, &str)],
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) {
    let map = |pairs: &[(&str, &str)]| -> serde_json::Map<String, serde_json::Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect()
    };
    server
        .upsert(&serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": map(labels),
                "annotations": map(annotations),
            },
            "data": map(data),
        }))
        .expect("the local server stores a ConfigMap");
}

/// `namespace/name`, the way kubectl users read it.
fn show(key: &ObjectRef<ConfigMap>) -> String {
    match &key.namespace {
        Some(ns) => format!("{ns}/{}", key.name),
        None => key.name.clone(),
    }
}

fn report(r: &Reconciled<ObjectRef<ConfigMap>, Error>) {
    let what = match &r.result {
        Ok(Action::Done) => "done".to_string(),
        Ok(Action::RequeueAfter(d)) => format!("again in {d:?}"),
        Ok(other) => format!("{other:?}"),
        Err(ReconcileError::Failed(e)) => format!("failed: {e}"),
        Err(e) => e.to_string(),
    };
    let requeued = match r.requeued {
        Requeued::No | Requeued::After(_) => String::new(),
        Requeued::RateLimited => ", requeued with backoff".to_string(),
        other => format!(", {other:?}"),
    };
    println!(
        "reconciled {} (priority {}): {what}{requeued}",
        show(&r.key),
        r.priority
    );
}

// One thread keeps the printed lines in causal order; a real controller
// would use the default multi-threaded runtime.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A cluster if KUBECONFIG says so, else the local API server.
    let (client, local) = if std::env::var_os("KUBECONFIG").is_some() {
        let client = Client::try_default().await.map_err(|e| {
            format!("cannot reach the cluster in KUBECONFIG ({e}); an https cluster needs --features kube-rustls")
        })?;
        println!("watching ConfigMaps on the cluster in KUBECONFIG; Ctrl-C to stop");
        (client, None)
    } else {
        let server = LocalApiServer::start().await;
        put_configmap(
            &server,
            "default",
            "app-config",
            &[("log-level", "info"), ("port", "8080")],
            &[],
            &[],
        );
        put_configmap(
            &server,
            "default",
            "feature-flags",
            &[("new-ui", "false")],
            &[],
            &[],
        );
        put_configmap(
            &server,
            "kube-system",
            "coredns",
            &[("Corefile", ".:53 { forward . /etc/resolv.conf }")],
            &[],
            &[],
        );
        println!(
            "no KUBECONFIG: using the local API server at {}",
            server.url()
        );
        (server.client(), Some(server))
    };

    let api: Api<ConfigMap> = match std::env::var("NAMESPACE") {
        Ok(ns) => Api::namespaced(client.clone(), &ns),
        Err(_) => Api::all(client.clone()),
    };
    let queue: WorkQueue<ObjectRef<ConfigMap>> = WorkQueue::builder().name("configmaps").build();

    // Watch events in, keys out: the initial list goes in at low priority,
    // real changes at normal priority.
    let feeder = tokio::spawn(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .enqueue(queue.clone())
            .for_each(|added| async move {
                match added {
                    Ok(e) => println!(
                        "queued {} ({:?}, priority {})",
                        show(&e.key),
                        e.cause,
                        e.priority
                    ),
                    Err(e) => println!("watch: {e}"),
                }
            }),
    );

    // Without a cluster: a few changes, then stop. With one: until Ctrl-C.
    let stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match local {
        Some(server) => Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            println!("-- changing objects on the local server");
            put_configmap(
                &server,
                "default",
                "app-config",
                &[("log-level", "debug"), ("port", "8080")],
                &[],
                &[],
            );
            put_configmap(
                &server,
                "default",
                "flaky",
                &[("x", "1")],
                &[("example.tokio-workqueue/fail-once", "true")],
                &[],
            );
            put_configmap(
                &server,
                "default",
                "cache-settings",
                &[("ttl", "60")],
                &[],
                &[("example.tokio-workqueue/recheck-seconds", "1")],
            );
            server.remove("v1", "ConfigMap", Some("default"), "feature-flags");
            tokio::time::sleep(Duration::from_millis(500)).await;
            println!("-- forcing a re-list (410 Gone)");
            server.expire_watches();
            tokio::time::sleep(Duration::from_secs(3)).await;
            println!("-- shutting down: draining the queue");
        }),
        None => Box::pin(async {
            let _ = tokio::signal::ctrl_c().await;
            println!("-- Ctrl-C: draining the queue");
        }),
    };

    let ctx = Arc::new(Context {
        client,
        failed_once: Mutex::new(HashSet::new()),
    });
    let mut reconciled = 0;
    let mut controller =
        run_controller(queue.clone(), 2, move |key| reconcile(key, ctx.clone())).shutdown_on(stop);
    while let Some(r) = controller.next().await {
        report(&r);
        reconciled += 1;
    }
    feeder.abort();
    println!("stopped after {reconciled} reconcile(s)");
    Ok(())
}
