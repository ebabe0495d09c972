//! The elector: one task per replica that acquires, renews and gives up a
//! Lease, and publishes whether this replica leads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube_client::api::{ObjectMeta, PostParams};
use kube_client::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use super::config::{LeaseConfig, LeaseConfigError};

/// Whether this replica leads, as the elector last established it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderState {
    /// Not leading: the lease is held by another replica, or the elector
    /// has not won it yet (the state it starts in), or it was released.
    Following,
    /// Leading since this instant (tokio's clock). Work may start.
    Leading {
        /// When this replica won the lease.
        since: Instant,
    },
    /// Stepped down: this replica led but could not renew by its renew
    /// deadline, or saw another holder on the Lease. No work may start; it
    /// becomes [`Following`](Self::Following) once it sees the Lease again.
    Fenced,
}

impl LeaderState {
    /// Whether this is [`Leading`](Self::Leading).
    #[must_use]
    pub fn is_leading(&self) -> bool {
        matches!(self, LeaderState::Leading { .. })
    }
}

/// Where the elector reads the wall-clock time it writes as the Lease's
/// `acquireTime` and `renewTime`. These times are for people and other
/// tools: the elector itself never compares them with any clock.
pub type WallClock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// A leader election not started yet: the Lease API, the [`LeaseConfig`]
/// and the optional wall clock and gauge. [`start`](Self::start) it, or
/// hand it to
/// [`Controller::leader_election`](crate::Controller::leader_election).
#[derive(Clone)]
pub struct LeaderElection {
    api: Api<Lease>,
    config: LeaseConfig,
    clock: WallClock,
    #[cfg(feature = "prometheus")]
    metrics: Option<super::LeaderMetrics>,
}

impl std::fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElection")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LeaderElection {
    /// An election for the Lease `config` names, through `client`.
    #[must_use]
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        LeaderElection {
            api: Api::namespaced(client, config.namespace()),
            config,
            clock: Arc::new(Timestamp::now),
            #[cfg(feature = "prometheus")]
            metrics: None,
        }
    }

    /// Reads the times written on the Lease from `clock` instead of the
    /// system clock (tests skew it to show that skew does not matter).
    #[must_use]
    pub fn wall_clock(mut self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Reports `leader_election_master_status{name}` in `metrics`.
    #[cfg(feature = "prometheus")]
    #[must_use]
    pub fn metrics(mut self, metrics: super::LeaderMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The election's config.
    #[must_use]
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Validates the config and starts competing for the Lease on a task of
    /// the current tokio runtime.
    ///
    /// # Errors
    ///
    /// The config breaks one of client-go's rules
    /// ([`LeaseConfig::validate`]).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(self) -> Result<LeaderElector, LeaseConfigError> {
        self.config.validate()?;
        let (tx, rx) = watch::channel(LeaderState::Following);
        let shared = Arc::new(Shared {
            tx,
            stopped: AtomicBool::new(false),
            #[cfg(feature = "prometheus")]
            metrics: self.metrics.clone(),
            name: self.config.name().to_string(),
        });
        shared.publish(LeaderState::Following);
        let campaign = Campaign {
            lock: Lock {
                api: self.api.clone(),
                config: self.config.clone(),
                clock: self.clock.clone(),
            },
            shared: shared.clone(),
            observed: None,
        };
        let task = tokio::spawn(campaign.run());
        Ok(LeaderElector {
            rx,
            shared,
            task: Some(task),
            lock: Lock {
                api: self.api,
                config: self.config,
                clock: self.clock,
            },
        })
    }
}

/// A running leader election: the task competing for the Lease, and a
/// [`watch`] of its [`LeaderState`].
///
/// Dropping it stops the task without releasing the Lease (as a crash
/// would: the others take over once the lease expires) and publishes
/// [`LeaderState::Following`]; [`release`](Self::release) hands the Lease
/// over at once.
pub struct LeaderElector {
    rx: watch::Receiver<LeaderState>,
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
    lock: Lock,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.lock.config)
            .field("state", &*self.rx.borrow())
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    /// A receiver of the leadership state; it sees every change from now
    /// on.
    #[must_use]
    pub fn state(&self) -> watch::Receiver<LeaderState> {
        self.rx.clone()
    }

    /// Whether this replica leads right now.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.rx.borrow().is_leading()
    }

    /// The election's config.
    #[must_use]
    pub fn config(&self) -> &LeaseConfig {
        &self.lock.config
    }

    /// Stops competing, publishes [`LeaderState::Following`], and if this
    /// replica holds the Lease, clears its `holderIdentity` so that another
    /// replica takes it at its next try instead of waiting for it to
    /// expire. Stop the work that needed the leadership first.
    ///
    /// Returns whether this replica held the Lease and cleared it.
    ///
    /// # Errors
    ///
    /// The Lease could not be read or written (then it expires as after a
    /// crash).
    pub async fn release(mut self) -> Result<bool, kube_client::Error> {
        self.stop().await;
        let api = &self.lock.api;
        let name = self.lock.config.name();
        // Retried on a conflict: the task may have been stopped with a
        // renewal in flight that the server carried out.
        for _ in 0..3 {
            let Some(mut lease) = api.get_opt(name).await? else {
                return Ok(false);
            };
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.lock.config.identity()) {
                return Ok(false);
            }
            let now = MicroTime((self.lock.clock)());
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            match api.replace(name, &PostParams::default(), &lease).await {
                Ok(_) => {
                    tracing::info!(lease = name, "released the lease");
                    return Ok(true);
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        self.shared.stop();
    }
}

impl Drop for LeaderElector {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.shared.stop();
    }
}

/// What the task and the handle share: the state's sender.
struct Shared {
    tx: watch::Sender<LeaderState>,
    /// Set once the handle stopped the task: later publications from a
    /// task that has not noticed its abort yet are ignored.
    stopped: AtomicBool,
    #[cfg(feature = "prometheus")]
    metrics: Option<super::LeaderMetrics>,
    name: String,
}

impl Shared {
    fn publish(&self, state: LeaderState) {
        self.tx.send_if_modified(|current| {
            if self.stopped.load(Ordering::SeqCst) || *current == state {
                return false;
            }
            *current = state;
            true
        });
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &self.metrics {
            metrics.set(&self.name, self.tx.borrow().is_leading());
        }
        tracing::debug!(lease = %self.name, ?state, "leadership");
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.tx.send_if_modified(|current| {
            let changed = *current != LeaderState::Following;
            *current = LeaderState::Following;
            changed
        });
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &self.metrics {
            metrics.set(&self.name, false);
        }
    }
}

/// The Lease and how to write it.
#[derive(Clone)]
struct Lock {
    api: Api<Lease>,
    config: LeaseConfig,
    clock: WallClock,
}

impl Lock {
    /// The record this replica writes to take or renew the lease.
    fn record(&self, lease: Option<Lease>) -> Lease {
        let now = MicroTime((self.clock)());
        let identity = self.config.identity();
        let lease_exists = lease.is_some();
        let mut lease = lease.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name().to_string()),
                namespace: Some(self.config.namespace().to_string()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let ours = spec.holder_identity.as_deref() == Some(identity);
        if !ours {
            // As client-go: every acquisition of an existing Lease is a
            // transition, also after a release.
            let transitions = spec.lease_transitions.unwrap_or(0);
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(if lease_exists {
                transitions.saturating_add(1)
            } else {
                0
            });
        }
        spec.holder_identity = Some(identity.to_string());
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(self.config.lease_duration_seconds());
        lease
    }
}

/// The non-empty holder of a Lease.
fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

pub(crate) fn is_conflict(e: &kube_client::Error) -> bool {
    matches!(e, kube_client::Error::Api(s) if s.code == 409)
}

/// When this replica last saw the Lease's record change.
struct Observed {
    version: Option<String>,
    at: Instant,
}

/// What one try to take or renew the lease found.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the lease now.
    Holding,
    /// Another replica holds it, unexpired by this replica's observation.
    HeldByOther,
    /// Someone wrote the Lease between our read and our write.
    LostRace,
}

/// The task's side: the Lease, what it last saw of it, and the state it
/// publishes.
struct Campaign {
    lock: Lock,
    shared: Arc<Shared>,
    observed: Option<Observed>,
}

impl Campaign {
    fn config(&self) -> &LeaseConfig {
        &self.lock.config
    }

    /// Notes the record's version; the clock starts again when it changed.
    fn observe(&mut self, lease: &Lease) {
        let version = lease.metadata.resource_version.clone();
        match &self.observed {
            Some(seen) if seen.version == version => {}
            _ => {
                self.observed = Some(Observed {
                    version,
                    at: Instant::now(),
                });
            }
        }
    }

    /// One client-go `tryAcquireOrRenew`: read the Lease; take it if it is
    /// free, ours, or unchanged for a lease duration by our own clock;
    /// write with the resourceVersion read, so a concurrent writer makes us
    /// lose (409) instead of both winning.
    async fn attempt(&mut self) -> Result<Attempt, kube_client::Error> {
        let api = self.lock.api.clone();
        let name = self.config().name().to_string();
        let pp = PostParams::default();
        let Some(lease) = api.get_opt(&name).await? else {
            return match api.create(&pp, &self.lock.record(None)).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(Attempt::Holding)
                }
                Err(e) if is_conflict(&e) => Ok(Attempt::LostRace),
                Err(e) => Err(e),
            };
        };
        self.observe(&lease);
        let spec = lease.spec.clone().unwrap_or_default();
        if let Some(other) = holder(&spec)
            && other != self.config().identity()
        {
            let unchanged_for = self
                .observed
                .as_ref()
                .map_or(Duration::ZERO, |o| o.at.elapsed());
            if unchanged_for < self.config().lease_duration() {
                return Ok(Attempt::HeldByOther);
            }
            tracing::info!(lease = %name, holder = other, ?unchanged_for, "the lease expired; taking it");
        }
        match api
            .replace(&name, &pp, &self.lock.record(Some(lease)))
            .await
        {
            Ok(written) => {
                self.observe(&written);
                Ok(Attempt::Holding)
            }
            Err(e) if is_conflict(&e) => Ok(Attempt::LostRace),
            Err(e) => Err(e),
        }
    }

    async fn run(mut self) {
        let retry = self.config().retry_period();
        let renew_deadline = self.config().renew_deadline();
        loop {
            // Follow until a try takes the lease. A try starts at `sent`:
            // the write others will see happens after it, so counting
            // from `sent` is never later than any follower's count.
            let mut sent;
            loop {
                sent = Instant::now();
                let mut wake = Instant::now() + retry;
                match timeout_at(sent + renew_deadline, self.attempt()).await {
                    Ok(Ok(Attempt::Holding)) => break,
                    Ok(Ok(_)) => {
                        if *self.shared.tx.borrow() == LeaderState::Fenced {
                            self.shared.publish(LeaderState::Following);
                        }
                        // Try again the moment the record we saw would
                        // expire, if that comes before the next period:
                        // failover then takes at most a lease duration
                        // plus one retry period after the last renewal.
                        if let Some(seen) = &self.observed {
                            wake = wake.min(seen.at + self.config().lease_duration());
                        }
                    }
                    Ok(Err(error)) => tracing::debug!(%error, "could not reach the lease"),
                    Err(_) => tracing::debug!("a try to take the lease timed out"),
                }
                sleep_until(wake).await;
            }
            self.shared.publish(LeaderState::Leading {
                since: Instant::now(),
            });
            tracing::info!(lease = %self.config().name(), identity = %self.config().identity(), "leading");
            let mut renewed = sent;
            loop {
                let deadline = renewed + renew_deadline;
                sleep_until((Instant::now() + retry).min(deadline)).await;
                if Instant::now() >= deadline {
                    tracing::warn!(lease = %self.config().name(), "could not renew the lease by the renew deadline; stepping down");
                    break;
                }
                let sent = Instant::now();
                match timeout_at(deadline, self.attempt()).await {
                    Ok(Ok(Attempt::Holding)) => renewed = sent,
                    Ok(Ok(Attempt::HeldByOther)) => {
                        tracing::warn!(lease = %self.config().name(), "another replica holds the lease; stepping down");
                        break;
                    }
                    Ok(Ok(Attempt::LostRace)) => {
                        tracing::debug!("the lease changed under a renewal; trying again");
                    }
                    Ok(Err(error)) => tracing::debug!(%error, "could not renew the lease"),
                    Err(_) => {
                        tracing::warn!(lease = %self.config().name(), "could not renew the lease by the renew deadline; stepping down");
                        break;
                    }
                }
            }
            self.shared.publish(LeaderState::Fenced);
            sleep(retry).await;
        }
    }
}
