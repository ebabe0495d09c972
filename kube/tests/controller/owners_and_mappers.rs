//! Related objects trigger keys of the controller's kind: children by their
//! ownerReferences (`owns_stream`, owners of this kind only), other objects
//! through a mapper (`watches_stream`). Children first seen before the main
//! store is ready count as part of the initial list (low priority); later
//! ones as changes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use tokio_workqueue_kube::Action;

use crate::common::*;

fn done(_: &str, _: usize) -> Answer {
    Ok(Action::await_change())
}

#[tokio::test(start_paused = true)]
async fn children_trigger_their_owners_of_this_kind_only() {
    let record = Record::new();
    let (feed, controller) = fed();
    let (secrets, secret_stream) = sender();
    let (configmaps, configmap_stream) = sender();
    let stream = controller
        .owns_stream::<Secret>(secret_stream)
        .owns_stream::<ConfigMap>(configmap_stream)
        .run(
            record.reconciler(ms(1), done),
            policy(Action::await_change()),
            Arc::new(()),
        );
    let run = Collected::spawn(&record, stream);
    feed.list(["o1", "o2", "o3"].map(|n| cm(n, "1")));
    advance(ms(10)).await;
    assert_eq!(record.len(), 3);

    // Owned by a ConfigMap: its owner.
    secrets.object(object::<Secret>("s1").owner::<ConfigMap>("o1").build());
    advance(ms(10)).await;
    assert_eq!(record.starts()[3..], ["o1"]);
    // Owned by a Deployment of the same name: not ours.
    secrets.object(object::<Secret>("s2").owner::<Deployment>("o2").build());
    // No owner at all.
    secrets.object(object::<Secret>("s3").build());
    advance(ms(10)).await;
    assert_eq!(record.len(), 4);
    // Two owners of our kind (and one not): both ours.
    secrets.object(
        object::<Secret>("s4")
            .owner::<ConfigMap>("o2")
            .owner::<Deployment>("o1")
            .owner::<ConfigMap>("o3")
            .build(),
    );
    // A ConfigMap child of a ConfigMap.
    configmaps.object(object::<ConfigMap>("c1").owner::<ConfigMap>("o3").build());
    advance(ms(10)).await;
    let mut later = record.starts()[4..].to_vec();
    later.sort();
    assert_eq!(later, ["o2", "o3"], "o3 once: its two triggers folded");
    // An owner that is not in the store: reported, not reconciled.
    secrets.object(object::<Secret>("s5").owner::<ConfigMap>("ghost").build());
    advance(ms(10)).await;
    assert_eq!(record.count("ghost"), 0);
    assert_eq!(
        run.reports().last(),
        Some(&Reported::NotFound("ghost".into()))
    );
}

#[tokio::test(start_paused = true)]
async fn a_mapper_picks_the_keys() {
    let record = Record::new();
    let (feed, controller) = fed();
    let (secrets, secret_stream) = sender();
    let stream = controller
        .watches_stream(secret_stream, |secret: Secret| {
            secret
                .metadata
                .labels
                .unwrap_or_default()
                .get("for")
                .map(|names| names.split(',').map(key).collect::<Vec<_>>())
                .unwrap_or_default()
        })
        .run(
            record.reconciler(ms(1), done),
            policy(Action::await_change()),
            Arc::new(()),
        );
    let _run = Collected::spawn(&record, stream);
    feed.list(["a", "b", "c"].map(|n| cm(n, "1")));
    advance(ms(10)).await;
    assert_eq!(record.len(), 3);

    secrets.object(object::<Secret>("s1").label("for", "b").build());
    advance(ms(10)).await;
    assert_eq!(record.starts()[3..], ["b"]);
    secrets.object(object::<Secret>("s2").label("for", "a,c").build());
    secrets.object(object::<Secret>("s3").build());
    advance(ms(10)).await;
    let mut later = record.starts()[4..].to_vec();
    later.sort();
    assert_eq!(later, ["a", "c"]);
}

#[tokio::test(start_paused = true)]
async fn children_first_seen_before_the_store_is_ready_are_low_priority() {
    let record = Record::new();
    let (feed, controller) = fed();
    let (secrets, secret_stream) = sender();
    let stream = controller
        .concurrency(1)
        .owns_stream::<Secret>(secret_stream)
        .run(
            record.reconciler(ms(1), done),
            policy(Action::await_change()),
            Arc::new(()),
        );
    let _run = Collected::spawn(&record, stream);
    let listed_child = object::<Secret>("early")
        .owner::<ConfigMap>("o-049")
        .build();

    feed.init();
    for object in cms("o", 50) {
        feed.init_apply(object);
    }
    advance(ms(10)).await;
    // The children's own list arrives before the main list is complete.
    secrets.object(listed_child.clone());
    advance(ms(10)).await;
    assert_eq!(record.len(), 0);
    feed.init_done();
    tokio::task::yield_now().await;
    // The child queued its owner (low) while the main list was still held
    // back (its triggers wait for `InitDone`, when the store has the list).
    assert_eq!(record.starts(), ["o-049"]);
    // After: the same child unchanged (low), and a new one (a change).
    secrets.object(listed_child);
    secrets.object(object::<Secret>("late").owner::<ConfigMap>("o-040").build());
    advance(Duration::from_secs(1)).await;

    let starts = record.starts();
    assert_eq!(starts[..2], ["o-049", "o-040"], "{starts:?}");
    // The list in its order, then o-049 again: the unchanged child came
    // while o-049 was in flight, so it went to the back of the low level.
    let mut expected = names("o", 0..49, &[40]);
    expected.push("o-049".to_string());
    assert_eq!(starts[2..], expected);
}
