//! A controller written for kube-runtime moves over by changing one import:
//! the same reconciler, error policy, builder calls and result-stream
//! consumer compile against both `kube_runtime::Controller` and
//! `tokio_workqueue_kube::Controller`. Mostly a compile-time test; the
//! streams built from an `Api` are type-checked and dropped, never polled
//! (there is no server), and the same code then runs on hand-made events.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube_client::{Api, Client, Resource};
use kube_runtime::controller::{Action, Config};
use kube_runtime::reflector::ObjectRef;
use kube_runtime::watcher;

use crate::common::{cm, fed, within_a_day};

// ---- What a kube-runtime user has written, unchanged. ----

#[derive(Debug)]
enum Error {
    Conflict(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Conflict(name) => write!(f, "conflict on {name}"),
        }
    }
}

impl std::error::Error for Error {}

struct Ctx {
    reconciles: AtomicUsize,
}

async fn reconcile(obj: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    ctx.reconciles.fetch_add(1, Ordering::SeqCst);
    let name = obj.metadata.name.clone().unwrap_or_default();
    if name.starts_with("conflict") {
        return Err(Error::Conflict(name));
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(_obj: Arc<ConfigMap>, _err: &Error, _ctx: Arc<Ctx>) -> Action {
    Action::await_change()
}

/// Consumes a controller's stream, written against kube-runtime's item type
/// and generic over its queue error, as kube-runtime users write it.
async fn consume<K, E, Q>(
    stream: impl Stream<Item = Result<(ObjectRef<K>, Action), kube_runtime::controller::Error<E, Q>>>,
) -> (Vec<String>, Vec<String>)
where
    K: Resource,
    E: std::error::Error + 'static,
    Q: std::error::Error + 'static,
{
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    let mut stream = std::pin::pin!(stream);
    while let Some(result) = stream.next().await {
        match result {
            Ok((object, _action)) => ok.push(object.name),
            Err(kube_runtime::controller::Error::ReconcilerFailed(err, object)) => {
                failed.push(format!("{}: {err}", object.name))
            }
            Err(other) => failed.push(other.to_string()),
        }
    }
    (ok, failed)
}

fn mapper(secret: Secret) -> Option<ObjectRef<ConfigMap>> {
    let ns = secret.metadata.namespace?;
    Some(ObjectRef::new(&secret.metadata.name?).within(&ns))
}

/// The same builder calls, spelled once, for either controller.
macro_rules! controller_from_api {
    ($($controller:ident)::+, $client:expr, $ctx:expr) => {{
        use $($controller)::+ as Controller;
        let wc = watcher::Config::default().labels("app=demo");
        let api = Api::<ConfigMap>::all($client.clone());
        let controller = Controller::new(api, wc.clone())
            .owns(Api::<Secret>::all($client.clone()), wc.clone())
            .watches(Api::<Secret>::all($client.clone()), wc, mapper)
            .reconcile_all_on(futures::stream::empty())
            .graceful_shutdown_on(futures::future::pending())
            .shutdown_on_signal()
            .with_config(Config::default().concurrency(4));
        let _store: kube_runtime::reflector::Store<ConfigMap> = controller.store();
        controller.run(reconcile, error_policy, $ctx.clone())
    }};
}

#[tokio::test]
async fn the_same_code_builds_both_controllers_and_the_same_consumer_takes_both_streams() {
    // A client that is never used: the streams below are never polled.
    let client = Client::try_from(kube_client::Config::new(
        "http://127.0.0.1:9".parse().unwrap(),
    ))
    .unwrap();
    let ctx = Arc::new(Ctx {
        reconciles: AtomicUsize::new(0),
    });
    let theirs = controller_from_api!(kube_runtime::Controller, client, ctx);
    let ours = controller_from_api!(tokio_workqueue_kube::Controller, client, ctx);
    let theirs = consume(theirs);
    let ours = consume(ours);
    drop((theirs, ours));
    assert_eq!(ctx.reconciles.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn the_same_code_runs_on_this_crates_controller() {
    let ctx = Arc::new(Ctx {
        reconciles: AtomicUsize::new(0),
    });
    let (feed, controller) = fed();
    let (stop, stopped) = futures::channel::oneshot::channel::<()>();
    let stream = controller
        .with_config(Config::default().concurrency(1))
        .graceful_shutdown_on(async move {
            let _ = stopped.await;
        })
        .run(reconcile, error_policy, ctx.clone());
    let consumer = tokio::spawn(consume(stream));
    feed.list([cm("a", "1"), cm("conflict-b", "1")]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.send(()).unwrap();
    let (ok, failed) = within_a_day(consumer).await.unwrap();
    assert_eq!(ok, ["a"]);
    assert_eq!(failed, ["conflict-b: conflict on conflict-b"]);
    assert_eq!(ctx.reconciles.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_success_whose_requeue_is_refused_is_still_reported_as_a_success() {
    // The watch ends (so the controller drains) and the reconciler asks for
    // its usual periodic requeue: kube-runtime reports `Ok`, and so must a
    // drop-in, or every consumer logs a failure for a success. The refusal
    // comes as a report of its own.
    let ctx = Arc::new(Ctx {
        reconciles: AtomicUsize::new(0),
    });
    let (feed, controller) = fed();
    let stream = controller.run(reconcile, error_policy, ctx.clone());
    feed.list([cm("a", "1")]);
    feed.close();
    let (ok, failed) = within_a_day(consume(stream)).await;
    assert_eq!(ok, ["a"]);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].contains("requeue of ConfigMap.v1./a.default refused"),
        "{failed:?}"
    );
}
