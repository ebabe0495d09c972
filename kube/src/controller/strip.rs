//! [`Controller::strip_managed_fields`](super::Controller::strip_managed_fields):
//! managedFields removed from the main watcher's objects before the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::{Stream, StreamExt};
use kube_client::Resource;
use kube_runtime::watcher::{self, Event};

/// Whether the main watcher's events are stripped: made off with the
/// controller, turned on by the builder before the stream is first polled
/// (streams are lazy, so `run` sees the final setting).
#[derive(Clone, Default)]
pub(super) struct StripSwitch(Arc<AtomicBool>);

impl StripSwitch {
    pub(super) fn turn_on(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// `events`, with managedFields cleared from each object while the
    /// switch is on.
    pub(super) fn apply<K: Resource + Send + 'static>(
        &self,
        events: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    ) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static {
        let on = self.0.clone();
        events.map(move |event| {
            if !on.load(Ordering::Relaxed) {
                return event;
            }
            event.map(|e| e.modify(|o| o.meta_mut().managed_fields = None))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn managed() -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("a".into());
        cm.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubectl".into()),
            ..Default::default()
        }]);
        cm
    }

    async fn through(switch: &StripSwitch) -> Vec<Option<Vec<ManagedFieldsEntry>>> {
        let events = futures_util::stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply(managed())),
            Ok(Event::InitDone),
            Ok(Event::Apply(managed())),
            Ok(Event::Delete(managed())),
        ]);
        switch
            .apply(events)
            .filter_map(|e| async move {
                match e.expect("no errors") {
                    Event::InitApply(o) | Event::Apply(o) | Event::Delete(o) => {
                        Some(o.metadata.managed_fields)
                    }
                    Event::Init | Event::InitDone => None,
                }
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn strips_only_when_turned_on() {
        let switch = StripSwitch::default();
        assert!(through(&switch).await.iter().all(Option::is_some));
        switch.turn_on();
        assert_eq!(through(&switch).await, vec![None, None, None]);
    }
}
