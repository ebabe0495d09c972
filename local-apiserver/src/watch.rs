//! Watches: who is watching what, and which event each change becomes for
//! each of them.
//!
//! A watch sees a change as the watch cache of a real apiserver shows it
//! through its selectors: an object that starts matching arrives as
//! `ADDED`, one that stops matching leaves as `DELETED` (carrying its last
//! matching state, at the version of the change that made it leave), one
//! that matches before and after is `MODIFIED`. Events are JSON
//! lines queued on an unbounded channel to the connection that streams
//! them, so a slow reader never blocks a writer.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::kinds::{KindSpec, Resource};
use crate::selector::{FieldSelector, LabelSelector};

/// What a watch's connection receives.
#[derive(Debug)]
pub(crate) enum WatchMsg {
    /// One event line (JSON and a newline).
    Line(String),
    /// End the stream cleanly (the client resumes from its last version).
    End,
}

/// Change types as watch events name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One open watch.
#[derive(Debug)]
pub(crate) struct WatchSub {
    pub resource: Resource,
    /// Kind and apiVersion the watch was opened with (objects and
    /// bookmarks are presented in it).
    pub kind: String,
    pub api_version: String,
    /// Only this namespace (`None`: all).
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// Wants `BOOKMARK` events.
    pub bookmarks: bool,
    /// Send `PartialObjectMetadata` instead of whole objects.
    pub metadata_only: bool,
    pub tx: mpsc::UnboundedSender<WatchMsg>,
}

impl WatchSub {
    pub fn new(
        kind: &KindSpec,
        namespace: Option<String>,
        labels: LabelSelector,
        fields: FieldSelector,
        bookmarks: bool,
        metadata_only: bool,
        tx: mpsc::UnboundedSender<WatchMsg>,
    ) -> WatchSub {
        WatchSub {
            resource: kind.resource(),
            kind: kind.kind.clone(),
            api_version: kind.api_version(),
            namespace,
            labels,
            fields,
            bookmarks,
            metadata_only,
            tx,
        }
    }

    /// Whether `object` (of this watch's resource) is in view.
    pub fn sees(&self, namespace: &str, object: &Value) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == namespace)
            && self.labels.matches(object)
            && self.fields.matches(object)
    }

    /// The event type this watch gets for a change from `prev` to `object`
    /// (`Deleted` changes carry the last state in `object`).
    pub fn event_for(
        &self,
        namespace: &str,
        ty: EventType,
        object: &Value,
        prev: Option<&Value>,
    ) -> Option<EventType> {
        let now = self.sees(namespace, object);
        let before = prev.is_some_and(|p| self.sees(namespace, p));
        match ty {
            EventType::Added => now.then_some(EventType::Added),
            EventType::Deleted => (now || before).then_some(EventType::Deleted),
            EventType::Modified => match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            },
        }
    }

    /// Queues what this watch sees of `change`: `None` when it sees nothing,
    /// else whether the watch is still there.
    pub(crate) fn send_change(&self, change: &Change) -> Option<bool> {
        let ty = self.event_for(
            &change.namespace,
            change.ty,
            &change.object,
            change.prev.as_deref(),
        )?;
        match (change.ty, ty, &change.prev) {
            // Leaving the selector: kube-apiserver's watch cache sends the
            // state that last matched, so a watcher never sees an object
            // its selector excludes, at the version of the change.
            (EventType::Modified, EventType::Deleted, Some(prev)) => {
                let mut last = (**prev).clone();
                last["metadata"]["resourceVersion"] =
                    change.object["metadata"]["resourceVersion"].clone();
                Some(self.send_event(ty, &last))
            }
            _ => Some(self.send_event(ty, &change.object)),
        }
    }

    /// Queues an event; false when the watch is gone.
    pub fn send_event(&self, ty: EventType, object: &Value) -> bool {
        let line = if self.metadata_only {
            event_line(ty.as_str(), &metadata_only(object))
        } else if object.get("apiVersion").and_then(Value::as_str) == Some(&self.api_version) {
            event_line(ty.as_str(), object)
        } else {
            let mut o = object.clone();
            o["apiVersion"] = Value::String(self.api_version.clone());
            event_line(ty.as_str(), &o)
        };
        self.tx.send(WatchMsg::Line(line)).is_ok()
    }

    /// Queues a `BOOKMARK` at `rv` (with the initial-events-end annotation
    /// when `initial_end`); false when the watch is gone.
    pub fn send_bookmark(&self, rv: u64, initial_end: bool) -> bool {
        let mut object = json!({
            "kind": self.kind,
            "apiVersion": self.api_version,
            "metadata": { "resourceVersion": rv.to_string(), "creationTimestamp": null },
        });
        if self.metadata_only {
            object["kind"] = json!("PartialObjectMetadata");
            object["apiVersion"] = json!("meta.k8s.io/v1");
        }
        if initial_end {
            object["metadata"]["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        self.tx
            .send(WatchMsg::Line(event_line("BOOKMARK", &object)))
            .is_ok()
    }

    /// Queues an `ERROR` event with `status` and ends the stream.
    pub fn send_error_and_end(&self, status: &Value) {
        let _ = self.tx.send(WatchMsg::Line(event_line("ERROR", status)));
        let _ = self.tx.send(WatchMsg::End);
    }
}

/// `{"type":..,"object":..}` and a newline, written around the object
/// (which `json!` would deep-copy first, for every event and watcher).
pub(crate) fn event_line(ty: &str, object: &Value) -> String {
    #[derive(serde::Serialize)]
    struct Event<'a> {
        #[serde(rename = "type")]
        ty: &'a str,
        object: &'a Value,
    }
    let mut line = serde_json::to_string(&Event { ty, object }).expect("JSON values serialize");
    line.push('\n');
    line
}

/// The `PartialObjectMetadata` view of an object.
pub(crate) fn metadata_only(object: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// One recorded change: what a watch resuming from an earlier version
/// replays.
#[derive(Debug)]
pub(crate) struct Change {
    pub rv: u64,
    pub resource: Resource,
    pub namespace: String,
    pub name: String,
    pub ty: EventType,
    /// The new state (for `Deleted`: the last state, at the deletion's
    /// version).
    pub object: Arc<Value>,
    /// The state before (`None` for `Added`).
    pub prev: Option<Arc<Value>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(labels: &str) -> (WatchSub, mpsc::UnboundedReceiver<WatchMsg>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let kind = KindSpec::namespaced("", "v1", "ConfigMap", "configmaps");
        let s = WatchSub::new(
            &kind,
            Some("ns".into()),
            LabelSelector::parse(labels).unwrap(),
            FieldSelector::default(),
            true,
            false,
            tx,
        );
        (s, rx)
    }

    #[test]
    fn selector_transitions_become_added_and_deleted() {
        let (s, _rx) = sub("app=web");
        let web = json!({ "metadata": { "labels": { "app": "web" } } });
        let db = json!({ "metadata": { "labels": { "app": "db" } } });
        use EventType::*;
        assert_eq!(s.event_for("ns", Added, &web, None), Some(Added));
        assert_eq!(s.event_for("ns", Added, &db, None), None);
        assert_eq!(s.event_for("ns", Modified, &web, Some(&db)), Some(Added));
        assert_eq!(s.event_for("ns", Modified, &db, Some(&web)), Some(Deleted));
        assert_eq!(
            s.event_for("ns", Modified, &web, Some(&web)),
            Some(Modified)
        );
        assert_eq!(s.event_for("ns", Modified, &db, Some(&db)), None);
        assert_eq!(s.event_for("ns", Deleted, &web, Some(&web)), Some(Deleted));
        assert_eq!(s.event_for("other", Added, &web, None), None);
    }

    #[test]
    fn leaving_the_selector_sends_the_last_match_at_the_new_version() {
        let (s, mut rx) = sub("app=web");
        let change = Change {
            rv: 8,
            resource: Resource {
                group: String::new(),
                plural: "configmaps".into(),
            },
            namespace: "ns".into(),
            name: "c".into(),
            ty: EventType::Modified,
            object: Arc::new(json!({
                "metadata": { "labels": { "app": "db" }, "resourceVersion": "8" },
                "data": { "v": "new" },
            })),
            prev: Some(Arc::new(json!({
                "metadata": { "labels": { "app": "web" }, "resourceVersion": "7" },
                "data": { "v": "old" },
            }))),
        };
        assert_eq!(s.send_change(&change), Some(true));
        let WatchMsg::Line(l) = rx.try_recv().unwrap() else {
            panic!()
        };
        let v: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["type"], "DELETED");
        assert_eq!(v["object"]["metadata"]["labels"]["app"], "web");
        assert_eq!(v["object"]["metadata"]["resourceVersion"], "8");
        assert_eq!(v["object"]["data"]["v"], "old");
    }

    #[test]
    fn lines_carry_the_watched_api_version() {
        let (s, mut rx) = sub("");
        assert!(s.send_event(
            EventType::Added,
            &json!({ "apiVersion": "v0", "metadata": {} })
        ));
        assert!(s.send_bookmark(7, true));
        let WatchMsg::Line(l) = rx.try_recv().unwrap() else {
            panic!()
        };
        let v: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["object"]["apiVersion"], "v1");
        let WatchMsg::Line(l) = rx.try_recv().unwrap() else {
            panic!()
        };
        let v: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["type"], "BOOKMARK");
        assert_eq!(v["object"]["metadata"]["resourceVersion"], "7");
        assert_eq!(
            v["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
    }
}
