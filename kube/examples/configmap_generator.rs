//! A real controller on `tokio_workqueue_kube::Controller`: a custom
//! resource, `ConfigMapGenerator`, that owns a ConfigMap it creates, with a
//! finalizer, status updates and a Prometheus endpoint.
//!
//! The reconciler, error policy and stream consumer are written exactly as
//! for kube-runtime's controller; only the `Controller` import differs.
//!
//! By default it starts the local API server in-process, installs the CRD
//! through the apiextensions API, makes a few generators, changes one,
//! deletes one, prints each reconcile and a few metrics, and exits:
//!
//! ```text
//! cargo run -p tokio-workqueue-kube --example configmap_generator --features prometheus
//! ```
//!
//! Against the cluster in `KUBECONFIG` (it installs the CRD itself, which
//! needs permission to create CustomResourceDefinitions; `NAMESPACE` picks
//! the namespace, `default` otherwise), until Ctrl-C:
//!
//! ```text
//! cargo run -p tokio-workqueue-kube --example configmap_generator --features rustls,prometheus -- --cluster
//! ```
//!
//! The metrics are served on `http://127.0.0.1:<port>/metrics` (the port is
//! printed; `METRICS_PORT` fixes it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResource, CustomResourceExt, Resource, ResourceExt};
use kube_runtime::controller::Action;
use kube_runtime::finalizer::{Event as Finalizer, finalizer};
use kube_runtime::wait::{await_condition, conditions};
use kube_runtime::watcher;
use prometheus_client::registry::Registry;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_workqueue::WorkQueue;
use tokio_workqueue_kube::Controller;
use tokio_workqueue_kube::metrics::{ControllerMetrics, PrometheusMetrics};

/// Asks for a ConfigMap holding `content` under the key `content`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "example.tokio-workqueue.dev",
    version = "v1",
    kind = "ConfigMapGenerator",
    namespaced,
    status = "GeneratorStatus"
)]
pub struct ConfigMapGeneratorSpec {
    content: String,
}

/// What the controller last did.
#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratorStatus {
    config_map: Option<String>,
    observed_generation: Option<i64>,
}

const FINALIZER: &str = "example.tokio-workqueue.dev/cleanup";
const MANAGER: &str = "configmap-generator";

struct Ctx {
    client: Client,
}

/// What a reconcile fails with: the finalizer helper's error, which
/// carries the Kubernetes API's.
#[derive(Debug)]
struct Error(Box<kube_runtime::finalizer::Error<kube::Error>>);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Error {}

async fn reconcile(generator: Arc<ConfigMapGenerator>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = generator.namespace().unwrap_or_default();
    let generators: Api<ConfigMapGenerator> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&generators, FINALIZER, generator, |event| async {
        match event {
            Finalizer::Apply(generator) => apply(&generator, &ctx).await,
            Finalizer::Cleanup(generator) => cleanup(&generator, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error(Box::new(e)))
}

/// Makes the ConfigMap what the generator asks for, then says so in status.
async fn apply(generator: &ConfigMapGenerator, ctx: &Ctx) -> Result<Action, kube::Error> {
    let ns = generator.namespace().unwrap_or_default();
    let name = generator.name_any();
    let owner = generator
        .controller_owner_ref(&())
        .expect("a stored object has a name and uid");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.clone());
    cm.metadata.owner_references = Some(vec![owner]);
    cm.data = Some(BTreeMap::from([(
        "content".to_string(),
        generator.spec.content.clone(),
    )]));
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    cms.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await?;
    let status = json!({ "status": GeneratorStatus {
        config_map: Some(name.clone()),
        observed_generation: generator.metadata.generation,
    }});
    let generators: Api<ConfigMapGenerator> = Api::namespaced(ctx.client.clone(), &ns);
    generators
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Deletes the ConfigMap before the generator goes. (A real cluster's
/// garbage collector would also delete it through its owner reference; the
/// local API server has no garbage collector.)
async fn cleanup(generator: &ConfigMapGenerator, ctx: &Ctx) -> Result<Action, kube::Error> {
    let ns = generator.namespace().unwrap_or_default();
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    match cms
        .delete(&generator.name_any(), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e),
    }
    Ok(Action::await_change())
}

fn error_policy(_generator: Arc<ConfigMapGenerator>, _error: &Error, _ctx: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

/// Serves the registry's text at `/metrics` until the program ends.
async fn serve_metrics(registry: Arc<Registry>) -> std::io::Result<std::net::SocketAddr> {
    let port: u16 = std::env::var("METRICS_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let registry = registry.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 1024];
                let _ = conn.read(&mut head).await;
                let mut body = String::new();
                let _ = prometheus_client::encoding::text::encode(&mut body, &registry);
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
            });
        }
    });
    Ok(addr)
}

async fn scrape(addr: std::net::SocketAddr) -> std::io::Result<String> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await?;
    let mut text = String::new();
    conn.read_to_string(&mut text).await?;
    Ok(text)
}

async fn install_crd(client: &Client) -> Result<(), Box<dyn std::error::Error>> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = ConfigMapGenerator::crd();
    let name = crd.name_any();
    crds.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await?;
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(crds, &name, conditions::is_crd_established()),
    )
    .await??;
    Ok(())
}

fn generator(name: &str, content: &str) -> ConfigMapGenerator {
    ConfigMapGenerator::new(
        name,
        ConfigMapGeneratorSpec {
            content: content.into(),
        },
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let on_cluster = std::env::args().any(|a| a == "--cluster");
    // The local server lives as long as `main`.
    let (client, _local) = if on_cluster {
        (Client::try_default().await?, None)
    } else {
        let server = kube_local_apiserver::LocalApiServer::start().await;
        println!("local API server at {}", server.url());
        (server.client(), Some(server))
    };
    let ns = std::env::var("NAMESPACE").unwrap_or_else(|_| "default".into());
    install_crd(&client).await?;

    let queue_metrics = PrometheusMetrics::new();
    let controller_metrics = ControllerMetrics::new();
    let mut registry = Registry::default();
    queue_metrics.register(&mut registry);
    controller_metrics.register(&mut registry);
    let metrics_addr = serve_metrics(Arc::new(registry)).await?;
    println!("metrics at http://{metrics_addr}/metrics");

    let generators: Api<ConfigMapGenerator> = Api::namespaced(client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut controller = Controller::new(generators.clone(), watcher::Config::default())
        .owns(cms.clone(), watcher::Config::default())
        .queue(
            WorkQueue::builder()
                .name("configmapgenerator")
                .metrics(queue_metrics),
        )
        .metrics(controller_metrics)
        .concurrency(4);
    controller = if on_cluster {
        controller.shutdown_on_signal()
    } else {
        controller.graceful_shutdown_on(async {
            let _ = stop_rx.await;
        })
    };
    let run = tokio::spawn(
        controller
            .run(
                reconcile,
                error_policy,
                Arc::new(Ctx {
                    client: client.clone(),
                }),
            )
            .for_each(|result| async move {
                match result {
                    Ok((object, action)) => println!("reconciled {object}: {action:?}"),
                    // A deleted generator's ConfigMap going away triggers the
                    // generator, which is gone too: nothing to do.
                    Err(kube_runtime::controller::Error::ObjectNotFound(object)) => {
                        println!("{object} is gone: nothing to reconcile")
                    }
                    Err(e) => println!("reconcile failed: {e}"),
                }
            }),
    );
    if on_cluster {
        run.await?;
        return Ok(());
    }

    // A short scripted session against the local server.
    let pp = PostParams::default();
    for (name, content) in [("alpha", "a"), ("beta", "b"), ("gamma", "c")] {
        generators.create(&pp, &generator(name, content)).await?;
    }
    wait_for(&cms, "gamma", "c").await?;
    generators
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"content": "a2"}})),
        )
        .await?;
    wait_for(&cms, "alpha", "a2").await?;
    generators.delete("beta", &DeleteParams::default()).await?;
    // The finalizer runs the clean-up, then the generator goes.
    tokio::time::timeout(Duration::from_secs(10), async {
        while generators.get_opt("beta").await?.is_some() || cms.get_opt("beta").await?.is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok::<_, kube::Error>(())
    })
    .await??;
    let alpha = generators.get_status("alpha").await?;
    println!("alpha's status: {:?}", alpha.status);

    let _ = stop_tx.send(());
    run.await?;
    let text = scrape(metrics_addr).await?;
    for line in text.lines().filter(|l| {
        l.starts_with("controller_runtime_reconcile_total")
            || l.starts_with("workqueue_adds_total")
            || l.starts_with("controller_runtime_max_concurrent_reconciles")
    }) {
        println!("{line}");
    }
    Ok(())
}

/// Waits until the ConfigMap `name` holds `content`.
async fn wait_for(
    cms: &Api<ConfigMap>,
    name: &str,
    content: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let found = cms.get_opt(name).await?;
            if found
                .and_then(|cm| cm.data)
                .is_some_and(|d| d.get("content").map(String::as_str) == Some(content))
            {
                return Ok::<_, kube::Error>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await??;
    Ok(())
}
