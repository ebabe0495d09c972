//! The `prometheus` feature: scripted sequences on paused time, then the
//! registry's text encoding is read and checked value by value.
#![cfg(feature = "prometheus")]

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::time::advance;
use tokio_workqueue::metrics::prometheus::PrometheusMetrics;
use tokio_workqueue::{AddError, AddOpts, ExponentialBackoff, Lane, WorkQueue};

const SEC: Duration = Duration::from_secs(1);

/// Lets the timer task run after the clock moved.
async fn settle() {
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
}

/// One scrape of a registry.
struct Scrape(String);

impl Scrape {
    fn of(registry: &Registry) -> Scrape {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        Scrape(text)
    }

    /// The value of the sample `series` (name and labels, as encoded), if it
    /// is there.
    fn get(&self, series: &str) -> Option<f64> {
        self.0.lines().find_map(|line| {
            let value = line.strip_prefix(series)?.strip_prefix(' ')?;
            Some(value.parse().unwrap())
        })
    }

    /// The value of `series`, which must be there.
    fn value(&self, series: &str) -> f64 {
        self.get(series)
            .unwrap_or_else(|| panic!("no sample {series} in:\n{}", self.0))
    }

    fn depth(&self, name: &str, priority: i32) -> f64 {
        self.value(&format!(
            "workqueue_depth{{name=\"{name}\",priority=\"{priority}\"}}"
        ))
    }

    fn of_queue(&self, family: &str, name: &str) -> f64 {
        self.value(&format!("{family}{{name=\"{name}\"}}"))
    }

    fn bucket(&self, family: &str, name: &str, le: &str) -> f64 {
        self.value(&format!("{family}_bucket{{le=\"{le}\",name=\"{name}\"}}"))
    }

    /// Every `workqueue_depth` sample.
    fn depths(&self) -> Vec<f64> {
        self.0
            .lines()
            .filter(|l| l.starts_with("workqueue_depth{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect()
    }
}

fn registry() -> (PrometheusMetrics, Registry) {
    let metrics = PrometheusMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    (metrics, registry)
}

fn named(name: &str, metrics: &PrometheusMetrics) -> WorkQueue<&'static str> {
    WorkQueue::builder()
        .name(name)
        .metrics(metrics.clone())
        .build()
}

#[tokio::test(start_paused = true)]
async fn adds_and_depth_by_priority() {
    let (metrics, registry) = registry();
    let q = named("q", &metrics);
    q.add("a").unwrap();
    q.add("b").unwrap();
    q.add_to_lane("c", Lane::Slow).unwrap();
    q.add("a").unwrap(); // already ready: not an add
    q.add_to_lane("c", Lane::Slow).unwrap(); // same
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 3.0);
    assert_eq!(s.depth("q", 0), 2.0);
    assert_eq!(s.depth("q", -100), 1.0);

    // Raising c moves it, and the emptied level stays at 0.
    q.add("c").unwrap();
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 3.0);
    assert_eq!(s.depth("q", 0), 3.0);
    assert_eq!(s.depth("q", -100), 0.0);

    // Leased keys are not depth.
    let a = q.get().await.unwrap();
    let s = Scrape::of(&registry);
    assert_eq!(s.depth("q", 0), 2.0);
    drop(a);
    assert_eq!(Scrape::of(&registry).depth("q", 0), 2.0);
}

#[tokio::test(start_paused = true)]
async fn queue_duration_runs_from_ready_to_lease() {
    let (metrics, registry) = registry();
    let q = named("q", &metrics);
    q.add("a").unwrap();
    advance(3 * SEC).await;
    let a = q.get().await.unwrap();
    let family = "workqueue_queue_duration_seconds";
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue(&format!("{family}_sum"), "q"), 3.0);
    assert_eq!(s.of_queue(&format!("{family}_count"), "q"), 1.0);
    assert_eq!(s.bucket(family, "q", "1.0"), 0.0);
    assert_eq!(s.bucket(family, "q", "10.0"), 1.0);
    assert_eq!(s.bucket(family, "q", "+Inf"), 1.0);
    assert_eq!(s.depth("q", 0), 0.0);

    // A delay is not queue time: the clock starts when the key is ready.
    drop(a);
    q.add_after("b", 5 * SEC).unwrap();
    advance(5 * SEC).await;
    settle().await;
    advance(SEC / 2).await;
    let _b = q.get().await.unwrap();
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue(&format!("{family}_sum"), "q"), 3.5);
    assert_eq!(s.of_queue(&format!("{family}_count"), "q"), 2.0);
    assert_eq!(s.bucket(family, "q", "1.0"), 1.0);
}

#[tokio::test(start_paused = true)]
async fn work_duration_and_running_gauges_while_leases_are_held() {
    let (metrics, registry) = registry();
    let q = named("q", &metrics);
    q.add("a").unwrap();
    q.add("b").unwrap();
    let a = q.get().await.unwrap();
    advance(2 * SEC).await;
    let b = q.get().await.unwrap();
    advance(SEC).await;

    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_unfinished_work_seconds", "q"), 4.0);
    assert_eq!(
        s.of_queue("workqueue_longest_running_processor_seconds", "q"),
        3.0
    );
    assert_eq!(
        s.of_queue("workqueue_work_duration_seconds_count", "q"),
        0.0
    );

    // The gauges move with the clock, with no task updating them.
    advance(SEC).await;
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_unfinished_work_seconds", "q"), 6.0);
    assert_eq!(
        s.of_queue("workqueue_longest_running_processor_seconds", "q"),
        4.0
    );

    a.done();
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_work_duration_seconds_sum", "q"), 4.0);
    assert_eq!(
        s.of_queue("workqueue_work_duration_seconds_count", "q"),
        1.0
    );
    assert_eq!(s.of_queue("workqueue_unfinished_work_seconds", "q"), 2.0);
    assert_eq!(
        s.of_queue("workqueue_longest_running_processor_seconds", "q"),
        2.0
    );

    advance(SEC / 2).await;
    b.requeue().unwrap(); // a requeue ends the lease too
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_work_duration_seconds_sum", "q"), 6.5);
    assert_eq!(
        s.of_queue("workqueue_work_duration_seconds_count", "q"),
        2.0
    );
    assert_eq!(s.bucket("workqueue_work_duration_seconds", "q", "1.0"), 0.0);
    assert_eq!(
        s.bucket("workqueue_work_duration_seconds", "q", "10.0"),
        2.0
    );
    assert_eq!(s.of_queue("workqueue_unfinished_work_seconds", "q"), 0.0);
    assert_eq!(
        s.of_queue("workqueue_longest_running_processor_seconds", "q"),
        0.0
    );
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 3.0);
    assert_eq!(s.depth("q", 0), 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_key_re_added_while_leased_is_an_add_but_not_depth_until_its_lease_ends() {
    let (metrics, registry) = registry();
    let q = named("q", &metrics);
    q.add("a").unwrap();
    let a = q.get().await.unwrap();
    q.add("a").unwrap();
    q.add("a").unwrap(); // already marked: not another add
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 2.0);
    assert_eq!(s.depth("q", 0), 0.0);

    advance(2 * SEC).await;
    drop(a);
    assert_eq!(Scrape::of(&registry).depth("q", 0), 1.0);

    // Its queue time starts at the lease end, when it became ready.
    advance(SEC).await;
    let _a = q.get().await.unwrap();
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_queue_duration_seconds_sum", "q"), 1.0);
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 2.0);
}

#[tokio::test(start_paused = true)]
async fn retries_from_rate_limited_adds_and_requeues() {
    let (metrics, registry) = registry();
    let q: WorkQueue<&str> = WorkQueue::builder()
        .name("q")
        .rate_limiter(ExponentialBackoff::new(SEC, 60 * SEC).unwrap())
        .metrics(metrics.clone())
        .build();

    q.add_rate_limited("a").unwrap(); // ready after 1 s
    q.add_with("b", AddOpts::new().rate_limited().priority(5))
        .unwrap(); // 1 s
    q.add_after("c", SEC).unwrap(); // a plain delay is no retry
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_retries_total", "q"), 2.0);
    assert_eq!(
        s.of_queue("workqueue_adds_total", "q"),
        0.0,
        "still delayed"
    );
    assert_eq!(s.depths(), [0.0], "nothing ready yet");
    assert_eq!(
        s.of_queue("workqueue_delayed_items", "q"),
        3.0,
        "all three wait"
    );

    advance(SEC).await;
    settle().await;
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 3.0);
    assert_eq!(s.of_queue("workqueue_delayed_items", "q"), 0.0);
    assert_eq!(s.depth("q", 5), 1.0);
    assert_eq!(s.depth("q", 0), 2.0);

    let b = q.get().await.unwrap();
    assert_eq!(*b, "b");
    b.requeue_rate_limited().unwrap(); // second failure: 2 s
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_retries_total", "q"), 3.0);
    assert_eq!(s.depth("q", 5), 0.0);

    advance(2 * SEC).await;
    settle().await;
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 4.0);
    assert_eq!(s.depth("q", 5), 1.0);

    // Refused rate-limited adds and requeues are no retries.
    let b = q.get().await.unwrap();
    q.shutdown();
    assert_eq!(q.add_rate_limited("d"), Err(AddError::ShuttingDown));
    assert_eq!(b.requeue_rate_limited(), Err(AddError::ShuttingDown));
    assert_eq!(
        Scrape::of(&registry).of_queue("workqueue_retries_total", "q"),
        3.0
    );
}

#[tokio::test(start_paused = true)]
async fn depth_never_goes_negative_when_delayed_keys_are_made_ready() {
    let (metrics, registry) = registry();
    let q = named("q", &metrics);

    // Added with a delay, then added now: one add, depth 1, and the old
    // timer does not count it again when it would have fired.
    q.add_after("a", 5 * SEC).unwrap();
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 0.0);
    assert_eq!(s.depth("q", 0), 0.0);
    q.add("a").unwrap();
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 1.0);
    assert_eq!(s.depth("q", 0), 1.0);

    let a = q.get().await.unwrap();
    assert_eq!(Scrape::of(&registry).depth("q", 0), 0.0);
    advance(10 * SEC).await;
    settle().await;
    let s = Scrape::of(&registry);
    assert_eq!(s.depth("q", 0), 0.0);
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 1.0);
    drop(a);

    // Keys whose delays end at once, some of them raised, leased and re-added.
    q.add_after("b", SEC).unwrap();
    q.add_with("c", AddOpts::new().after(SEC).priority(-1))
        .unwrap();
    q.add_with("c", AddOpts::new().priority(3)).unwrap(); // now, higher
    let s = Scrape::of(&registry);
    assert_eq!(s.depth("q", 3), 1.0);
    assert_eq!(s.get("workqueue_depth{name=\"q\",priority=\"-1\"}"), None);
    let c = q.get().await.unwrap();
    q.add_after("c", SEC).unwrap(); // delayed re-add during the lease
    advance(SEC).await;
    settle().await;
    let s = Scrape::of(&registry);
    assert_eq!(s.depth("q", 0), 1.0, "b");
    assert_eq!(s.depth("q", 3), 0.0, "c is leased");
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 4.0);
    drop(c);
    let s = Scrape::of(&registry);
    assert_eq!(s.depth("q", 0), 2.0, "c is back, at its re-add's priority");
    assert_eq!(s.depth("q", 3), 0.0);
    while !q.is_empty() {
        drop(q.get().await.unwrap());
    }
    advance(10 * SEC).await;
    settle().await;
    let s = Scrape::of(&registry);
    assert!(s.depths().iter().all(|&d| d == 0.0), "{}", s.0);
    assert_eq!(s.of_queue("workqueue_adds_total", "q"), 4.0);
}

#[tokio::test(start_paused = true)]
async fn gauges_go_with_the_queue_and_counters_stay() {
    let (metrics, registry) = registry();
    let q = named("gone", &metrics);
    q.add_to_lane("a", Lane::Slow).unwrap();
    q.add("b").unwrap();
    let item = q.get().await.unwrap();
    advance(SEC).await;
    assert_eq!(
        Scrape::of(&registry).of_queue("workqueue_longest_running_processor_seconds", "gone"),
        1.0
    );

    // Shut down but alive (a lease holds it): still reported.
    q.shutdown();
    drop(q);
    let s = Scrape::of(&registry);
    assert_eq!(s.depth("gone", -100), 1.0);
    assert_eq!(s.of_queue("workqueue_unfinished_work_seconds", "gone"), 1.0);

    drop(item);
    let s = Scrape::of(&registry);
    assert!(!s.0.contains("workqueue_depth"), "{}", s.0);
    assert!(!s.0.contains("workqueue_unfinished_work_seconds"));
    assert!(!s.0.contains("workqueue_longest_running_processor_seconds"));
    assert_eq!(s.of_queue("workqueue_adds_total", "gone"), 2.0);
    assert_eq!(
        s.of_queue("workqueue_work_duration_seconds_count", "gone"),
        1.0
    );

    // A new queue of that name starts its levels afresh and counts on.
    let q = named("gone", &metrics);
    q.add("c").unwrap();
    let s = Scrape::of(&registry);
    assert_eq!(s.depth("gone", 0), 1.0);
    assert_eq!(
        s.get("workqueue_depth{name=\"gone\",priority=\"-100\"}"),
        None
    );
    assert_eq!(s.of_queue("workqueue_adds_total", "gone"), 3.0);
}

#[tokio::test(start_paused = true)]
async fn queues_are_labelled_by_name_and_same_names_add_up() {
    let (metrics, registry) = registry();
    let pods = named("pods", &metrics);
    let nodes = named("nodes", &metrics);
    let pods_too = named("pods", &metrics);
    pods.add("a").unwrap();
    pods_too.add("a").unwrap();
    pods_too.add("b").unwrap();
    nodes.add("n").unwrap();
    let p = pods.get().await.unwrap();
    advance(2 * SEC).await;
    let p2 = pods_too.get().await.unwrap();
    advance(SEC).await;

    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_adds_total", "pods"), 3.0);
    assert_eq!(s.of_queue("workqueue_adds_total", "nodes"), 1.0);
    assert_eq!(s.depth("pods", 0), 1.0);
    assert_eq!(s.depth("nodes", 0), 1.0);
    assert_eq!(s.of_queue("workqueue_unfinished_work_seconds", "pods"), 4.0);
    assert_eq!(
        s.of_queue("workqueue_longest_running_processor_seconds", "pods"),
        3.0
    );
    assert_eq!(
        s.of_queue("workqueue_unfinished_work_seconds", "nodes"),
        0.0
    );
    assert_eq!(
        s.of_queue("workqueue_queue_duration_seconds_sum", "pods"),
        2.0
    );
    drop((p, p2));
}

#[tokio::test]
async fn a_queue_without_metrics_works_and_keeps_no_times() {
    let q = WorkQueue::new();
    q.add("a").unwrap();
    let item = q.get().await.unwrap();
    let snapshot = q.snapshot();
    assert_eq!(snapshot.in_flight, 1);
    assert_eq!(snapshot.unfinished_work, Duration::ZERO);
    item.done();
    assert!(q.is_empty());
}

#[tokio::test(start_paused = true)]
async fn each_partition_reports_under_its_own_name() {
    let (metrics, registry) = registry();
    let m = metrics.clone();
    let queue = tokio_workqueue::Partitioned::builder(2, |key: &u32| *key as usize % 2)
        .name("pods")
        .configure(move |_, b| b.metrics(m.clone()))
        .build()
        .unwrap();
    for key in [0, 1, 2, 3, 4, 2] {
        queue.add(key).unwrap();
    }
    let s = Scrape::of(&registry);
    assert_eq!(s.of_queue("workqueue_adds_total", "pods-0"), 3.0);
    assert_eq!(s.of_queue("workqueue_adds_total", "pods-1"), 2.0);
    assert_eq!(s.depth("pods-0", 0), 3.0);
    assert_eq!(s.depth("pods-1", 0), 2.0);
    drop(queue);
    let s = Scrape::of(&registry);
    assert_eq!(s.depths(), Vec::<f64>::new(), "gone with the queue");
    assert_eq!(s.of_queue("workqueue_adds_total", "pods-0"), 3.0);
}
