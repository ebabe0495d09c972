//! What decides which key the controller reconciles next: real changes
//! before the initial list, re-lists and bulk reconciles; FIFO within a
//! priority even when every worker is busy; never one key twice at once.

use std::sync::Arc;
use std::time::Duration;

use tokio_workqueue_kube::{Action, Controller};

use crate::common::*;

const HOUR: Duration = Duration::from_secs(3600);

fn done(_: &str, _: usize) -> Answer {
    Ok(Action::await_change())
}

#[tokio::test(start_paused = true)]
async fn a_change_overtakes_a_thousand_object_initial_list() {
    let record = Record::new();
    let (feed, _run) = one_at_a_time(&record);

    feed.list(cms("obj", 1000));
    advance(ms(20)).await;
    let before = record.len();
    assert!((10..50).contains(&before), "{before} reconciled");
    feed.apply(cm("obj-990", "2"));
    advance(Duration::from_secs(5)).await;

    let runs = record.runs();
    assert_eq!(runs.len(), 1000, "each object once");
    // Right after the one in flight, not ~990th.
    assert_eq!(runs[before].name, "obj-990");
    assert_eq!(runs[before].rv.as_deref(), Some("2"));
    assert_eq!(record.count("obj-990"), 1);
    // The rest of the list kept its order.
    let rest: Vec<_> = runs[..before]
        .iter()
        .chain(&runs[before + 1..])
        .map(|r| r.name.clone())
        .collect();
    let expected: Vec<_> = (0..1000)
        .map(|i| format!("obj-{i:03}"))
        .filter(|n| n != "obj-990")
        .collect();
    assert_eq!(rest, expected);
}

#[tokio::test(start_paused = true)]
async fn a_relist_is_low_priority_and_changes_still_go_first() {
    let record = Record::new();
    let (feed, _run) = one_at_a_time(&record);

    let objects = cms("obj", 100);
    feed.list(objects.clone());
    advance(Duration::from_secs(1)).await;
    assert_eq!(record.len(), 100);

    // A re-list (after 410 Gone): the same resourceVersions, except obj-050
    // that changed while the watch was down.
    let relisted: Vec<_> = objects
        .iter()
        .map(|o| {
            if name_of(o) == "obj-050" {
                cm("obj-050", "2")
            } else {
                o.clone()
            }
        })
        .collect();
    feed.list(relisted);
    advance(ms(10)).await;
    // And a real change while the re-list is being reconciled.
    let before = record.len();
    assert!(before > 105 && before < 120, "{before}");
    feed.apply(cm("obj-080", "3"));
    advance(Duration::from_secs(1)).await;

    let runs = record.runs();
    assert_eq!(runs.len(), 200, "each object twice");
    assert_eq!(runs[100].name, "obj-050", "the changed object first");
    assert_eq!(runs[100].rv.as_deref(), Some("2"));
    assert_eq!(runs[before].name, "obj-080");
    assert_eq!(runs[before].rv.as_deref(), Some("3"));
    // The unchanged ones in list order.
    let unchanged: Vec<_> = runs[101..]
        .iter()
        .map(|r| r.name.clone())
        .filter(|n| n != "obj-080")
        .collect();
    let expected: Vec<_> = (0..100)
        .map(|i| format!("obj-{i:03}"))
        .filter(|n| n != "obj-050" && n != "obj-080")
        .collect();
    assert_eq!(unchanged, expected);
    assert_eq!(record.max_per_key(), 1);
}

#[tokio::test(start_paused = true)]
async fn reconcile_all_on_is_low_priority() {
    let record = Record::new();
    let (feed, controller) = fed();
    let (resync, resyncs) = sender::<()>();
    let stream = controller.concurrency(1).reconcile_all_on(resyncs).run(
        record.reconciler(ms(1), done),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);

    feed.list(cms("obj", 50));
    advance(Duration::from_secs(1)).await;
    assert_eq!(record.len(), 50);

    resync.send(());
    advance(ms(5)).await;
    let before = record.len();
    assert!(before > 50 && before < 60, "{before}");
    // The store hands out its objects in a hash map's order: change one the
    // resync has not reached yet.
    let reached = &record.starts()[50..];
    let changed = (0..50)
        .map(|i| format!("obj-{i:03}"))
        .rfind(|n| !reached.contains(n))
        .unwrap();
    feed.apply(cm(&changed, "2"));
    advance(Duration::from_secs(1)).await;

    let runs = record.runs();
    assert_eq!(runs.len(), 100, "every object once more");
    assert_eq!(runs[before].name, changed);
    // Every object once more (in the store's order, which is a hash map's).
    let mut resynced: Vec<_> = runs[50..].iter().map(|r| r.name.clone()).collect();
    resynced.sort();
    let expected: Vec<_> = (0..50).map(|i| format!("obj-{i:03}")).collect();
    assert_eq!(resynced, expected);
}

#[tokio::test(start_paused = true)]
async fn reconcile_on_is_normal_priority() {
    let record = Record::new();
    let (feed, controller) = fed();
    let (requests, requested) = sender();
    let stream = controller.concurrency(1).reconcile_on(requested).run(
        record.reconciler(ms(1), done),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);

    feed.list(cms("obj", 100));
    advance(ms(5)).await;
    let before = record.len();
    requests.send(key("obj-095"));
    requests.send(key("obj-090"));
    advance(Duration::from_secs(1)).await;
    let starts = record.starts();
    assert_eq!(starts.len(), 100);
    assert_eq!(starts[before..before + 2], ["obj-095", "obj-090"]);
}

#[tokio::test(start_paused = true)]
async fn fifo_within_a_priority_while_every_worker_is_busy() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.concurrency(3).run(
        record.reconciler(ms(10), done),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);

    // Neither sorted by name nor by anything the queue could sort by.
    let order: Vec<String> = (0..30).map(|i| format!("obj-{:03}", i * 7 % 30)).collect();
    feed.list(order.iter().map(|n| cm(n, "1")));
    advance(ms(25)).await;
    // 3 running, 6 done: the workers are busy and 21 keys wait.
    let before = record.len();
    assert_eq!(before, 9);
    assert_eq!(record.running(), 3);
    // Changes to keys still waiting in the list, in an order of their own.
    let changed = ["obj-002", "obj-004", "obj-027", "obj-011", "obj-023"];
    for n in changed {
        assert!(!record.starts().contains(&n.to_string()));
        feed.apply(cm(n, "2"));
    }
    advance(Duration::from_secs(1)).await;

    let starts = record.starts();
    assert_eq!(starts.len(), 30);
    assert_eq!(starts[..before], order[..before]);
    assert_eq!(starts[before..before + 5], changed);
    let rest: Vec<_> = order[before..]
        .iter()
        .filter(|n| !changed.contains(&n.as_str()))
        .cloned()
        .collect();
    assert_eq!(starts[before + 5..], rest);
    assert_eq!(record.max_concurrency(), 3);
}

#[tokio::test(start_paused = true)]
async fn never_one_key_twice_at_once_through_a_burst_of_changes() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.concurrency(8).run(
        record.reconciler(ms(10), done),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);

    feed.list(cms("obj", 5));
    for round in 0..200 {
        advance(ms(1)).await;
        let n = round % 5;
        feed.apply(cm(&format!("obj-{n:03}"), &format!("{}", round + 2)));
    }
    advance(HOUR).await;

    assert_eq!(record.max_per_key(), 1, "a key reconciled twice at once");
    assert!(record.max_concurrency() > 1, "keys ran side by side");
    for n in 0..5 {
        let name = format!("obj-{n:03}");
        let runs = record.runs_of(&name);
        for pair in runs.windows(2) {
            assert!(pair[0].end.unwrap() <= pair[1].start, "{name}: {pair:?}");
        }
        // The last change of each key was reconciled.
        let last_rv = (0..200).filter(|r| r % 5 == n).max().unwrap() + 2;
        assert_eq!(runs.last().unwrap().rv, Some(last_rv.to_string()));
        // Changes while reconciling were folded, not each reconciled.
        assert!(runs.len() < 40, "{name}: {} runs", runs.len());
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_changed_while_reconciling_is_reconciled_again_after() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.concurrency(4).run(
        record.reconciler(ms(10), done),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);

    feed.list([cm("a", "1")]);
    advance(ms(5)).await;
    feed.apply(cm("a", "2"));
    advance(HOUR).await;

    let runs = record.runs_of("a");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0].rv.as_deref(), Some("1"));
    assert_eq!((runs[0].start, runs[0].end), (ms(0), Some(ms(10))));
    // Again at once when the first ended, with the new version.
    assert_eq!(runs[1].start, ms(10));
    assert_eq!(runs[1].rv.as_deref(), Some("2"));
}

#[tokio::test(start_paused = true)]
async fn an_unchanged_redelivery_is_low_priority() {
    let record = Record::new();
    let (feed, _run) = one_at_a_time(&record);
    let objects = cms("obj", 50);
    feed.list(objects.clone());
    advance(ms(5)).await;
    let before = record.len();
    assert!(before < 40, "{before}");
    // obj-045 again with the resourceVersion the list had: not a change.
    feed.apply(objects[45].clone());
    feed.apply(cm("obj-046", "2"));
    advance(Duration::from_secs(1)).await;
    let starts = record.starts();
    assert_eq!(starts.len(), 50);
    assert_eq!(starts[before], "obj-046");
    let rest: Vec<_> = starts[before + 1..].to_vec();
    let expected = names("obj", before..50, &[46]);
    assert_eq!(rest, expected);
}

#[tokio::test(start_paused = true)]
async fn a_retry_keeps_the_priority_its_key_was_handed_out_with() {
    // Listed `slow-retry` and changed `fast-retry` both fail once; with a
    // backlog of listed keys, the listed one's retry waits behind the
    // backlog, the changed one's overtakes it.
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller
        .concurrency(1)
        .queue(tokio_workqueue::WorkQueue::builder().rate_limiter(
            tokio_workqueue::ExponentialBackoff::new(ms(50), Duration::from_secs(1)).unwrap(),
        ))
        .run(
            record.reconciler(ms(1), |name, attempt| {
                if name.ends_with("retry") && attempt == 1 {
                    fail("once")
                } else {
                    Ok(Action::await_change())
                }
            }),
            policy(Action::requeue(ms(1))),
            Arc::new(()),
        );
    let _run = Collected::spawn(&record, stream);
    let mut listed = vec![cm("slow-retry", "1")];
    listed.extend(cms("obj", 300));
    feed.list(listed);
    feed.apply(cm("fast-retry", "1"));
    advance(Duration::from_secs(2)).await;

    let slow = record.starts_of("slow-retry");
    let fast = record.starts_of("fast-retry");
    assert_eq!(fast, [ms(0), ms(51)], "the changed key's retry, on time");
    assert_eq!(slow[0], ms(1));
    // Ready at 52 ms, at the low priority: after the 300 listed keys.
    assert_eq!(
        record.starts().last().map(String::as_str),
        Some("slow-retry")
    );
    assert!(slow[1] > ms(300), "{slow:?}");
}

#[tokio::test(start_paused = true)]
async fn for_stream_lists_low_and_changes_normal() {
    use kube_runtime::watcher::Event;

    let record = Record::new();
    let (reader, mut writer) = kube_runtime::reflector::store();
    let (objects, object_stream) = sender();
    let stream = Controller::for_stream(object_stream, reader)
        .concurrency(1)
        .run(
            record.reconciler(ms(1), done),
            policy(Action::await_change()),
            Arc::new(()),
        );
    let _run = Collected::spawn(&record, stream);

    writer.apply_watcher_event(&Event::Init);
    for object in cms("obj", 50) {
        writer.apply_watcher_event(&Event::InitApply(object.clone()));
        objects.object(object);
    }
    // The controller sees the objects before the store is ready.
    advance(ms(10)).await;
    writer.apply_watcher_event(&Event::InitDone);
    advance(ms(5)).await;
    let before = record.len();
    assert!((3..10).contains(&before), "{before}");
    // The same version again (low), then a new one (a change).
    objects.object(cm("obj-045", "1"));
    let changed = cm("obj-040", "2");
    writer.apply_watcher_event(&Event::Apply(changed.clone()));
    objects.object(changed);
    advance(Duration::from_secs(1)).await;

    let runs = record.runs();
    assert_eq!(runs.len(), 50);
    assert_eq!(runs[before].name, "obj-040");
    assert_eq!(runs[before].rv.as_deref(), Some("2"));
    let rest: Vec<_> = runs[before + 1..].iter().map(|r| r.name.clone()).collect();
    let expected = names("obj", before..50, &[40]);
    assert_eq!(rest, expected);
}

/// A re-list's objects are queued when the list completes, when the store
/// holds them: a change the re-list brings is reconciled with the new
/// object, not the one the store held before the list.
#[tokio::test(start_paused = true)]
async fn a_relisted_change_is_reconciled_with_the_listed_object() {
    let record = Record::new();
    let (feed, _run) = one_at_a_time(&record);
    feed.list(cms("obj", 3));
    advance(Duration::from_secs(1)).await;
    assert_eq!(record.len(), 3);

    // The re-list arrives slowly: obj-001 changed while the watch was down.
    feed.init();
    feed.init_apply(cm("obj-001", "2"));
    advance(Duration::from_secs(1)).await;
    assert_eq!(record.len(), 3, "nothing starts in the middle of a list");
    feed.init_apply(cm("obj-000", "1"));
    feed.init_apply(cm("obj-002", "1"));
    feed.init_done();
    advance(Duration::from_secs(1)).await;

    let runs = record.runs();
    assert_eq!(runs.len(), 6);
    assert_eq!(runs[3].name, "obj-001", "the change first");
    assert_eq!(runs[3].rv.as_deref(), Some("2"), "with the listed object");
}

#[tokio::test(start_paused = true)]
async fn a_reconciler_chooses_the_priority_of_its_retry() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::sync::Mutex;
    use tokio_workqueue_kube::set_requeue_priority;

    // One worker, a 20-object initial list (low priority); obj-000 fails
    // once. Its retry, 5 ms of backoff later, is chosen urgent (10): it
    // overtakes the rest of the list instead of queueing behind it.
    for (chosen, expect_last) in [(Some(10), false), (None, true)] {
        let (feed, controller) = fed();
        let order = Arc::new(Mutex::new(Vec::<String>::new()));
        let stream = controller.concurrency(1).run(
            move |cm: Arc<ConfigMap>, order: Arc<Mutex<Vec<String>>>| async move {
                let name = cm.metadata.name.clone().unwrap();
                tokio::time::sleep(ms(1)).await;
                let first = {
                    let mut order = order.lock().unwrap();
                    order.push(name.clone());
                    order.iter().filter(|n| **n == name).count() == 1
                };
                if name == "obj-000" && first {
                    if let Some(p) = chosen {
                        assert!(set_requeue_priority(p));
                    }
                    return fail("once");
                }
                Ok(Action::await_change())
            },
            policy(Action::requeue(ms(1))),
            order.clone(),
        );
        let record = Record::new();
        let _run = Collected::spawn(&record, stream);
        feed.list(cms("obj", 20));
        advance(Duration::from_secs(1)).await;
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len(), 21, "{order:?}");
        let retry = order.iter().rposition(|n| n == "obj-000").unwrap();
        assert_eq!(retry == 20, expect_last, "chosen {chosen:?}: {order:?}");
    }
}
