//! The server's watch controls: compaction (410 Gone) makes watchers
//! re-list, ended watches make them re-watch without a list, bookmarks
//! reach the watches that asked, the history limit compacts by itself,
//! streaming lists need no list request, and `timeoutSeconds` ends a watch
//! cleanly.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube_client::{Client, ResourceExt};
use kube_local_apiserver::{LocalApiServer, Verb};
use kube_runtime::watcher;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(30);

fn cm(name: &str, v: &str) -> ConfigMap {
    serde_json::from_value(json!({ "metadata": { "name": name }, "data": { "v": v } })).unwrap()
}

async fn create(client: &Client, name: &str) -> ConfigMap {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &cm(name, "1"))
        .await
        .expect("create")
}

type Events =
    tokio::sync::mpsc::UnboundedReceiver<Result<watcher::Event<ConfigMap>, watcher::Error>>;

/// Runs a kube-runtime watcher on its own task (so it keeps watching while
/// the test does something else) and hands its events over.
fn spawn_watcher(
    api: Api<ConfigMap>,
    config: watcher::Config,
) -> (Events, tokio::task::JoinHandle<()>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(watcher(api, config).for_each(move |e| {
        let _ = tx.send(e);
        async {}
    }));
    (rx, task)
}

/// The next watcher event, or a panic after the limit of real time (the
/// test clock may be paused).
async fn next(events: &mut Events) -> Result<watcher::Event<ConfigMap>, watcher::Error> {
    let deadline = std::time::Instant::now() + LIMIT;
    let recv = events.recv();
    tokio::pin!(recv);
    loop {
        // Short naps on a blocking thread: real time, and a runtime that
        // ends does not wait long for them.
        let nap = tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(5)));
        tokio::select! {
            e = &mut recv => return e.expect("the watcher goes on"),
            _ = nap => assert!(std::time::Instant::now() < deadline, "no watcher event in time"),
        }
    }
}

/// Skips events until `want` holds for one, which it returns.
async fn until(
    events: &mut Events,
    mut want: impl FnMut(&watcher::Event<ConfigMap>) -> bool,
) -> watcher::Event<ConfigMap> {
    loop {
        if let Ok(e) = next(events).await
            && want(&e)
        {
            return e;
        }
    }
}

#[tokio::test]
async fn expire_watches_makes_a_watcher_relist() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    create(&client, "a").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (mut events, _task) = spawn_watcher(api, watcher::Config::default());
    until(&mut events, |e| matches!(e, watcher::Event::InitDone)).await;
    assert!(server.wait_for_watches(1, LIMIT).await);
    assert_eq!(server.requests().of(Verb::List, "configmaps"), 1);

    server.expire_watches();
    // The 410 comes through as an error, then the watcher lists again.
    match next(&mut events).await {
        Err(e) => assert!(e.to_string().contains("too old resource version"), "{e}"),
        Ok(other) => panic!("expected the 410, got {other:?}"),
    }
    until(&mut events, |e| matches!(e, watcher::Event::Init)).await;
    match next(&mut events).await {
        Ok(watcher::Event::InitApply(cm)) => assert_eq!(cm.name_any(), "a"),
        other => panic!("expected the re-list, got {other:?}"),
    }
    until(&mut events, |e| matches!(e, watcher::Event::InitDone)).await;
    assert_eq!(server.requests().of(Verb::List, "configmaps"), 2);
}

#[tokio::test]
async fn a_watch_or_an_exact_list_from_a_compacted_version_is_gone() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let old = create(&client, "a").await.resource_version().unwrap();
    for i in 0..3 {
        create(&client, &format!("more-{i}")).await;
    }
    let page = api
        .list(&ListParams::default().limit(2))
        .await
        .expect("a first page");
    let token = page.metadata.continue_.clone().expect("more pages");
    // A change after the first page, then a compaction: the page's version
    // is gone.
    create(&client, "later").await;
    server.expire_watches();

    let mut stream = api
        .watch(&WatchParams::default(), &old)
        .await
        .expect("the watch opens")
        .boxed();
    match stream.try_next().await.expect("an event") {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected an ERROR event, got {other:?}"),
    }
    assert!(stream.try_next().await.unwrap().is_none(), "the watch ends");

    let exact = ListParams::default()
        .at(&old)
        .matching(kube_client::api::VersionMatch::Exact);
    match api.list(&exact).await {
        Err(kube_client::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected 410, got {other:?}"),
    }
    match api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
    {
        Err(kube_client::Error::Api(s)) => assert_eq!(s.code, 410),
        other => panic!("expected 410 for an old continue token, got {other:?}"),
    }
    // The current state is still served.
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        5
    );
}

#[tokio::test]
async fn an_exact_list_of_an_older_version_shows_the_state_then() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    create(&client, "a").await;
    let then = create(&client, "b").await.resource_version().unwrap();
    create(&client, "c").await;
    api.delete("a", &Default::default()).await.unwrap();
    api.patch(
        "b",
        &Default::default(),
        &kube_client::api::Patch::Merge(json!({ "data": { "v": "2" } })),
    )
    .await
    .unwrap();
    let list = api
        .list(
            &ListParams::default()
                .at(&then)
                .matching(kube_client::api::VersionMatch::Exact),
        )
        .await
        .expect("an exact list");
    assert_eq!(
        list.metadata.resource_version.as_deref(),
        Some(then.as_str())
    );
    let seen: Vec<(String, String)> = list
        .items
        .iter()
        .map(|c| (c.name_any(), c.data.as_ref().unwrap()["v"].clone()))
        .collect();
    assert_eq!(seen, [("a".into(), "1".into()), ("b".into(), "1".into())]);
}

#[tokio::test]
async fn close_watches_makes_a_watcher_rewatch_without_a_list() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (mut events, _task) = spawn_watcher(api, watcher::Config::default());
    until(&mut events, |e| matches!(e, watcher::Event::InitDone)).await;
    assert!(server.wait_for_watches(1, LIMIT).await);
    let before = server.requests();

    server.close_watches();
    assert!(server.wait_for_watches(1, LIMIT).await);
    create(&client, "after").await;
    match until(&mut events, |e| matches!(e, watcher::Event::Apply(_))).await {
        watcher::Event::Apply(cm) => assert_eq!(cm.name_any(), "after"),
        _ => unreachable!(),
    }
    let since = server.requests().since(&before);
    assert_eq!(since.of(Verb::List, "configmaps"), 0, "{since}");
    assert_eq!(since.of(Verb::Watch, "configmaps"), 1, "{since}");
}

#[tokio::test]
async fn bookmarks_reach_the_watches_that_asked_for_them() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let rv = server.resource_version().to_string();
    let mut with = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let mut without = api
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    assert!(server.wait_for_watches(2, LIMIT).await);
    server.bookmark();
    create(&client, "x").await;
    match with.try_next().await.unwrap() {
        Some(WatchEvent::Bookmark(b)) => {
            assert_eq!(b.metadata.resource_version, rv);
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
    assert!(matches!(
        with.try_next().await.unwrap(),
        Some(WatchEvent::Added(_))
    ));
    assert!(
        matches!(
            without.try_next().await.unwrap(),
            Some(WatchEvent::Added(_))
        ),
        "no bookmark without allowWatchBookmarks"
    );
}

#[tokio::test]
async fn the_history_limit_compacts_old_versions() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    server.set_history_limit(3);
    let first = create(&client, "h0").await.resource_version().unwrap();
    for i in 1..6 {
        create(&client, &format!("h{i}")).await;
    }
    let mut old = api
        .watch(&WatchParams::default(), &first)
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        old.try_next().await.unwrap(),
        Some(WatchEvent::Error(s)) if s.code == 410
    ));
    // Three changes back is still there.
    let recent = (server.resource_version() - 3).to_string();
    let mut fine = api
        .watch(&WatchParams::default(), &recent)
        .await
        .unwrap()
        .boxed();
    for name in ["h3", "h4", "h5"] {
        match fine.try_next().await.unwrap() {
            Some(WatchEvent::Added(cm)) => assert_eq!(cm.name_any(), name),
            other => panic!("expected {name}, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_streaming_list_needs_no_list_request() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    for name in ["s1", "s2"] {
        create(&client, name).await;
    }
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (mut events, _task) = spawn_watcher(api, watcher::Config::default().streaming_lists());
    assert!(matches!(next(&mut events).await, Ok(watcher::Event::Init)));
    for name in ["s1", "s2"] {
        match next(&mut events).await {
            Ok(watcher::Event::InitApply(cm)) => assert_eq!(cm.name_any(), name),
            other => panic!("expected {name}, got {other:?}"),
        }
    }
    assert!(matches!(
        next(&mut events).await,
        Ok(watcher::Event::InitDone)
    ));
    create(&client, "s3").await;
    match next(&mut events).await {
        Ok(watcher::Event::Apply(cm)) => assert_eq!(cm.name_any(), "s3"),
        other => panic!("expected s3, got {other:?}"),
    }
    let counts = server.requests();
    assert_eq!(counts.of(Verb::List, "configmaps"), 0, "{counts}");
    assert_eq!(counts.of(Verb::Watch, "configmaps"), 1, "{counts}");
}

#[tokio::test]
async fn timeout_seconds_ends_a_watch_cleanly() {
    let server = LocalApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let rv = server.resource_version().to_string();
    let started = tokio::time::Instant::now();
    let mut stream = api
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    let end = tokio::time::timeout(LIMIT, stream.try_next())
        .await
        .expect("the watch ends in time");
    assert!(matches!(end, Ok(None)), "a clean end, got {end:?}");
    assert!(started.elapsed() >= Duration::from_millis(900));
    // The watch is gone from the server's side too.
    let deadline = tokio::time::Instant::now() + LIMIT;
    while server.open_watches() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch stays open"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The server keeps real time: a test that pauses tokio's clock and lets
/// ten minutes pass on it does not time out a watch that asked for one
/// minute. (kube-runtime's watcher has an idle timeout of its own on the
/// test's clock, which such a test does fire: that one is the client's.)
#[tokio::test(start_paused = true)]
async fn a_paused_test_clock_does_not_hurry_the_server() {
    let server = LocalApiServer::start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let rv = server.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .expect("watch")
        .boxed();
    assert!(server.wait_for_watches(1, LIMIT).await);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(server.open_watches(), 1);
    create(&client, "later").await;
    match stream.try_next().await.expect("the watch goes on") {
        Some(WatchEvent::Added(cm)) => assert_eq!(cm.name_any(), "later"),
        other => panic!("expected the new object, got {other:?}"),
    }
    let counts = server.requests();
    assert_eq!(counts.of(Verb::Watch, "configmaps"), 1, "{counts}");
}
