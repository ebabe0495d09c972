//! The priority a reconciler chooses for its key's next requeue
//! (controller-runtime's `Result.Priority`), without changing kube-runtime's
//! `Action`: the reconcile calls [`set_requeue_priority`] while it runs.

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static CHOSEN: Cell<Option<i32>>;
}

/// Called inside a reconcile: its key's requeue, whether an
/// `Action::requeue(d)` or the retry of an error, goes in at `priority`
/// instead of the priority the key was handed out with. The last call wins;
/// a reconcile that does not call it keeps today's behaviour.
///
/// Returns `false`, and does nothing, outside a reconcile of a
/// [`Controller`](crate::Controller) (for example in a task the reconcile
/// spawned).
///
/// ```
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use tokio_workqueue_kube::{Action, set_requeue_priority};
///
/// # #[derive(Debug)] struct Error;
/// # impl std::fmt::Display for Error {
/// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("e") }
/// # }
/// # impl std::error::Error for Error {}
/// async fn reconcile(cm: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, Error> {
///     // A periodic re-check is not urgent: behind real changes.
///     set_requeue_priority(-100);
///     Ok(Action::requeue(std::time::Duration::from_secs(300)))
/// }
/// # assert!(!set_requeue_priority(1), "outside a reconcile");
/// ```
pub fn set_requeue_priority(priority: i32) -> bool {
    CHOSEN.try_with(|chosen| chosen.set(Some(priority))).is_ok()
}

/// Runs `reconcile` where [`set_requeue_priority`] reaches, and tells what
/// it chose.
pub(crate) async fn scoped<T>(reconcile: impl Future<Output = T>) -> (T, Option<i32>) {
    CHOSEN
        .scope(Cell::new(None), async {
            let out = reconcile.await;
            (out, CHOSEN.with(Cell::get))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_last_choice_inside_the_scope_wins_and_nothing_leaks_out() {
        let ((), chosen) = scoped(async {
            assert!(set_requeue_priority(3));
            tokio::task::yield_now().await;
            assert!(set_requeue_priority(-7));
        })
        .await;
        assert_eq!(chosen, Some(-7));
        assert_eq!(scoped(async {}).await.1, None);
        assert!(!set_requeue_priority(1));
    }
}
