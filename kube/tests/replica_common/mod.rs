//! What the replica tests share (`tests/replicas/`,
//! `tests/manager/leader_election.rs`, `tests/on_apiserver/shards.rs`): the
//! reconcile error, a skewed wall clock, fast Lease timings, and the record every reconcile
//! writes of itself (key, the version it saw, replica, start, end), which
//! the checks read instead of anything the code under test reports.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube_client::ResourceExt;
use tokio::time::Instant;
use tokio_workqueue_kube::leader::LeaseConfig;

/// The tests' Lease timings: short, so that failovers take a second, and
/// with a renewal deadline and retry period in the same proportions as the
/// defaults (15 s, 10 s, 2 s).
pub const LEASE: Duration = Duration::from_millis(600);
pub const RENEW: Duration = Duration::from_millis(400);
pub const RETRY: Duration = Duration::from_millis(100);

/// The longest a crash failover may take, counted from the crash: a lease
/// duration and a retry period (the elector's promise, from the last
/// renewal it saw), and one retry period more of slack. A renewal already
/// sent when the leader crashed still lands (the client's connection is
/// not the crashed task's), and the follower's read that saw the last
/// renewal, then the taker's read and write, each take a request's time,
/// which on a loaded 2-core machine running a debug build is tens of
/// milliseconds (CI saw 767 ms against 700 ms with no slack). Locally
/// failovers take 590-610 ms.
pub const CRASH_FAILOVER_MAX: Duration = LEASE.saturating_add(RETRY).saturating_add(RETRY);

/// The longest a failover after a release may take, counted from the
/// release: the followers' next try, at most a retry period away, and one
/// retry period more for its read and write on a loaded machine. Still
/// below the 500 ms (a lease duration less a retry period) that waiting
/// for the Lease to expire would take at the earliest. Locally releases
/// hand over in 90-100 ms.
pub const RELEASE_FAILOVER_MAX: Duration = RETRY.saturating_mul(3);

/// A local API server holding the ConfigMaps `cm-0..n` in `default`.
pub async fn server_with_configmaps(n: usize) -> kube_local_apiserver::LocalApiServer {
    let server = kube_local_apiserver::LocalApiServer::start().await;
    let api: kube_client::Api<ConfigMap> = kube_client::Api::namespaced(server.client(), "default");
    for i in 0..n {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("cm-{i}"));
        api.create(&Default::default(), &cm).await.unwrap();
    }
    server
}

/// Who holds the Lease `lease` in `default`, if it exists and is held.
pub async fn lease_holder(client: kube_client::Client, lease: &str) -> Option<String> {
    let api: kube_client::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube_client::Api::namespaced(client, "default");
    api.get(lease).await.ok()?.spec?.holder_identity
}

/// A shard member's identity in these tests.
pub fn shard_identity(replica: usize) -> String {
    format!("replica-{replica}")
}

/// The replica that owns ConfigMap `name` in `default` when `members` are
/// the group, by the crate's rendezvous hashing on the controllers' key.
pub fn shard_owner(name: &str, members: &[usize]) -> usize {
    let ids: Vec<String> = members.iter().map(|&m| shard_identity(m)).collect();
    let id =
        tokio_workqueue_kube::shard::owner(&format!("default/{name}"), &ids).expect("a member");
    members[ids.iter().position(|i| i == id).expect("one of them")]
}

/// The Leases of shard group `group` in `default`.
pub async fn group_leases(
    client: kube_client::Client,
    group: &str,
) -> Vec<k8s_openapi::api::coordination::v1::Lease> {
    let api: kube_client::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube_client::Api::namespaced(client, "default");
    let label = format!("{}={group}", tokio_workqueue_kube::shard::GROUP_LABEL);
    api.list(&kube_client::api::ListParams::default().labels(&label))
        .await
        .expect("leases listed")
        .items
}

/// Waits up to `limit` until every one of `live` holds its Lease in shard
/// group `group` and acknowledges exactly `live` there, and, when `only`,
/// the group has no other Lease; returns when it saw that.
pub async fn wait_acknowledged(
    client: &kube_client::Client,
    group: &str,
    live: &[usize],
    only: bool,
    limit: Duration,
) -> Instant {
    let mut ids: Vec<String> = live.iter().map(|&i| shard_identity(i)).collect();
    ids.sort();
    let expected = ids.join(",");
    let deadline = Instant::now() + limit;
    loop {
        let leases = group_leases(client.clone(), group).await;
        let acks: std::collections::BTreeMap<String, (Option<String>, Option<String>)> = leases
            .iter()
            .map(|l| {
                let holder = l.spec.as_ref().and_then(|s| s.holder_identity.clone());
                let ack = l
                    .annotations()
                    .get(tokio_workqueue_kube::shard::ACK_ANNOTATION)
                    .cloned();
                (l.name_any(), (holder, ack))
            })
            .collect();
        let steady = (!only || acks.len() == live.len())
            && live.iter().all(|&i| {
                acks.get(&format!("{group}-{}", shard_identity(i)))
                    == Some(&(Some(shard_identity(i)), Some(expected.clone())))
            });
        if steady {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "the group did not acknowledge {expected} within {limit:?}: {acks:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The election of `holder` on the Lease `lease` in `default`, with the
/// tests' timings.
pub fn fast_lease(lease: &str, holder: String) -> LeaseConfig {
    LeaseConfig::new(lease, "default", holder)
        .with_lease_duration(LEASE)
        .with_renew_deadline(RENEW)
        .with_retry_period(RETRY)
}

#[derive(Debug)]
pub struct TestError;

impl std::fmt::Display for TestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("test error")
    }
}

impl std::error::Error for TestError {}

/// A wall clock `seconds` off the system's.
pub fn skewed(seconds: i64) -> impl Fn() -> Timestamp + Send + Sync + 'static {
    move || {
        Timestamp::now()
            .checked_add(SignedDuration::from_secs(seconds))
            .expect("a timestamp in range")
    }
}

/// One reconcile: key, replica, start, end (none while it runs).
#[derive(Debug, Clone)]
pub struct Run {
    pub key: String,
    /// The object's resourceVersion the reconcile saw.
    pub version: u64,
    pub replica: usize,
    pub start: Instant,
    pub end: Option<Instant>,
    /// Ran to its end (not dropped half-way).
    pub finished: bool,
}

/// Every reconcile, written by the reconcile function itself.
#[derive(Default)]
pub struct Record {
    pub runs: Mutex<Vec<Run>>,
}

/// Writes the end of its run when dropped: at the end of the reconcile,
/// or where a cancelled reconcile stopped.
pub struct Running {
    record: Arc<Record>,
    index: usize,
    finished: bool,
}

impl Running {
    /// The reconcile ran to its end.
    pub fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let end = Instant::now();
        let run = &mut self.record.runs.lock().unwrap()[self.index];
        run.end = Some(end);
        run.finished = self.finished;
    }
}

impl Record {
    /// Records that `replica` starts a reconcile of `cm`.
    pub fn start(self: &Arc<Self>, cm: &ConfigMap, replica: usize) -> Running {
        self.start_object(cm, replica)
    }

    /// Records that `replica` starts a reconcile of `object` (of any kind).
    pub fn start_object<K: ResourceExt>(self: &Arc<Self>, object: &K, replica: usize) -> Running {
        let mut runs = self.runs.lock().unwrap();
        runs.push(Run {
            key: object.name_any(),
            version: object
                .resource_version()
                .unwrap_or_default()
                .parse()
                .unwrap(),
            replica,
            start: Instant::now(),
            end: None,
            finished: false,
        });
        Running {
            record: self.clone(),
            index: runs.len() - 1,
            finished: false,
        }
    }

    pub fn runs(&self) -> Vec<Run> {
        self.runs.lock().unwrap().clone()
    }

    /// No two runs of one key overlap in time, whoever ran them (a run
    /// still going counts as running until now).
    pub fn check_no_overlap(&self) -> Result<(), String> {
        let now = Instant::now();
        let mut by_key: HashMap<String, Vec<Run>> = HashMap::new();
        for run in self.runs() {
            by_key.entry(run.key.clone()).or_default().push(run);
        }
        for runs in by_key.values_mut() {
            runs.sort_by_key(|r| r.start);
            // The run that ends last among those started so far.
            let mut latest: Option<&Run> = None;
            for run in runs.iter() {
                if let Some(prev) = latest
                    && run.start < prev.end.unwrap_or(now)
                {
                    return Err(format!(
                        "two reconciles of one key at once: {prev:?} and {run:?}"
                    ));
                }
                if latest.is_none_or(|p| run.end.unwrap_or(now) > p.end.unwrap_or(now)) {
                    latest = Some(run);
                }
            }
        }
        Ok(())
    }
}
