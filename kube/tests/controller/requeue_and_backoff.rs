//! When a key comes back after a reconcile: `Action::requeue(d)` after
//! exactly `d` (a change earlier wins), `await_change` never; after an
//! error, the larger of the error policy's delay and the queue's per-key
//! backoff, which a success resets (kube-rs#1916).

use std::sync::Arc;
use std::time::Duration;

use tokio_workqueue::{Builder, ExponentialBackoff, WorkQueue};
use tokio_workqueue_kube::Action;

use crate::common::*;

const HOUR: Duration = Duration::from_secs(3600);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A queue whose per-key backoff is `base`, `2 base`, `4 base`, ... up to a
/// minute.
fn backoff(base: Duration) -> Builder<Key> {
    WorkQueue::builder().rate_limiter(ExponentialBackoff::new(base, secs(60)).unwrap())
}

#[tokio::test(start_paused = true)]
async fn requeue_comes_back_after_exactly_its_delay() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.run(
        record.reconciler(Duration::ZERO, |_, attempt| match attempt {
            1 => Ok(Action::requeue(secs(5))),
            2 => Ok(Action::requeue(ms(250))),
            _ => Ok(Action::await_change()),
        }),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(HOUR).await;

    assert_eq!(record.starts_of("a"), [ms(0), ms(5000), ms(5250)]);
    assert_eq!(
        run.reports(),
        [
            Reported::Ok("a".into(), Action::requeue(secs(5))),
            Reported::Ok("a".into(), Action::requeue(ms(250))),
            Reported::Ok("a".into(), Action::await_change()),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn await_change_does_not_come_back() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.run(
        record.reconciler(ms(3), |_, _| Ok(Action::await_change())),
        policy(Action::requeue(ms(1))),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(secs(86_400)).await;
    assert_eq!(record.count("a"), 1);
    // A change does bring it back.
    feed.apply(cm("a", "2"));
    advance(HOUR).await;
    assert_eq!(record.count("a"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_change_before_the_requeue_reconciles_at_once_and_the_earlier_time_wins() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.run(
        record.reconciler(Duration::ZERO, |_, attempt| match attempt {
            1 => Ok(Action::requeue(secs(10))),
            _ => Ok(Action::await_change()),
        }),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(secs(2)).await;
    feed.apply(cm("a", "2"));
    advance(HOUR).await;
    // At 2 s for the change; nothing at 10 s.
    assert_eq!(record.starts_of("a"), [secs(0), secs(2)]);
}

#[tokio::test(start_paused = true)]
async fn a_requeue_folds_into_a_change_that_came_during_the_reconcile() {
    // The first reconcile asks for 1 s, but the object changed while it ran:
    // the key comes back at once (the earlier time wins), and no extra
    // reconcile follows 1 s later; the second reconcile's hour counts from
    // its own end.
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.run(
        record.reconciler(ms(100), |_, attempt| match attempt {
            1 => Ok(Action::requeue(secs(1))),
            2 => Ok(Action::requeue(HOUR)),
            _ => Ok(Action::await_change()),
        }),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    // While the first reconcile runs, a change: reconciled again right after
    // it, and its 1 s requeue then folds into that.
    advance(ms(50)).await;
    feed.apply(cm("a", "2"));
    advance(secs(7200)).await;
    assert_eq!(
        record.starts_of("a"),
        [ms(0), ms(100), ms(200) + HOUR],
        "{:?}",
        record.runs_of("a")
    );
}

#[tokio::test(start_paused = true)]
async fn errors_back_off_per_key_even_when_the_policy_says_one_millisecond() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.queue(backoff(ms(100))).run(
        record.reconciler(Duration::ZERO, |name, attempt| {
            if name == "bad" && attempt < 5 {
                fail(&format!("attempt {attempt}"))
            } else {
                Ok(Action::await_change())
            }
        }),
        policy(Action::requeue(ms(1))),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list([cm("bad", "1"), cm("good", "1")]);
    advance(HOUR).await;

    assert_eq!(
        record.starts_of("bad"),
        [ms(0), ms(100), ms(300), ms(700), ms(1500)]
    );
    assert_eq!(record.count("good"), 1);
    let failures: Vec<_> = run
        .reports()
        .into_iter()
        .filter(|r| matches!(r, Reported::Failed(..)))
        .collect();
    assert_eq!(
        failures,
        (1..5)
            .map(|a| Reported::Failed("bad".into(), TestError(format!("attempt {a}"))))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn the_larger_of_the_policy_delay_and_the_backoff_wins() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.queue(backoff(ms(100))).run(
        record.reconciler(Duration::ZERO, |_, attempt| {
            if attempt < 6 {
                fail("again")
            } else {
                Ok(Action::await_change())
            }
        }),
        policy(Action::requeue(ms(500))),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(HOUR).await;
    // Backoff 100, 200, 400 under the policy's 500; then 800, 1600 over it.
    assert_eq!(
        record.starts_of("a"),
        [ms(0), ms(500), ms(1000), ms(1500), ms(2300), ms(3900)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_success_forgets_the_failures() {
    // kube-rs#1916: after a success the next failure backs off from the
    // base again.
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.queue(backoff(ms(100))).run(
        record.reconciler(Duration::ZERO, |_, attempt| match attempt {
            1 | 2 | 4 => fail("failed"),
            3 => Ok(Action::requeue(secs(1))),
            _ => Ok(Action::await_change()),
        }),
        policy(Action::requeue(ms(1))),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(HOUR).await;
    // 100, 200 (success), 1 s, then 100 again, not 400.
    assert_eq!(
        record.starts_of("a"),
        [ms(0), ms(100), ms(300), ms(1300), ms(1400)]
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_whose_policy_awaits_a_change_is_not_requeued() {
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.queue(backoff(ms(100))).run(
        record.reconciler(Duration::ZERO, |_, _| fail("broken")),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(HOUR).await;
    assert_eq!(record.count("a"), 1);
    assert_eq!(
        run.reports(),
        [Reported::Failed("a".into(), TestError("broken".into()))]
    );
    // A change brings it back at once (a change is not rate limited).
    feed.apply(cm("a", "2"));
    advance(ms(1)).await;
    assert_eq!(record.starts_of("a"), [ms(0), HOUR]);
}

#[tokio::test(start_paused = true)]
async fn errors_arrive_as_reconciler_failed_with_the_object() {
    use tokio_workqueue_kube::Error;

    let (feed, controller) = fed();
    let mut stream = Box::pin(controller.run(
        |object: Arc<k8s_openapi::api::core::v1::ConfigMap>, _: Arc<()>| async move {
            Err::<Action, _>(TestError(name_of(&*object)))
        },
        policy(Action::await_change()),
        Arc::new(()),
    ));
    feed.list([cm("a", "1")]);
    let item = within_a_day(futures::StreamExt::next(&mut stream))
        .await
        .expect("an item");
    match item {
        Err(Error::ReconcilerFailed(error, object)) => {
            assert_eq!(error, TestError("a".into()));
            assert_eq!(*object, key("a").erase());
            assert_eq!(object.to_string(), "ConfigMap.v1./a.default");
        }
        other => panic!("expected ReconcilerFailed, got {other:?}"),
    }
}
