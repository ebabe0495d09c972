//! How fast the local API server answers a `kube_client::Client`, with
//! connections kept alive (hyper's pool, the default) and with a
//! `Connection: close` on every request (a new TCP connection each time).
//! It prints figures; it asserts nothing.
//!
//! ```text
//! cargo run --release -p kube-local-apiserver --example throughput [OBJECTS]
//! ```
//!
//! With OBJECTS (default 10,000) ConfigMaps stored, it times: a paged list
//! of all of them (500 per page, as kube-runtime's watcher lists), 2,000
//! GETs one after another, 2,000 merge patches from 8 tasks, and how long
//! a watch takes to see OBJECTS changes made through the backdoor.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube_client::{Client, Config};
use kube_local_apiserver::LocalApiServer;
use serde_json::json;

fn per_second(n: usize, d: Duration) -> String {
    format!(
        "{:>9.0}/s ({n} in {:.3} s)",
        n as f64 / d.as_secs_f64(),
        d.as_secs_f64()
    )
}

async fn list_all(api: &Api<ConfigMap>) -> usize {
    let mut lp = ListParams::default().limit(500);
    let mut n = 0;
    loop {
        let page = api.list(&lp).await.expect("list");
        n += page.items.len();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return n,
        }
    }
}

async fn run(label: &str, server: &LocalApiServer, config: Config, objects: usize) {
    let client = Client::try_from(config).expect("a client");
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    println!("{label}:");

    let started = Instant::now();
    let n = list_all(&api).await;
    println!("  paged list          {}", per_second(n, started.elapsed()));

    let gets = 2_000.min(objects);
    let started = Instant::now();
    for i in 0..gets {
        api.get(&format!("cm-{i:05}")).await.expect("get");
    }
    println!(
        "  sequential GETs     {}",
        per_second(gets, started.elapsed())
    );

    let patches = 2_000.min(objects);
    let started = Instant::now();
    futures::stream::iter(0..patches)
        .for_each_concurrent(8, |i| {
            let api = api.clone();
            async move {
                api.patch(
                    &format!("cm-{i:05}"),
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "data": { "label": label_value(i) } })),
                )
                .await
                .expect("patch");
            }
        })
        .await;
    println!(
        "  patches, 8 at once  {}",
        per_second(patches, started.elapsed())
    );

    let rv = server.resource_version().to_string();
    let mut watch = api
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    assert!(server.wait_for_watches(1, Duration::from_secs(10)).await);
    let started = Instant::now();
    let writer = {
        let server = server.clone();
        let label = label.to_string();
        tokio::spawn(async move {
            for i in 0..objects {
                server
                    .upsert(&json!({
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": { "name": format!("cm-{i:05}"), "namespace": "default" },
                        "data": { "v": format!("{label}-{i}") },
                    }))
                    .expect("upsert");
                if i % 256 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let mut seen = 0;
    while seen < objects {
        match watch.try_next().await.expect("watch").expect("open") {
            WatchEvent::Modified(_) => seen += 1,
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    writer.await.unwrap();
    println!(
        "  watch events        {}",
        per_second(seen, started.elapsed())
    );
}

fn label_value(i: usize) -> String {
    format!("p{i}")
}

#[tokio::main]
async fn main() {
    let objects: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("OBJECTS is a number"))
        .unwrap_or(10_000);
    let server = LocalApiServer::start().await;
    let started = Instant::now();
    for i in 0..objects {
        server
            .upsert(&json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": format!("cm-{i:05}"), "namespace": "default",
                              "labels": { "app": "throughput" } },
                "data": { "v": "0" },
            }))
            .expect("seed");
    }
    println!(
        "seeded {objects} ConfigMaps through the backdoor in {:.3} s",
        started.elapsed().as_secs_f64()
    );

    run(
        "keep-alive (the default)",
        &server,
        server.client_config(),
        objects,
    )
    .await;
    let mut close = server.client_config();
    close.headers.push((
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    ));
    run(
        "Connection: close on every request",
        &server,
        close,
        objects,
    )
    .await;
}
