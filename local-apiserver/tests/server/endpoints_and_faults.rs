//! Cutting one client off the server ([`Endpoint::disconnect`]), injected
//! errors and delays, and the server's end when its last handle goes.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, PostParams, WatchParams};
use kube_client::{Client, ResourceExt};
use kube_local_apiserver::{Fault, LocalApiServer, Verb};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(30);

fn code_of<T: std::fmt::Debug>(r: Result<T, kube_client::Error>) -> Option<u16> {
    match r {
        Err(kube_client::Error::Api(s)) => Some(s.code),
        Err(_) => None,
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn configmaps(client: Client) -> Api<ConfigMap> {
    Api::namespaced(client, "default")
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap()
}

#[tokio::test]
async fn a_disconnected_endpoint_refuses_its_client_and_others_go_on() {
    let server = LocalApiServer::start().await;
    let a = server.endpoint();
    let b = server.endpoint();
    assert_ne!(a.url(), b.url());
    let (ca, cb) = (configmaps(a.client()), configmaps(b.client()));
    ca.create(&PostParams::default(), &cm("shared"))
        .await
        .expect("a writes");
    assert_eq!(
        cb.get("shared").await.expect("b reads it").name_any(),
        "shared"
    );

    // An open watch on b breaks when b is cut off.
    let rv = server.resource_version().to_string();
    let mut watch = cb
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("b watches")
        .boxed();
    assert!(server.wait_for_watches(1, LIMIT).await);
    b.disconnect();
    assert!(!b.is_connected());
    let broken = tokio::time::timeout(LIMIT, watch.try_next())
        .await
        .expect("the watch breaks in time");
    assert!(broken.is_err() || matches!(broken, Ok(None)), "{broken:?}");

    let refused = cb.get("shared").await;
    assert!(
        matches!(refused, Err(ref e) if !matches!(e, kube_client::Error::Api(_))),
        "a connection error, not an answer: {refused:?}"
    );
    ca.create(&PostParams::default(), &cm("while-b-is-away"))
        .await
        .expect("a goes on");
    assert!(a.is_connected());

    b.reconnect();
    assert_eq!(
        cb.get("while-b-is-away")
            .await
            .expect("b is back")
            .name_any(),
        "while-b-is-away"
    );
    // Per-endpoint counts: b's refused request was never read.
    assert_eq!(b.requests().of(Verb::Get, "configmaps"), 2);
    assert_eq!(a.requests().of(Verb::Create, "configmaps"), 2);
    assert_eq!(server.requests().of(Verb::Get, "configmaps"), 2);
}

#[tokio::test]
async fn injected_errors_fail_matching_requests_then_run_out() {
    let server = LocalApiServer::start().await;
    let mut config = server.client_config();
    // kube-client would retry a 503 by itself.
    config.default_retry = false;
    let client = Client::try_from(config).unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": "l" },
        "spec": { "holderIdentity": "a" },
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    server.inject(
        Fault::status(503)
            .verb(Verb::Update)
            .resource("leases")
            .times(1),
    );
    assert_eq!(
        code_of(leases.replace("l", &PostParams::default(), &created).await),
        Some(503)
    );
    leases
        .replace("l", &PostParams::default(), &created)
        .await
        .expect("the fault ran out");
    // Only matching requests fail, and nothing was written by the failed one.
    server.inject(Fault::status(500).name("other"));
    leases.get("l").await.expect("another name is not affected");
    server.clear_faults();

    // A fault on one endpoint leaves the others alone.
    let ep = server.endpoint();
    ep.inject(Fault::status(429).verb(Verb::List));
    let mut config = ep.client_config();
    config.default_retry = false;
    let on_ep = configmaps(Client::try_from(config).unwrap());
    assert_eq!(code_of(on_ep.list(&Default::default()).await), Some(429));
    configmaps(client)
        .list(&Default::default())
        .await
        .expect("the main endpoint lists");
    ep.clear_faults();
    on_ep.list(&Default::default()).await.expect("cleared");
}

#[tokio::test]
async fn injected_delays_hold_requests_back() {
    let server = LocalApiServer::start().await;
    let api = configmaps(server.client());
    api.create(&PostParams::default(), &cm("slow"))
        .await
        .unwrap();
    server.inject(
        Fault::delay(Duration::from_millis(300))
            .verb(Verb::Get)
            .times(1),
    );
    let started = tokio::time::Instant::now();
    api.get("slow").await.expect("a late answer");
    assert!(started.elapsed() >= Duration::from_millis(300));
    let started = tokio::time::Instant::now();
    api.get("slow").await.expect("an answer");
    assert!(started.elapsed() < Duration::from_millis(300));
}

#[tokio::test]
async fn the_server_stops_with_its_last_handle() {
    let server = LocalApiServer::start().await;
    let copy = server.clone();
    let client = server.client();
    let api = configmaps(client.clone());
    let rv = server.resource_version().to_string();
    let mut watch = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    assert!(server.wait_for_watches(1, LIMIT).await);
    drop(server);
    api.list(&Default::default())
        .await
        .expect("a clone keeps it running");
    drop(copy);
    let ended = tokio::time::timeout(LIMIT, watch.try_next())
        .await
        .expect("the watch ends when the server stops");
    assert!(ended.is_err() || matches!(ended, Ok(None)), "{ended:?}");
    assert!(api.list(&Default::default()).await.is_err());
}
