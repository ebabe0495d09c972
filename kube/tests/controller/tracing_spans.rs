//! Each reconcile runs inside a span named `reconciling object` with
//! `object.ref` (the key) and `object.reason` (kube-runtime's
//! `ReconcileReason`, as kube-runtime words it); panics are logged with the
//! key. Captured by a small subscriber written here.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use tokio_workqueue_kube::Action;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record as Values};
use tracing::subscriber::{DefaultGuard, Interest, NoSubscriber, Subscriber};
use tracing::{Dispatch, Event, Level, Metadata};

use crate::common::*;

/// tracing-core caches whether a callsite is wanted when the callsite is
/// first hit. While one dispatcher is registered, it asks only the default
/// of the thread that hit it: a test of another module of this binary
/// (which sets no subscriber) hitting the controller's `reconciling object`
/// span first, on its own thread, would cache "never" while a `Capture`
/// runs on this one, and the capture would miss the span. With two or more
/// registered, tracing-core asks every one of them (under a lock), so a
/// second one that lives as long as the process, and wants nothing, makes
/// the answer "ask each time", on every thread.
fn ask_every_dispatcher() {
    static KEEP: OnceLock<Dispatch> = OnceLock::new();
    KEEP.get_or_init(|| Dispatch::new(NoSubscriber::default()));
}

/// A span or an event: its name (or message) and fields, in order.
#[derive(Debug, Clone, Default)]
struct Captured {
    name: String,
    level: Option<Level>,
    fields: Vec<(String, String)>,
    /// For events: the innermost span entered when it happened.
    within: Option<u64>,
}

impl Captured {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Visit for Captured {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.fields
            .push((field.name().to_string(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields
            .push((field.name().to_string(), value.to_string()));
    }
}

#[derive(Default)]
struct State {
    next: u64,
    spans: HashMap<u64, Captured>,
    /// Entered spans, innermost last (tests run on one thread).
    entered: Vec<u64>,
    events: Vec<Captured>,
}

/// Records every span and event.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<State>>);

impl Subscriber for Capture {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::always()
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut span = Captured {
            name: attrs.metadata().name().to_string(),
            level: Some(*attrs.metadata().level()),
            ..Captured::default()
        };
        attrs.record(&mut span);
        let mut state = self.0.lock().unwrap();
        state.next += 1;
        let id = state.next;
        state.spans.insert(id, span);
        Id::from_u64(id)
    }

    fn record(&self, id: &Id, values: &Values<'_>) {
        let mut state = self.0.lock().unwrap();
        if let Some(span) = state.spans.get_mut(&id.into_u64()) {
            values.record(span);
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut captured = Captured {
            name: event.metadata().name().to_string(),
            level: Some(*event.metadata().level()),
            ..Captured::default()
        };
        event.record(&mut captured);
        let mut state = self.0.lock().unwrap();
        captured.within = state.entered.last().copied();
        state.events.push(captured);
    }

    fn enter(&self, id: &Id) {
        self.0.lock().unwrap().entered.push(id.into_u64());
    }

    fn exit(&self, id: &Id) {
        let mut state = self.0.lock().unwrap();
        if let Some(at) = state.entered.iter().rposition(|&e| e == id.into_u64()) {
            state.entered.remove(at);
        }
    }
}

impl Capture {
    fn install() -> (Self, DefaultGuard) {
        ask_every_dispatcher();
        let capture = Capture::default();
        let guard = tracing::subscriber::set_default(capture.clone());
        (capture, guard)
    }

    /// For each event with `marker` (one per reconcile, emitted by the
    /// reconciler): the `reconciling object` span it happened in, as
    /// (object.ref, object.reason).
    fn reconciles(&self, marker: &str) -> Vec<(String, String)> {
        let state = self.0.lock().unwrap();
        state
            .events
            .iter()
            .filter(|e| e.field("marker") == Some(marker))
            .map(|e| {
                let span = e
                    .within
                    .and_then(|id| state.spans.get(&id))
                    .unwrap_or_else(|| panic!("{marker} outside any span"));
                assert_eq!(span.name, "reconciling object");
                assert_eq!(span.level, Some(Level::INFO));
                (
                    span.field("object.ref").expect("object.ref").to_string(),
                    span.field("object.reason")
                        .expect("object.reason")
                        .to_string(),
                )
            })
            .collect()
    }

    fn events(&self) -> Vec<Captured> {
        self.0.lock().unwrap().events.clone()
    }
}

/// A reconciler that logs, in its future, which object it reconciles, and
/// answers `answer(name, attempt)`.
fn traced(
    record: &Record,
    answer: impl Fn(&str, usize) -> Answer + Send + Sync + 'static,
) -> impl FnMut(Arc<ConfigMap>, Arc<()>) -> futures::future::BoxFuture<'static, Answer> + Send + 'static
{
    let mut inner = record.reconciler(ms(1), answer);
    move |object, ctx| {
        // While making the future: inside the span too.
        tracing::info!(marker = "making", name = %name_of(&*object));
        let future = inner(object.clone(), ctx);
        Box::pin(async move {
            tracing::info!(marker = "inside", name = %name_of(&*object));
            future.await
        })
    }
}

fn r(name: &str) -> String {
    format!("ConfigMap.v1./{name}.default")
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| (r(a), b.to_string())).collect()
}

#[tokio::test(start_paused = true)]
async fn object_updated_and_the_retries_each_have_their_reason() {
    let (capture, _guard) = Capture::install();
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.concurrency(1).run(
        traced(&record, |name, attempt| match (name, attempt) {
            ("a", 1) => Ok(Action::requeue(Duration::from_secs(1))),
            ("b", 1) => fail("once"),
            _ => Ok(Action::await_change()),
        }),
        policy(Action::requeue(Duration::from_secs(2))),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1"), cm("b", "1")]);
    advance(Duration::from_secs(10)).await;

    let expected = pairs(&[
        ("a", "object updated"),
        ("b", "object updated"),
        ("a", "reconciler requested retry"),
        ("b", "error policy requested retry"),
    ]);
    assert_eq!(capture.reconciles("inside"), expected);
    assert_eq!(capture.reconciles("making"), expected);
}

#[tokio::test(start_paused = true)]
async fn related_bulk_and_requested_reconciles_have_their_reason() {
    let (capture, _guard) = Capture::install();
    let record = Record::new();
    let (feed, controller) = fed();
    let (children, child_stream) = sender();
    let (resync, resyncs) = sender();
    let (requests, requested) = sender();
    let stream = controller
        .concurrency(1)
        .owns_stream::<Secret>(child_stream)
        .reconcile_all_on(resyncs)
        .reconcile_on(requested)
        .run(
            traced(&record, |_, _| Ok(Action::await_change())),
            policy(Action::await_change()),
            Arc::new(()),
        );
    let _run = Collected::spawn(&record, stream);
    feed.list([cm("a", "1")]);
    advance(ms(10)).await;
    children.object(object::<Secret>("child").owner::<ConfigMap>("a").build());
    advance(ms(10)).await;
    resync.send(());
    advance(ms(10)).await;
    requests.send(key("a"));
    advance(ms(10)).await;

    assert_eq!(
        capture.reconciles("inside"),
        pairs(&[
            ("a", "object updated"),
            ("a", "related object updated: Secret.v1./child.default"),
            ("a", "bulk reconcile requested"),
            ("a", "unknown"),
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn the_first_reason_wins_but_a_retry_gives_way_to_a_fresh_trigger() {
    let (capture, _guard) = Capture::install();
    let record = Record::new();
    let (feed, controller) = fed();
    let (requests, requested) = sender();
    let stream = controller.concurrency(1).reconcile_on(requested).run(
        traced(&record, |name, attempt| match (name, attempt) {
            ("a", 1) => Ok(Action::requeue(Duration::from_secs(60))),
            _ => Ok(Action::await_change()),
        }),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);
    // `b` waits behind `a` (concurrency 1), queued as "object updated"; a
    // request for it while queued keeps that reason.
    feed.list([cm("a", "1"), cm("b", "1")]);
    tokio::task::yield_now().await;
    assert_eq!(record.starts(), ["a"]);
    requests.send(key("b"));
    advance(ms(10)).await;
    // `a` waits on its retry; a change replaces the retry's reason.
    feed.apply(cm("a", "2"));
    advance(Duration::from_secs(120)).await;

    assert_eq!(
        capture.reconciles("inside"),
        pairs(&[
            ("a", "object updated"),
            ("b", "object updated"),
            ("a", "object updated"),
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn panics_and_timeouts_are_logged_with_the_object() {
    let (capture, _guard) = Capture::install();
    let record = Record::new();
    let (feed, controller) = fed();
    let stream = controller.reconcile_timeout(ms(50)).run(
        record.reconciler_with(
            |name, _| if name == "slow" { ms(100) } else { ms(1) },
            |name, attempt| {
                if name == "bad" && attempt == 1 {
                    panic!("boom");
                }
                Ok(Action::await_change())
            },
        ),
        policy(Action::await_change()),
        Arc::new(()),
    );
    let _run = Collected::spawn(&record, stream);
    feed.list([cm("bad", "1"), cm("slow", "1")]);
    advance(ms(60)).await;

    let events = capture.events();
    let panicked: Vec<_> = events
        .iter()
        .filter(|e| e.field("object.ref") == Some(&r("bad")))
        .collect();
    assert_eq!(panicked.len(), 1, "{events:#?}");
    assert_eq!(panicked[0].level, Some(Level::ERROR));
    let fields = &panicked[0].fields;
    eprintln!("PANIC FIELDS {fields:?}");
    assert!(
        fields
            .iter()
            .any(|(n, v)| n == "message" && v == "reconcile panicked"),
        "{fields:?}"
    );
    assert!(fields.iter().any(|(_, v)| v == "boom"), "{fields:?}");

    let timed_out: Vec<_> = events
        .iter()
        .filter(|e| e.field("object.ref") == Some(&r("slow")))
        .collect();
    assert_eq!(timed_out.len(), 1, "{events:#?}");
    assert_eq!(timed_out[0].level, Some(Level::WARN));
    assert_eq!(timed_out[0].field("message"), Some("reconcile timed out"));
}
