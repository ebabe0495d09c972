//! Several controllers in one process: shared caches, one shutdown, probes
//! and a metrics endpoint.
//!
//! An operator is rarely one controller. Built on their own, three
//! controllers that touch ConfigMaps open three ConfigMap watches and keep
//! three copies of every ConfigMap. Built from a [`Manager`], they share:
//!
//! - **one watch and one store per distinct source**: the same kind, the
//!   same namespace (the `Api`'s URL) and the same label and field
//!   selectors, whatever the number of controllers and roles (main,
//!   [`owns`](crate::Controller::owns), [`watches`](crate::Controller::watches))
//!   that use it. [`Manager::store`] hands reconcilers a reader of any shared
//!   cache, so reading children or related kinds needs no GET;
//! - **one sync gate**: no controller of the manager starts a reconcile before
//!   every cache of the manager has synced (its first list is complete), so a
//!   trigger from a child cache is never lost to a half-listed cache
//!   (controller-runtime fixed the same late, #3406);
//! - **one shutdown**: on SIGTERM or SIGINT (or the future given to
//!   [`Manager::shutdown_on`]) every controller stops taking keys and drains
//!   what is queued and in flight, as
//!   [`graceful_shutdown_on`](crate::Controller::graceful_shutdown_on) does;
//!   then the watches stop, then the endpoint, and [`Manager::run`] returns;
//! - **one endpoint** ([`Manager::serve`]): `/healthz`, `/readyz` and
//!   `/metrics` on one listener (see the table below).
//!
//! Each controller is an ordinary [`Controller`] made by
//! [`Manager::controller`] (or [`controller_for`](Manager::controller_for)),
//! configured as usual, run with its reconciler as usual, and its result
//! stream handed to [`Manager::add`] under a name. The result streams stay
//! the user's: `.inspect(..)` them before handing them over.
//!
//! | path | 200 when | otherwise |
//! | --- | --- | --- |
//! | `/healthz` | no controller's task has ended before the manager stopped it | 500, naming the controllers that ended |
//! | `/readyz` | every shared cache has synced, and the lease (if any) is renewed on time | 503, saying what is missing |
//! | `/metrics` | a registry was given ([`Manager::metrics`], feature `prometheus`): its OpenMetrics text | 404 |
//!
//! Other paths get 404 and methods other than `GET`/`HEAD` 405. The
//! listener is plain HTTP; bind it to the pod's address and keep it inside
//! the cluster (a NetworkPolicy), or have `/metrics` ask the API server who
//! may read it ([`Manager::secure_metrics`]: a bearer token checked with a
//! TokenReview and a SubjectAccessReview, 401/403 otherwise). TLS on the
//! endpoint is not built yet: terminate it in front (a sidecar or the
//! service mesh) where needed.
//!
//! With [`Manager::leader_election`], one Lease decides for every
//! controller: only the leading replica reconciles, the others keep every
//! cache warm (so a new leader starts at once, without a re-list), and a
//! leader that cannot renew fences every controller.
//!
//! With [`Manager::shards`] instead, every replica holds one Lease in a
//! shard group and each controller reconciles only the keys the group gives
//! this replica; with a config that splits the cache, each controller's
//! main cache holds only this replica's share too. The replica's acknowledgement of a new membership speaks
//! for all its controllers: it is written only once each of them has
//! nothing in flight that the new membership takes away, so a key moves to
//! another replica only after every controller here let go of it.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::{ConfigMap, Secret};
//! use kube_client::{Api, Client};
//! use kube_runtime::watcher;
//! use tokio_workqueue_kube::{Action, Manager};
//!
//! # #[derive(Debug)] struct Error;
//! # impl std::fmt::Display for Error {
//! #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("e") }
//! # }
//! # impl std::error::Error for Error {}
//! # async fn reconcile_cm(_: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, Error> { Ok(Action::await_change()) }
//! # async fn reconcile_secret(_: Arc<Secret>, _: Arc<()>) -> Result<Action, Error> { Ok(Action::await_change()) }
//! # fn policy<K>(_: Arc<K>, _: &Error, _: Arc<()>) -> Action { Action::await_change() }
//! # async fn example(client: Client) -> Result<(), tokio_workqueue_kube::ManagerError> {
//! let mut manager = Manager::new(client.clone());
//! // ConfigMaps owning Secrets, and Secrets on their own: one Secret watch.
//! let configmaps = manager
//!     .controller_for::<ConfigMap>(watcher::Config::default())
//!     .owns(Api::<Secret>::all(client.clone()), watcher::Config::default())
//!     .run(reconcile_cm, policy, Arc::new(()));
//! let secrets = manager
//!     .controller_for::<Secret>(watcher::Config::default())
//!     .run(reconcile_secret, policy, Arc::new(()));
//! manager
//!     .add("configmaps", configmaps)?
//!     .add("secrets", secrets)?
//!     .serve("0.0.0.0:8080")?;
//! manager.run().await
//! # }
//! ```

pub mod auth;
mod health;
mod serve;
pub(crate) mod source;
#[cfg(feature = "tls")]
mod tls;

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use kube_client::core::PartialObjectMeta;
use kube_client::{Api, Client, Resource};
use kube_runtime::reflector::Store;
use kube_runtime::watcher;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use self::health::Health;
use self::source::{Source, SourceId, Sources};
use crate::Controller;
use crate::controller::leadership::Leadership;
use crate::controller::replication::Shared as ManagerReplication;
use crate::controller::split::{share_config, share_watch};
use crate::leader::{LeaderElection, LeaderState, LeaseConfigError};
use crate::shard::{Kind, Shards, SharedMembership, selector};

/// Why the manager refused a call or could not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum ManagerError {
    /// Two controllers were added under one name (names label their
    /// metrics and health: they must be unique).
    DuplicateName(String),
    /// The endpoint's address is not an `IP:port`.
    InvalidAddress {
        /// The address given.
        addr: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The endpoint's address could not be bound (in use, not local, no
    /// permission).
    Bind {
        /// The address given.
        addr: SocketAddr,
        /// The operating system's answer.
        source: std::io::Error,
    },
    /// [`Manager::serve`] was called twice.
    ServeTwice,
    /// [`Manager::leader_election`] was called after controllers were
    /// made: they would not follow it.
    ElectionAfterControllers,
    /// [`Manager::leader_election`] was called twice.
    ElectionTwice,
    /// [`Manager::shards`] was called after controllers were made: they
    /// would not follow it.
    ShardsAfterControllers,
    /// [`Manager::shards`] was called twice.
    ShardsTwice,
    /// Both [`Manager::leader_election`] and [`Manager::shards`] were
    /// called: a manager's controllers either all follow one leader or all
    /// share the keys.
    ElectionWithShards,
    /// The Lease config breaks client-go's timing rules.
    InvalidLeaseConfig(LeaseConfigError),
    /// [`Manager::run`] was called outside a tokio runtime with signal
    /// handling, or the signal handlers could not be installed.
    Signals(std::io::Error),
    /// `Manager::serve_tls` (feature `tls`) could not use the certificate
    /// and key files; the message names the file and the reason.
    Tls(String),
}

impl fmt::Display for ManagerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ManagerError::DuplicateName(name) => write!(
                f,
                "a controller named {name:?} was already added to this manager"
            ),
            ManagerError::InvalidAddress { addr, reason } => {
                write!(f, "invalid endpoint address {addr:?}: {reason}")
            }
            ManagerError::Bind { addr, source } => {
                write!(f, "cannot listen on {addr}: {source}")
            }
            ManagerError::ServeTwice => f.write_str("the manager serves one endpoint only"),
            ManagerError::ElectionAfterControllers => {
                f.write_str("leader_election must be called before the manager makes controllers")
            }
            ManagerError::ElectionTwice => f.write_str("the manager runs one leader election only"),
            ManagerError::ShardsAfterControllers => {
                f.write_str("shards must be called before the manager makes controllers")
            }
            ManagerError::ShardsTwice => f.write_str("the manager has one shard membership only"),
            ManagerError::ElectionWithShards => f.write_str(
                "the manager runs either a leader election or a shard membership, not both",
            ),
            ManagerError::InvalidLeaseConfig(error) => {
                write!(f, "invalid lease config: {error}")
            }
            ManagerError::Signals(error) => {
                write!(f, "cannot install the shutdown signal handlers: {error}")
            }
            ManagerError::Tls(reason) => write!(f, "cannot serve TLS: {reason}"),
        }
    }
}

impl std::error::Error for ManagerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ManagerError::Bind { source, .. } => Some(source),
            ManagerError::Signals(error) => Some(error),
            ManagerError::InvalidLeaseConfig(error) => Some(error),
            _ => None,
        }
    }
}

/// What the manager's controllers share with it.
pub(crate) struct Shared {
    client: Client,
    sources: Mutex<Sources>,
    /// Cancelled when the manager shuts down: every controller drains.
    stop: CancellationToken,
    /// Whether every source has synced.
    synced: watch::Sender<bool>,
    /// The manager's leader election, followed by every controller it
    /// made: the state and the fencing grace.
    leader: Mutex<Option<(watch::Sender<LeaderState>, Duration)>>,
    /// The manager's shard membership, followed by every controller it
    /// made.
    shards: Mutex<Option<Arc<SharedMembership>>>,
    /// Controllers made so far (an election must come before them).
    made: std::sync::atomic::AtomicUsize,
}

impl Shared {
    /// The shared source of `api` + `wc`, subscribed or read through its
    /// store. `Source::new` receives the watch to run when the manager runs.
    pub(crate) fn source<K>(&self, id: SourceId, make: impl FnOnce() -> Source<K>) -> Arc<Source<K>>
    where
        K: kube_runtime::reflector::Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        self.sources.lock().get_or_insert(id, make)
    }

    /// The shared full-object watch of `api` + `wc`.
    pub(crate) fn object_source<K>(
        &self,
        api: Api<K>,
        wc: watcher::Config,
        dyntype: K::DynamicType,
    ) -> Arc<Source<K>>
    where
        K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let id = SourceId::new::<K>(api.resource_url(), &wc);
        self.source(id, move || {
            Source::new(paced(watcher::watcher(api, wc)), dyntype)
        })
    }

    /// The main source of a controller of `api` + `wc`: with a
    /// membership that splits the cache, this replica's share of it (its
    /// own watch, narrowed to the objects labelled with this member, and
    /// the objects labelled by the coordinator this replica runs for);
    /// otherwise the whole shared watch.
    pub(crate) fn main_source<K>(
        &self,
        api: Api<K>,
        wc: watcher::Config,
        dyntype: K::DynamicType,
    ) -> Arc<Source<K>>
    where
        K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let Some(membership) = self.split_membership() else {
            return self.object_source(api, wc, dyntype);
        };
        let share = share_config(&wc, &selector(membership.config()));
        let id = SourceId::new::<K>(api.resource_url(), &share);
        // Made once per source, however many controllers share it: so is
        // its kind's place among the coordinator's.
        self.source(id, move || {
            membership.label(Kind::new(api.clone(), wc, dyntype.clone()));
            Source::new(paced(share_watch(api, share)), dyntype)
        })
    }

    /// The shared metadata-only watch of `api` + `wc` (what `owns` needs
    /// of children: their owner references).
    pub(crate) fn metadata_source<K>(
        &self,
        api: Api<K>,
        wc: watcher::Config,
        dyntype: K::DynamicType,
    ) -> Arc<Source<PartialObjectMeta<K>>>
    where
        K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let id = SourceId::new::<PartialObjectMeta<K>>(api.resource_url(), &wc);
        #[allow(deprecated)]
        let make = move || Source::new(paced(watcher::metadata_watcher(api, wc)), dyntype);
        self.source(id, make)
    }

    /// Resolves once every source of the manager has synced.
    pub(crate) fn synced(&self) -> BoxFuture<'static, ()> {
        let mut synced = self.synced.subscribe();
        async move {
            // The sender lives as long as the manager; if it is gone, the
            // manager is gone and nothing will start anyway.
            let _ = synced.wait_for(|synced| *synced).await;
        }
        .boxed()
    }

    /// A future that resolves when the manager shuts down.
    pub(crate) fn stopping(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        self.stop.clone().cancelled_owned()
    }

    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// The manager's shard membership if it splits the cache: its
    /// controllers' main caches are this replica's share.
    fn split_membership(&self) -> Option<Arc<SharedMembership>> {
        let membership = self.shards.lock().clone()?;
        membership
            .config()
            .splits_cache()
            .is_some()
            .then_some(membership)
    }

    /// Whether the manager's shard membership splits the cache.
    pub(crate) fn splits_cache(&self) -> bool {
        self.split_membership().is_some()
    }

    /// The manager's election or shard membership as a controller
    /// follows it, if it has one.
    pub(crate) fn replication(&self) -> Option<ManagerReplication> {
        if let Some(membership) = &*self.shards.lock() {
            return Some(ManagerReplication::Shards(membership.clone()));
        }
        let leader = self.leader.lock();
        let (state, grace) = leader.as_ref()?;
        Some(ManagerReplication::Leader(Box::new(Leadership::shared(
            state.subscribe(),
            *grace,
        ))))
    }
}

/// A controller handed to [`Manager::add`]: its name and the task that
/// drives its result stream.
struct Added {
    name: String,
    run: BoxFuture<'static, ()>,
}

/// Several controllers in one process, on shared caches: see the
/// [module docs](self).
pub struct Manager {
    shared: Arc<Shared>,
    added: Vec<Added>,
    listener: Option<std::net::TcpListener>,
    transport: serve::Transport,
    shutdown: Option<BoxFuture<'static, ()>>,
    health: Arc<Health>,
    election: Option<LeaderElection>,
    secure_metrics: bool,
    #[cfg(feature = "prometheus")]
    registry: Option<Arc<prometheus_client::registry::Registry>>,
}

impl Manager {
    /// A manager whose controllers and caches talk to the API server
    /// through `client`.
    pub fn new(client: Client) -> Self {
        Manager {
            shared: Arc::new(Shared {
                client,
                sources: Mutex::new(Sources::default()),
                stop: CancellationToken::new(),
                synced: watch::Sender::new(false),
                leader: Mutex::new(None),
                shards: Mutex::new(None),
                made: std::sync::atomic::AtomicUsize::new(0),
            }),
            added: Vec::new(),
            listener: None,
            transport: serve::Transport::Plain,
            shutdown: None,
            health: Health::new(),
            election: None,
            secure_metrics: false,
            #[cfg(feature = "prometheus")]
            registry: None,
        }
    }

    /// Makes `/metrics` answer only callers whose bearer token the API
    /// server authenticates (a `TokenReview`) and authorizes for `get` on
    /// the non-resource URL `/metrics` (a `SubjectAccessReview`), as
    /// controller-runtime's `WithAuthenticationAndAuthorization` filter
    /// does: 401 without a valid token, 403 without the right, 503 if the
    /// API server cannot be asked. Answers are cached per token for
    /// [`auth::CACHE_FOR`]. The probes stay open.
    ///
    /// The manager's own identity then needs `create` on
    /// `tokenreviews.authentication.k8s.io` and
    /// `subjectaccessreviews.authorization.k8s.io`; the scraper, a
    /// ClusterRole with `nonResourceURLs: ["/metrics"], verbs: ["get"]`.
    pub fn secure_metrics(&mut self) -> &mut Self {
        self.secure_metrics = true;
        self
    }

    /// One leader election for every controller of this manager: only the
    /// replica that leads `election`'s Lease reconciles, every replica keeps
    /// every cache warm, and losing the Lease fences every controller as
    /// [`Controller::leader_election`] fences one (see [`crate::leader`]).
    /// `/readyz` fails while the replica is fenced (it led and could not
    /// renew by its renew deadline). The Lease is released on shutdown,
    /// after every controller drained.
    ///
    /// Call it before making controllers: each controller follows the
    /// election the manager had when it was made. A controller given an
    /// election or shards of its own follows those instead.
    pub fn leader_election(&mut self, election: LeaderElection) -> Result<&mut Self, ManagerError> {
        if self.shared.made.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            return Err(ManagerError::ElectionAfterControllers);
        }
        if self.election.is_some() {
            return Err(ManagerError::ElectionTwice);
        }
        if self.shared.shards.lock().is_some() {
            return Err(ManagerError::ElectionWithShards);
        }
        election
            .config()
            .validate()
            .map_err(ManagerError::InvalidLeaseConfig)?;
        let grace = election.config().fencing_grace();
        *self.shared.leader.lock() = Some((watch::Sender::new(LeaderState::Following), grace));
        self.election = Some(election);
        Ok(self)
    }

    /// One shard membership for every controller of this manager: one
    /// Lease per replica in `shards`' group, and each controller reconciles
    /// only the keys the group gives this replica (see [`crate::shard`]).
    /// Every cache stays whole on every replica (each key's trigger reaches
    /// its owner), unless the config splits the cache
    /// ([`ShardConfig::split_cache`](crate::shard::ShardConfig::split_cache)):
    /// then each controller's main cache holds only this replica's share
    /// (the objects labelled with its member), and the replica runs for the
    /// group's coordinator, which labels the objects of every controller's
    /// main kind and selection (see "Split caches" in [`crate::shard`]). The
    /// caches of `owns` and `watches`, and [`store`](Self::store)s, stay
    /// whole; a controller of a split manager given an election or shards
    /// of its own reports
    /// [`ControllerError::OwnReplicationInSplitManager`](crate::ControllerError::OwnReplicationInSplitManager)
    /// (its cache is the manager's share). The replica acknowledges a new membership on its Lease
    /// only once **every** controller has nothing in flight that it loses
    /// in it, so a key gained elsewhere starts only after each controller
    /// here let go of it. A replica that cannot renew by its renew deadline
    /// fences every controller, and `/readyz` fails meanwhile (and before
    /// the first renewal). The Lease is released on shutdown, after every
    /// controller drained.
    ///
    /// The keys of different controllers are told apart by their kind's
    /// controller, not by the hash: key `default/a` of the ConfigMap
    /// controller and of the Secret controller go to the same replica.
    ///
    /// Call it before making controllers: each controller follows what the
    /// manager had when it was made. A controller given an election or
    /// shards of its own follows those instead.
    ///
    /// Give every controller's result stream to [`add`](Self::add): the
    /// manager drains the added controllers before it releases the Lease,
    /// and reports one whose task ended on `/healthz`. A controller of the
    /// membership whose stream is dropped while reconciles run holds back
    /// every later acknowledgement of this replica (safe: no key moves
    /// away from it), which for a stream outside the manager nothing
    /// reports but a log line.
    pub fn shards(&mut self, shards: Shards) -> Result<&mut Self, ManagerError> {
        if self.shared.made.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            return Err(ManagerError::ShardsAfterControllers);
        }
        if self.shared.shards.lock().is_some() {
            return Err(ManagerError::ShardsTwice);
        }
        if self.election.is_some() {
            return Err(ManagerError::ElectionWithShards);
        }
        shards
            .config()
            .validate()
            .map_err(ManagerError::InvalidLeaseConfig)?;
        *self.shared.shards.lock() = Some(SharedMembership::new(shards));
        Ok(self)
    }

    /// The client the manager was made with.
    pub fn client(&self) -> Client {
        self.shared.client()
    }

    /// A reader of the shared cache of `api`'s objects that `wc` selects:
    /// the same store the manager's controllers reconcile from, with one
    /// watch whoever else uses it. It fills once [`run`](Self::run) starts.
    ///
    /// It holds everything `wc` selects, also with a split cache (see
    /// [`shards`](Self::shards)), where a controller's main cache is this
    /// replica's share: that one is the controller's
    /// [`store`](Controller::store).
    pub fn store<K>(&self, api: Api<K>, wc: watcher::Config) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
    {
        self.source(api, wc).store()
    }

    pub(crate) fn source<K>(&self, api: Api<K>, wc: watcher::Config) -> Arc<Source<K>>
    where
        K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
    {
        self.shared.object_source(api, wc, Default::default())
    }

    /// A controller for all `K` objects that `wc` selects, in every
    /// namespace: [`controller`](Self::controller) with `Api::all`.
    pub fn controller_for<K>(&self, wc: watcher::Config) -> Controller<K>
    where
        K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
        K::DynamicType:
            Eq + std::hash::Hash + Clone + Default + fmt::Debug + Send + Sync + Unpin + 'static,
    {
        self.controller(Api::all(self.client()), wc)
    }

    /// A controller for `api`'s objects that `wc` selects, whose main,
    /// [`owns`](Controller::owns) and [`watches`](Controller::watches)
    /// sources are the manager's shared caches. It reconciles only once
    /// every cache of the manager has synced, and drains when the manager
    /// shuts down. Configure and [`run`](Controller::run) it as any
    /// controller, then [`add`](Self::add) its result stream.
    pub fn controller<K>(&self, api: Api<K>, wc: watcher::Config) -> Controller<K>
    where
        K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
        K::DynamicType:
            Eq + std::hash::Hash + Clone + Default + fmt::Debug + Send + Sync + Unpin + 'static,
    {
        let source = self.shared.main_source(api, wc, Default::default());
        self.shared
            .made
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Controller::for_shared(source.subscribe(), source.store(), self.shared.clone())
    }

    /// Runs `results` (a controller's [`run`](Controller::run) stream, or
    /// any stream of results) as the controller `name`. An `Err` item is
    /// logged (tracing, at `warn`); the stream ending before the manager
    /// shuts down marks the controller dead (`/healthz` fails, and it is
    /// logged at `error`), as does a panic while polling it.
    ///
    /// Names must be unique: they name the controller in health answers
    /// and logs (use the controller's queue name).
    pub fn add<S, T, E>(&mut self, name: &str, results: S) -> Result<&mut Self, ManagerError>
    where
        S: futures_core::Stream<Item = Result<T, E>> + Send + 'static,
        E: fmt::Display,
    {
        if self.added.iter().any(|added| added.name == name) {
            return Err(ManagerError::DuplicateName(name.to_owned()));
        }
        let label = name.to_owned();
        let run = async move {
            let mut results = std::pin::pin!(results);
            while let Some(result) = results.next().await {
                if let Err(error) = result {
                    tracing::warn!(controller = %label, %error, "reconcile failed");
                }
            }
        }
        .boxed();
        self.added.push(Added {
            name: name.to_owned(),
            run,
        });
        Ok(self)
    }

    /// Serves `/healthz`, `/readyz` and `/metrics` on `addr` (`IP:port`;
    /// port 0 picks a free one, see [`local_addr`](Self::local_addr)) while
    /// the manager runs. The address is bound now, so a port in use is
    /// reported here; the listener stops last on shutdown.
    pub fn serve(&mut self, addr: &str) -> Result<&mut Self, ManagerError> {
        if self.listener.is_some() {
            return Err(ManagerError::ServeTwice);
        }
        let parsed: SocketAddr =
            addr.parse()
                .map_err(|e: std::net::AddrParseError| ManagerError::InvalidAddress {
                    addr: addr.to_owned(),
                    reason: e.to_string(),
                })?;
        let listener = std::net::TcpListener::bind(parsed)
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .map_err(|source| ManagerError::Bind {
                addr: parsed,
                source,
            })?;
        self.listener = Some(listener);
        Ok(self)
    }

    /// Serves the endpoint as [`serve`](Self::serve) does, over TLS
    /// (feature `tls`: rustls with ring, TLS 1.2 and 1.3, HTTP/1.1): `cert`
    /// is a PEM file with the certificate chain (the server's certificate
    /// first), `key` one with its private key (PKCS#8, PKCS#1 or SEC1).
    ///
    /// Both are read now: a missing or unreadable file, one without a
    /// certificate or key, or a key that does not match the certificate is
    /// [`ManagerError::Tls`]. While the manager runs, the files are looked
    /// at again when a client connects (at most once a second) and re-read
    /// if either changed, so a rotated certificate (cert-manager, a Secret
    /// volume) is used without a restart; a rewrite that does not load
    /// keeps the previous pair until one does. The probes are served over
    /// TLS too: point the Pod's probes at it with `scheme: HTTPS`.
    #[cfg(feature = "tls")]
    pub fn serve_tls(
        &mut self,
        addr: &str,
        cert: impl AsRef<std::path::Path>,
        key: impl AsRef<std::path::Path>,
    ) -> Result<&mut Self, ManagerError> {
        if self.listener.is_some() {
            return Err(ManagerError::ServeTwice);
        }
        let files = tls::CertFiles::open(cert.as_ref(), key.as_ref()).map_err(ManagerError::Tls)?;
        let acceptor = Arc::new(files)
            .acceptor()
            .map_err(|e| ManagerError::Tls(e.to_string()))?;
        self.serve(addr)?;
        self.transport = serve::Transport::Tls(acceptor);
        Ok(self)
    }

    /// The address the endpoint listens on, once [`serve`](Self::serve)
    /// bound it.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves `registry` on `/metrics` (feature `prometheus`). Register the
    /// controllers' and queues' metrics in it before running.
    #[cfg(feature = "prometheus")]
    pub fn metrics(&mut self, registry: prometheus_client::registry::Registry) -> &mut Self {
        self.registry = Some(Arc::new(registry));
        self
    }

    /// Shuts down when `trigger` completes instead of on SIGTERM/SIGINT.
    pub fn shutdown_on(&mut self, trigger: impl Future<Output = ()> + Send + 'static) -> &mut Self {
        self.shutdown = Some(trigger.boxed());
        self
    }

    /// Runs every watch, controller and the endpoint until shutdown (SIGTERM
    /// or SIGINT, or the future given to [`shutdown_on`](Self::shutdown_on)),
    /// then drains every controller, stops the watches and, last, the
    /// endpoint.
    ///
    /// A controller that ends on its own (or panics) before that is
    /// reported and turns `/healthz` red; the others keep running, so the
    /// orchestrator's liveness probe restarts the process.
    pub async fn run(self) -> Result<(), ManagerError> {
        let Manager {
            shared,
            added,
            listener,
            transport,
            shutdown,
            health,
            election,
            secure_metrics,
            #[cfg(feature = "prometheus")]
            registry,
        } = self;
        let shutdown = match shutdown {
            Some(trigger) => trigger,
            None => crate::signals::shutdown_signal().map_err(ManagerError::Signals)?,
        };

        // The sources: each shared watch on its own task, and /readyz
        // waits for each.
        let (sources, ready): (Vec<_>, Vec<_>) = {
            let sources = shared.sources.lock();
            for source in sources.all() {
                health.require(source.readiness());
            }
            let started = sources
                .all()
                .iter()
                .filter_map(|source| source.start())
                .map(tokio::spawn)
                .collect();
            let ready = sources.all().iter().map(|source| source.ready()).collect();
            (started, ready)
        };
        // The sync gate: opens once every source has synced, and stays open.
        let gate = {
            let shared = shared.clone();
            tokio::spawn(async move {
                futures_util::future::join_all(ready).await;
                shared.synced.send_replace(true);
            })
        };

        // The election, followed by every controller through `shared.leader`.
        let elector = match election {
            Some(election) => {
                let elector = election.start().map_err(ManagerError::InvalidLeaseConfig)?;
                let follow = shared.leader.lock().as_ref().map(|(tx, _)| tx.clone());
                if let Some(tx) = follow {
                    let mut state = elector.state();
                    let fenced = tx.subscribe();
                    health.require(Box::new(move || {
                        (*fenced.borrow() == LeaderState::Fenced)
                            .then(|| "the lease was not renewed by its renew deadline".to_owned())
                    }));
                    tokio::spawn(async move {
                        loop {
                            tx.send_replace(*state.borrow_and_update());
                            if state.changed().await.is_err() {
                                tx.send_replace(LeaderState::Following);
                                break;
                            }
                        }
                    });
                }
                Some(elector)
            }
            None => None,
        };

        // The shard membership, followed by every controller through
        // `shared.shards`; started here so that it renews from the start
        // even before a controller polls.
        let membership = shared.shards.lock().clone();
        if let Some(membership) = &membership
            && let Some(view) = membership.view()
        {
            let renew_deadline = membership.config().renew_deadline();
            health.require(Box::new(move || {
                let renewed = view.borrow().renewed;
                match renewed {
                    Some(at) if tokio::time::Instant::now() < at + renew_deadline => None,
                    Some(_) => {
                        Some("the shard lease was not renewed by its renew deadline".to_owned())
                    }
                    None => Some("the shard lease was not renewed yet".to_owned()),
                }
            }));
        }

        // The endpoint.
        let endpoint_stop = CancellationToken::new();
        let endpoint = match listener {
            Some(listener) => {
                let addr = listener
                    .local_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                let listener = tokio::net::TcpListener::from_std(listener)
                    .map_err(|source| ManagerError::Bind { addr, source })?;
                let endpoint = serve::Endpoint {
                    health: health.clone(),
                    auth: secure_metrics.then(|| Arc::new(auth::Authorizer::new(shared.client()))),
                    #[cfg(feature = "prometheus")]
                    registry,
                };
                Some(tokio::spawn(serve::serve(
                    listener,
                    transport,
                    endpoint,
                    endpoint_stop.clone(),
                )))
            }
            None => None,
        };

        // The controllers.
        let mut controllers = tokio::task::JoinSet::new();
        for Added { name, run } in added {
            let health = health.clone();
            let stop = shared.stop.clone();
            controllers.spawn(async move {
                let ended = std::panic::AssertUnwindSafe(run).catch_unwind().await;
                if !stop.is_cancelled() {
                    let how = if ended.is_err() { "panicked" } else { "ended" };
                    tracing::error!(controller = %name, "controller {how} before the manager stopped it");
                    health.died(&name);
                }
            });
        }

        shutdown.await;
        tracing::info!("manager shutting down: draining every controller");
        shared.stop.cancel();
        while controllers.join_next().await.is_some() {}
        if let Some(membership) = membership {
            membership.leave().await;
        }
        if let Some(elector) = elector
            && let Err(error) = elector.release().await
        {
            tracing::warn!(%error, "could not release the lease; it will expire");
        }
        gate.abort();
        for source in sources {
            source.abort();
        }
        endpoint_stop.cancel();
        if let Some(endpoint) = endpoint {
            let _ = endpoint.await;
        }
        Ok(())
    }
}

impl fmt::Debug for Manager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Manager")
            .field("sources", &*self.shared.sources.lock())
            .field(
                "controllers",
                &self.added.iter().map(|a| &a.name).collect::<Vec<_>>(),
            )
            .field("endpoint", &self.local_addr())
            .finish_non_exhaustive()
    }
}

/// A shared watch paced between failures by kube-runtime's default backoff
/// (a `410 Gone` re-lists at once): it runs on its own task, so the
/// controllers' trigger backoffs, which pace what they receive, do not pace
/// it, and without this a failing list would be retried in a loop.
fn paced<S, T>(watch: S) -> crate::watch_backoff::WatchBackoff<S, watcher::DefaultBackoff>
where
    S: futures_core::Stream<Item = Result<T, watcher::Error>>,
{
    crate::watch_backoff::WatchBackoff::new(watch, watcher::DefaultBackoff::default())
}
