//! kube-runtime's shared-stream constructors (`for_shared_stream`,
//! `owns_shared_stream`, `watches_shared_stream`) under their names: a
//! stream of `Arc<K>` from a cache the caller reflects itself triggers the
//! same reconciles as the plain streams.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_runtime::reflector::ObjectRef;
use kube_runtime::reflector::store::Writer;
use kube_runtime::watcher::Event;
use tokio_workqueue_kube::{Action, Controller};

#[derive(Debug)]
struct Error;

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("error")
    }
}

impl std::error::Error for Error {}

fn cm(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.namespace = Some("default".into());
    cm.metadata.uid = Some(format!("uid-{name}"));
    cm.metadata.resource_version = Some("1".into());
    cm.data = Some(BTreeMap::new());
    cm
}

fn secret_of(owner: &str) -> Secret {
    let mut secret = Secret::default();
    secret.metadata.name = Some(format!("secret-of-{owner}"));
    secret.metadata.namespace = Some("default".into());
    secret.metadata.resource_version = Some("1".into());
    secret.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.into(),
        uid: format!("uid-{owner}"),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    secret
}

#[tokio::test]
async fn shared_streams_trigger_their_keys_from_the_callers_cache() {
    // The caller's own cache of ConfigMaps, complete before the streams run.
    let mut writer = Writer::<ConfigMap>::default();
    let reader = writer.as_reader();
    writer.apply_watcher_event(&Event::Init);
    for name in ["a", "b", "c"] {
        writer.apply_watcher_event(&Event::InitApply(cm(name)));
    }
    writer.apply_watcher_event(&Event::InitDone);

    let seen = Arc::new(Mutex::new(Vec::new()));
    let main = futures::stream::iter([Arc::new(cm("a"))]);
    let children = futures::stream::iter([Arc::new(secret_of("b"))]);
    let others = futures::stream::iter([Arc::new(cm("c"))]);
    let results: Vec<_> = Controller::for_shared_stream(main, reader)
        .owns_shared_stream(children)
        .watches_shared_stream(others, |other: Arc<ConfigMap>| {
            Some(ObjectRef::from_obj(&*other))
        })
        .run(
            |object: Arc<ConfigMap>, seen: Arc<Mutex<Vec<String>>>| async move {
                seen.lock()
                    .unwrap()
                    .push(object.metadata.name.clone().unwrap());
                Ok::<_, Error>(Action::await_change())
            },
            |_, _: &Error, _| Action::await_change(),
            seen.clone(),
        )
        .collect()
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, ["a", "b", "c"]);
}
