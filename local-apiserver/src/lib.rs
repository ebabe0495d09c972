//! An in-process Kubernetes API server for tests: what a controller relies
//! on, served over plain HTTP to a real `kube_client::Client`.
//!
//! [`LocalApiServer::start`] binds a loopback port and serves the built-in
//! kinds (ConfigMaps, Secrets, Pods, Services, ServiceAccounts, Endpoints,
//! core and `events.k8s.io` Events, Namespaces, Nodes, Leases, Deployments,
//! ReplicaSets, StatefulSets, DaemonSets, Jobs and
//! CustomResourceDefinitions) and every kind a CRD created through the API
//! declares. Tests drive clients and kube-runtime against it, count the
//! requests they make ([`LocalApiServer::requests`]) and inject faults:
//! compaction ([`LocalApiServer::expire_watches`]), ended watches, errors
//! and delays ([`Fault`]), and replicas cut off from the server
//! ([`Endpoint::disconnect`]).
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_client::Api;
//! use kube_client::api::{Patch, PatchParams, PostParams};
//! use kube_local_apiserver::{LocalApiServer, Verb};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kube_client::Error> {
//! let server = LocalApiServer::start().await;
//! let configmaps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
//!
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("settings".into());
//! let created = configmaps.create(&PostParams::default(), &cm).await?;
//! assert!(created.metadata.uid.is_some());
//!
//! // A write with a stale resourceVersion is refused, as on a real server.
//! let patch = serde_json::json!({ "data": { "mode": "fast" } });
//! configmaps
//!     .patch("settings", &PatchParams::default(), &Patch::Merge(&patch))
//!     .await?;
//! let err = configmaps
//!     .replace("settings", &PostParams::default(), &created)
//!     .await
//!     .unwrap_err();
//! assert!(matches!(err, kube_client::Error::Api(s) if s.code == 409));
//!
//! let counts = server.requests();
//! assert_eq!(counts.of(Verb::Create, "configmaps"), 1);
//! assert_eq!(counts.of(Verb::Update, "configmaps"), 1);
//! assert_eq!(counts.of(Verb::Get, "configmaps"), 0);
//! # Ok(())
//! # }
//! ```
//!
//! # What it does as a real kube-apiserver does
//!
//! * **Storage and versions**: objects as JSON, keyed by group, plural,
//!   namespace and name; one resourceVersion counter for all (as etcd's
//!   revision); a kind served in several versions is one object read in
//!   any of them (no conversion beyond `apiVersion`).
//! * **Create** (POST): `generateName`, 409 AlreadyExists, 404 for a
//!   missing namespace (create it through the API, or with
//!   [`LocalApiServer::create_namespace`]), 403 in a terminating one, 500
//!   with no reason for a body with a resourceVersion (the real server's
//!   etcd3 store error, which its registry does not map to a 4xx); the
//!   server sets `uid`, `creationTimestamp`, `resourceVersion` and, for
//!   kinds that keep it, `generation: 1`; names, labels, annotations,
//!   finalizers and ownerReferences are validated (422 Invalid).
//! * **Get** (404 NotFound as a `Status`), **list** with `resourceVersion`
//!   in the list metadata, `limit`/`continue` pagination (consistent at the
//!   first page's version, 410 once that is compacted), `resourceVersion`
//!   and `resourceVersionMatch` semantics, label selectors (`=`, `==`,
//!   `!=`, `in`, `notin`, exists, `!key`, `>`, `<`) and field selectors
//!   (`metadata.name`, `metadata.namespace` and each kind's own fields, such
//!   as a Pod's `spec.nodeName` or a CRD's `selectableFields`; others are
//!   400), across all namespaces or in one.
//! * **Watch** from a resourceVersion (the events after it), from none or
//!   `0` (the current state as `ADDED`, then changes), with
//!   `sendInitialEvents=true` (the current state, then a `BOOKMARK`
//!   annotated `k8s.io/initial-events-end`), `allowWatchBookmarks`,
//!   `timeoutSeconds` (a clean end), selectors applied to every event (an
//!   object that stops matching is sent as `DELETED`, carrying its last
//!   matching state at the version of the change, as the watch cache does;
//!   one that starts matching as `ADDED`), and 410 Gone as an `ERROR`
//!   event (`Status` code 410, reason `Expired`) for a compacted version.
//! * **Replace** (PUT): 409 Conflict for a stale `metadata.resourceVersion`,
//!   unconditional without one (except for Leases, CRDs and custom
//!   resources: 422); a PUT of a missing Lease creates it, whatever
//!   resourceVersion it carries (409 if it carries a uid), as
//!   kube-apiserver's Lease strategy allows create on update;
//!   `generation` grows when anything outside metadata (and status)
//!   changes; a write that changes nothing makes no new version and no
//!   event.
//! * **Patch**: JSON merge patch, JSON patch (RFC 6902; a failed `test` is
//!   422 Invalid, and `test` of a missing path against `null` passes, as in
//!   the Go library, which kube-runtime's `finalizer` helper relies on),
//!   strategic merge patch (lists merged by their merge key for the usual
//!   fields: containers, env, volumes, ports, conditions, ownerReferences,
//!   finalizers as a set, ordered as apimachinery orders it: the patch's
//!   new items first where no shared item anchors them; directives
//!   `$patch`, `$deleteFromPrimitiveList`, `$setElementOrder`; 415 for custom resources) and server-side apply
//!   (create or merge; see below). A resourceVersion in a patch is a
//!   precondition (409).
//! * **Status subresource** (custom resources that declare it,
//!   Deployments, Pods, ...): `/status` changes only `.status`; writes to
//!   the object keep the old `.status`; creates drop it.
//! * **Deletion**: preconditions (uid, resourceVersion: 409); an object
//!   with finalizers gets `deletionTimestamp` and
//!   `deletionGracePeriodSeconds: 0` (a `MODIFIED` event) and goes (a
//!   `DELETED` event) with the write that removes its last finalizer; new
//!   finalizers on a deleting object are refused (422). Deleting a
//!   Namespace deletes what is in it, then the Namespace; deleting a CRD
//!   deletes its custom resources, then the CRD, and its kind stops being
//!   served. `deletecollection` with selectors.
//! * **CRDs**: creating one (validated: name `plural.group`, one storage
//!   version) serves its served versions at once, with scope, status
//!   subresource and `selectableFields`; its status says `NamesAccepted`
//!   and `Established`.
//! * **ownerReferences** are validated (one controller at most) and kept.
//! * ConfigMaps and Secrets marked `immutable` refuse changes to their data
//!   (422); a Secret's `stringData` is stored base64-encoded in `data`.
//! * **Metadata-only** requests (`PartialObjectMetadata`, as kube-runtime's
//!   `metadata_watcher` makes them), `dryRun=All`, discovery (`/version`,
//!   `/api`, `/apis`, per group and version) and `/healthz`.
//! * **Errors** are `Status` objects with the code, reason and details a
//!   real server gives, so kube-client returns `Error::Api` with them.
//!
//! # What it does not do
//!
//! * No authentication, authorization (RBAC), admission webhooks or
//!   audit; plain HTTP only; HTTP/1.1 only.
//! * No controllers: no garbage collection of dependents (ownerReferences
//!   are kept; kube-controller-manager deletes dependents on a real
//!   cluster, not the apiserver), `propagationPolicy` (`Foreground`,
//!   `Orphan`) is accepted and ignored, no scheduler or kubelet (Pods are
//!   deleted at once, without a grace period; nothing ever runs), no
//!   Deployment rollouts, no Endpoints, no namespace default
//!   ServiceAccount.
//! * No defaulting or schema validation of object bodies beyond metadata:
//!   a CRD's `openAPIV3Schema` is not enforced and unknown fields are not
//!   pruned; built-in kinds get no defaults (a Pod has no `restartPolicy`
//!   unless sent, and only `status.phase: Pending`, no QoS class).
//! * Server-side apply without field management: no `managedFields`, no
//!   conflicts between managers (`force` is accepted and has no effect),
//!   fields a manager stops applying are not removed, `null` in an apply
//!   configuration means "no opinion"; lists with merge keys merge as in a
//!   strategic merge patch, other lists are replaced.
//! * Request bodies must be JSON (kube-client sends JSON), apply
//!   configurations included, not YAML.
//! * The strategic merge patch knows merge keys by field name only (the
//!   common fields listed above), not from each type's schema.
//!   `$setElementOrder` is accepted and not used: a merged set of
//!   primitives (finalizers) is ordered by the patch's own list, not by a
//!   `$setElementOrder` the patch carries for it.
//! * `/status` writes change only `.status` for every kind (some built-in
//!   kinds also let status writes change a few other fields).
//! * Bookmarks only when a test calls [`LocalApiServer::bookmark`] (and the
//!   one ending `sendInitialEvents`), not once a minute. A watch from a
//!   resourceVersion the server has not reached yet waits for it without a
//!   time limit; a list asking for one gets 504 at once (a real server
//!   waits up to 3 s first).
//! * Lists always read the current state unless an exact version is asked
//!   for (or paged), which a real server may serve from a slightly older
//!   watch cache; `limit` is honoured for every `resourceVersion`.
//! * No subresources besides `/status` (no `/scale`, `/log`, `/exec`,
//!   `/eviction`, `/binding`), no Table output, no aggregated discovery,
//!   no OpenAPI documents, no protobuf or CBOR, no gzip.
//! * Every change is kept for watches to resume from, up to a limit
//!   ([`LocalApiServer::set_history_limit`], 200,000 by default), instead of
//!   an etcd compaction every five minutes; [`LocalApiServer::expire_watches`]
//!   compacts on demand.
//! * Timestamps have whole seconds; `uid`s are random-looking, not
//!   cryptographically random.
//!
//! # Time
//!
//! The server runs on a thread with a tokio runtime of its own, as a real
//! apiserver runs in a process of its own: watch timeouts, injected delays
//! and [`LocalApiServer::wait_for_watches`] take real time, and timestamps
//! come from the system clock, even in a test that pauses tokio's clock.
//! Clients are another matter: under paused time, their own timers (such as
//! kube-runtime's watcher's idle timeout, 290 s and a margin) fire as soon
//! as the test's runtime waits, and a test's `tokio::time::timeout` around
//! a request can elapse before the server has answered.
//!
//! # Reusable behaviour checks
//!
//! With the `conformance` feature, [`conformance`] holds the checks this
//! crate's tests run, as functions of a `kube_client::Client` and a
//! namespace, so the same checks can run against a real kube-apiserver.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod api;
mod counts;
mod discovery;
mod faults;
mod http;
mod kinds;
mod meta;
mod patch;
mod selector;
mod server;
mod status;
mod store;
mod verbs;
mod watch;

#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;

pub use counts::{RequestCounts, Verb};
pub use faults::Fault;
pub use kinds::KindSpec;
pub use server::{Endpoint, LocalApiServer};
pub use status::ApiError;

// The README's example is compiled and run with the doc-tests, so what
// users copy from it works.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
