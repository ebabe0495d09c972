//! The running server: its handle ([`LocalApiServer`]), its listeners
//! ([`Endpoint`]s, one per replica that needs its own line to the server)
//! and the connection loop that reads requests and writes replies.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};

use crate::api::{self, EndpointState, Plan, Reply, Shared};
use crate::counts::RequestCounts;
use crate::faults::Fault;
use crate::http::{self, ReadError};
use crate::kinds::{KindSpec, split_api_version};
use crate::status::ApiError;
use crate::store::{ObjKey, Store};
use crate::watch::WatchMsg;

/// A Kubernetes API server in this process, on a loopback port.
///
/// A cheap `Clone` handle: the server runs until the last handle is
/// dropped, then its listeners and every open connection (watches
/// included) are aborted. [`Endpoint`]s and `Client`s do not keep it
/// running.
///
/// The server runs on a thread and a tokio runtime of its own, like a real
/// apiserver in another process: its watch timeouts and injected delays
/// take real time even when a test pauses tokio's clock, and it serves
/// clients on any runtime (or several).
///
/// See the [crate docs](crate) for what it serves and how it differs from
/// a real kube-apiserver.
#[derive(Clone, Debug)]
pub struct LocalApiServer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    main: Endpoint,
    endpoints: Mutex<Vec<Endpoint>>,
    tasks: Mutex<Vec<AbortHandle>>,
    runtime: tokio::runtime::Handle,
    /// Ends the server's thread, whose runtime then drops every task.
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
        if let Some(stop) = self.stop.lock().take() {
            let _ = stop.send(());
        }
    }
}

/// One listener on the server's state: its own loopback port, its own
/// connections, its own request counts and faults.
///
/// Give each replica of a controller its own endpoint's client, and
/// [`disconnect`](Endpoint::disconnect) one to cut that replica off from
/// the API server while the others go on.
#[derive(Clone, Debug)]
pub struct Endpoint {
    inner: Arc<EndpointInner>,
}

#[derive(Debug)]
struct EndpointInner {
    addr: SocketAddr,
    connected: watch::Sender<bool>,
    state: EndpointState,
}

impl LocalApiServer {
    /// Starts a server on `127.0.0.1` on a port chosen by the system, with
    /// the built-in kinds and the namespaces `default`, `kube-system`,
    /// `kube-public` and `kube-node-lease`.
    ///
    /// It is `async` for the sake of callers (it awaits nothing): the
    /// server needs no runtime from its caller.
    ///
    /// # Panics
    /// If the server's thread or runtime cannot be started, or no loopback
    /// port can be bound.
    pub async fn start() -> LocalApiServer {
        let (runtime, stop) = server_thread();
        let mut store = Store::new();
        store.create_builtin_namespaces();
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            counts: Mutex::new(RequestCounts::default()),
            faults: Mutex::new(Vec::new()),
            watch_opened: tokio::sync::Notify::new(),
        });
        let (main, task) = Endpoint::spawn(&shared, &runtime);
        LocalApiServer {
            inner: Arc::new(Inner {
                shared,
                main: main.clone(),
                endpoints: Mutex::new(vec![main]),
                tasks: Mutex::new(vec![task]),
                runtime,
                stop: Mutex::new(Some(stop)),
            }),
        }
    }

    /// `http://127.0.0.1:PORT` of the main endpoint.
    pub fn url(&self) -> String {
        self.inner.main.url()
    }

    /// A client configuration for the main endpoint (plain HTTP, default
    /// namespace `default`). kube-client's defaults otherwise, including
    /// its retries of 429/503/504 answers (`default_retry`): turn those off
    /// to see injected faults of those codes on the first try.
    pub fn client_config(&self) -> kube_client::Config {
        self.inner.main.client_config()
    }

    /// A `kube_client::Client` for the main endpoint.
    pub fn client(&self) -> kube_client::Client {
        self.inner.main.client()
    }

    /// The main endpoint (the one [`url`](Self::url) names).
    pub fn main_endpoint(&self) -> Endpoint {
        self.inner.main.clone()
    }

    /// Another listener on the same state, on a port of its own: one
    /// replica's line to the server (see [`Endpoint`]).
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub fn endpoint(&self) -> Endpoint {
        let (ep, task) = Endpoint::spawn(&self.inner.shared, &self.inner.runtime);
        self.inner.tasks.lock().push(task);
        self.inner.endpoints.lock().push(ep.clone());
        ep
    }

    /// Serves another kind (in addition to the built-in kinds and those of
    /// the CustomResourceDefinitions created through the API). Registering
    /// a kind again replaces its spec; stored objects stay.
    pub fn register(&self, kind: KindSpec) {
        self.inner.shared.store.lock().registry.register(kind);
    }

    /// Request counts (all endpoints) since the start or the last
    /// [`reset_requests`](Self::reset_requests).
    pub fn requests(&self) -> RequestCounts {
        self.inner.shared.counts.lock().clone()
    }

    /// Sets the request counts (the server's and every endpoint's) to zero.
    pub fn reset_requests(&self) {
        *self.inner.shared.counts.lock() = RequestCounts::default();
        for ep in self.inner.endpoints.lock().iter() {
            ep.reset_requests();
        }
    }

    /// Compaction: forgets every resourceVersion up to now. Open watches get
    /// an `ERROR` event (a `Status` with code 410, reason `Expired`) and
    /// end; a watch or an exact list (or a continued one) from an older
    /// version gets the same 410, so a kube-runtime watcher re-lists.
    pub fn expire_watches(&self) {
        self.inner.shared.store.lock().expire();
    }

    /// Ends every open watch cleanly (as a watch timeout does): watchers
    /// re-watch from their last resourceVersion, without a re-list.
    pub fn close_watches(&self) {
        self.inner.shared.store.lock().close_watches();
    }

    /// Sends a `BOOKMARK` at the current resourceVersion to every watch
    /// that asked for bookmarks (`allowWatchBookmarks=true`). A real server
    /// sends them about once a minute; this one only when told.
    pub fn bookmark(&self) {
        self.inner.shared.store.lock().bookmark();
    }

    /// The current (last handed out) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.shared.store.lock().rv
    }

    /// How many watches are open (whose clients are still there).
    pub fn open_watches(&self) -> usize {
        self.inner.shared.store.lock().open_watches()
    }

    /// Waits until at least `n` watches are open, for at most `limit` of
    /// real time (not tokio's clock, which a test may have paused while the
    /// server works); returns whether they are. A watch counts as open once
    /// it is registered, so every change made after this returns `true`
    /// reaches it.
    pub async fn wait_for_watches(&self, n: usize, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let opened = self.inner.shared.watch_opened.notified();
            if self.open_watches() >= n {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            // A nap on a blocking thread is real time; closed watches are
            // only noticed by looking again, hence the short naps.
            let nap = tokio::task::spawn_blocking(move || {
                std::thread::sleep(left.min(Duration::from_millis(5)));
            });
            tokio::select! {
                _ = opened => {}
                _ = nap => {}
            }
        }
    }

    /// Injects a fault into matching requests on every endpoint (see
    /// [`Fault`]).
    pub fn inject(&self, fault: Fault) {
        self.inner.shared.faults.lock().push(fault);
    }

    /// Removes the faults injected with [`inject`](Self::inject).
    pub fn clear_faults(&self) {
        self.inner.shared.faults.lock().clear();
    }

    /// How many changes the server remembers (default 200,000): watches
    /// and exact lists from before the oldest remembered change get 410,
    /// as after an etcd compaction.
    pub fn set_history_limit(&self, changes: usize) {
        let mut store = self.inner.shared.store.lock();
        store.history_limit = changes.max(1);
        while store.history.len() > store.history_limit {
            if let Some(old) = store.history.pop_front() {
                store.oldest_rv = old.rv;
            }
        }
    }

    // Backdoors: the state, changed or read without HTTP and without being
    // counted as requests.

    /// Backdoor: creates an object, or replaces it if it exists (without a
    /// resourceVersion check: one in `object` is ignored), with the same
    /// rules and watch events as the API; `.status` is written too, even for kinds with the status
    /// subresource. A missing namespace is created. `object` needs
    /// `apiVersion` and `kind` (a k8s-openapi object serializes them).
    /// Returns the stored object.
    pub fn upsert<T: Serialize>(&self, object: &T) -> Result<Value, ApiError> {
        let object = serde_json::to_value(object)
            .map_err(|e| ApiError::bad_request(format!("object does not serialize: {e}")))?;
        let mut store = self.inner.shared.store.lock();
        let kind = kind_of(&store, &object)?;
        store.upsert(&kind, object).map(|o| (*o).clone())
    }

    /// Backdoor: creates namespace `name` unless it exists. Objects can only
    /// be created in a namespace that exists (404 otherwise, as on a real
    /// server); `default`, `kube-system`, `kube-public` and
    /// `kube-node-lease` exist from the start.
    pub fn create_namespace(&self, name: &str) -> Result<(), ApiError> {
        if self.object("v1", "Namespace", None, name).is_some() {
            return Ok(());
        }
        self.upsert(&serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": name },
        }))
        .map(|_| ())
    }

    /// Backdoor: the stored object, if any (`namespace` `None` for
    /// cluster-scoped kinds).
    pub fn object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let store = self.inner.shared.store.lock();
        let key = key_of(&store, api_version, kind, namespace, name)?;
        store.object(&key).map(|o| (**o).clone())
    }

    /// Backdoor: the names of the stored objects of a kind, as
    /// `namespace/name` (or `name` for cluster-scoped kinds), in order.
    pub fn object_names(&self, api_version: &str, kind: &str) -> Vec<String> {
        let store = self.inner.shared.store.lock();
        let Some(spec) = store.registry.by_kind(api_version, kind) else {
            return Vec::new();
        };
        let resource = spec.resource();
        store
            .objects
            .keys()
            .filter(|k| k.group == resource.group && k.plural == resource.plural)
            .map(|k| {
                if k.namespace.is_empty() {
                    k.name.clone()
                } else {
                    format!("{}/{}", k.namespace, k.name)
                }
            })
            .collect()
    }

    /// Backdoor: removes an object now, finalizers or not, with a `DELETED`
    /// event. Returns whether it existed.
    pub fn remove(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> bool {
        self.with_key(api_version, kind, namespace, name, |store, key| {
            let existed = store.remove(key).is_some();
            store.settle();
            existed
        })
    }

    /// Backdoor: removes an object without any watch event, as if its
    /// `DELETED` event had been lost (a missed delete): only a re-list
    /// shows it is gone. Returns whether it existed.
    pub fn forget(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> bool {
        self.with_key(api_version, kind, namespace, name, |store, key| {
            store.forget(key)
        })
    }

    /// `f` on the store and the key of an object of a served kind; false
    /// (without calling `f`) for a kind the server does not serve.
    fn with_key(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        f: impl FnOnce(&mut Store, &ObjKey) -> bool,
    ) -> bool {
        let mut store = self.inner.shared.store.lock();
        match key_of(&store, api_version, kind, namespace, name) {
            Some(key) => f(&mut store, &key),
            None => false,
        }
    }
}

/// Starts the server's thread with a current-thread runtime; returns the
/// runtime's handle and the sender that ends it.
fn server_thread() -> (tokio::runtime::Handle, tokio::sync::oneshot::Sender<()>) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (handle_tx, handle_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("kube-local-apiserver".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the local API server");
            handle_tx
                .send(runtime.handle().clone())
                .expect("the starter waits for the handle");
            runtime.block_on(async {
                let _ = stop_rx.await;
            });
            // Dropping the runtime here drops every task: listeners,
            // connections, watches.
        })
        .expect("a thread for the local API server");
    let handle = handle_rx
        .recv()
        .expect("the local API server's runtime started");
    (handle, stop_tx)
}

/// The served kind of an object, by its `apiVersion` and `kind`.
fn kind_of(store: &Store, object: &Value) -> Result<KindSpec, ApiError> {
    let api_version = object.get("apiVersion").and_then(Value::as_str);
    let kind = object.get("kind").and_then(Value::as_str);
    let (Some(api_version), Some(kind)) = (api_version, kind) else {
        return Err(ApiError::bad_request(
            "the object needs apiVersion and kind",
        ));
    };
    store
        .registry
        .by_kind(api_version, kind)
        .cloned()
        .ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!(
                    "the server does not serve kind {kind} in group {:?} ({api_version})",
                    split_api_version(api_version).0
                ),
            )
        })
}

fn key_of(
    store: &Store,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Option<ObjKey> {
    let spec = store.registry.by_kind(api_version, kind)?;
    let ns = if spec.namespaced {
        namespace.unwrap_or("default")
    } else {
        ""
    };
    Some(ObjKey::new(&spec.resource(), ns, name))
}

impl Endpoint {
    fn spawn(shared: &Arc<Shared>, runtime: &tokio::runtime::Handle) -> (Endpoint, AbortHandle) {
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port on 127.0.0.1");
        std_listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = std_listener.local_addr().expect("the listener's address");
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(std_listener).expect("a tokio listener")
        };
        let (connected, _) = watch::channel(true);
        let ep = Endpoint {
            inner: Arc::new(EndpointInner {
                addr,
                connected,
                state: EndpointState::default(),
            }),
        };
        let task = runtime.spawn(accept_loop(listener, shared.clone(), ep.inner.clone()));
        (ep, task.abort_handle())
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// A client configuration for this endpoint (see
    /// [`LocalApiServer::client_config`]).
    pub fn client_config(&self) -> kube_client::Config {
        let mut config = kube_client::Config::new(self.url().parse().expect("a valid URL"));
        config.connect_timeout = Some(Duration::from_secs(5));
        config
    }

    /// A `kube_client::Client` for this endpoint.
    pub fn client(&self) -> kube_client::Client {
        kube_client::Client::try_from(self.client_config()).expect("a client for a plain-HTTP URL")
    }

    /// Cuts this endpoint off: its open connections (watches and requests
    /// in flight included) are dropped at once, without a proper end, and
    /// new connections are closed as soon as they are accepted, until
    /// [`reconnect`](Self::reconnect). Other endpoints are not affected. A
    /// request the server had already carried out may lose its answer, as
    /// on a real network.
    pub fn disconnect(&self) {
        self.inner.connected.send_replace(false);
    }

    /// Serves connections again after [`disconnect`](Self::disconnect).
    pub fn reconnect(&self) {
        self.inner.connected.send_replace(true);
    }

    /// Whether the endpoint serves connections (not disconnected).
    pub fn is_connected(&self) -> bool {
        *self.inner.connected.borrow()
    }

    /// Request counts on this endpoint.
    pub fn requests(&self) -> RequestCounts {
        self.inner.state.counts.lock().clone()
    }

    /// Sets this endpoint's request counts to zero.
    pub fn reset_requests(&self) {
        *self.inner.state.counts.lock() = RequestCounts::default();
    }

    /// Injects a fault into matching requests on this endpoint only.
    pub fn inject(&self, fault: Fault) {
        self.inner.state.faults.lock().push(fault);
    }

    /// Removes the faults injected on this endpoint.
    pub fn clear_faults(&self) {
        self.inner.state.faults.lock().clear();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, ep: Arc<EndpointInner>) {
    // Dropping the set (when this task is aborted) aborts every connection.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    if !*ep.connected.borrow() {
                        drop(stream);
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    connections.spawn(serve(stream, shared.clone(), ep.clone()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Serves one connection until it closes, or until the endpoint is
/// disconnected (then the socket is dropped mid-stream).
async fn serve(stream: TcpStream, shared: Arc<Shared>, ep: Arc<EndpointInner>) {
    let mut connected = ep.connected.subscribe();
    if !*connected.borrow_and_update() {
        return;
    }
    let (rd, wr) = stream.into_split();
    tokio::select! {
        _ = requests(BufReader::new(rd), wr, &shared, &ep) => {}
        _ = connected.wait_for(|c| !*c) => {}
    }
}

async fn requests(
    mut rd: BufReader<OwnedReadHalf>,
    mut wr: OwnedWriteHalf,
    shared: &Shared,
    ep: &EndpointInner,
) {
    loop {
        let req = match http::read_request(&mut rd).await {
            Ok(r) => r,
            Err(ReadError::Closed) => return,
            Err(ReadError::Malformed(why)) => {
                let e = ApiError::bad_request(why);
                let body = serde_json::to_vec(&e.to_status()).expect("JSON values serialize");
                let _ = wr.write_all(&http::full_response(400, &body, false)).await;
                return;
            }
            Err(ReadError::TooLarge) => {
                let e = ApiError::too_large("the request body is too large");
                let body = serde_json::to_vec(&e.to_status()).expect("JSON values serialize");
                let _ = wr.write_all(&http::full_response(413, &body, false)).await;
                return;
            }
        };
        let keep_alive = !req.wants_close();
        let reply = match api::admit(shared, &ep.state, &req) {
            Plan::Now(reply) => reply,
            Plan::Later(delay, call) => {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                api::handle(shared, &call, &req)
            }
        };
        let reusable = match reply {
            Reply::Json { code, body } => wr
                .write_all(&http::full_response(code, &body, keep_alive))
                .await
                .is_ok(),
            Reply::Watch { rx, timeout } => {
                stream_watch(&mut rd, &mut wr, rx, timeout, keep_alive).await
            }
        };
        if !reusable || !keep_alive {
            let _ = wr.shutdown().await;
            return;
        }
    }
}

/// Streams a watch until it ends (returns true: the connection can serve
/// another request) or the client goes away (false).
async fn stream_watch(
    rd: &mut BufReader<OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<WatchMsg>,
    timeout: Duration,
    keep_alive: bool,
) -> bool {
    if wr.write_all(&http::chunked_head(keep_alive)).await.is_err() {
        return false;
    }
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let mut out = Vec::new();
                let mut ended = false;
                match msg {
                    Some(WatchMsg::Line(line)) => out.extend(http::chunk(line.as_bytes())),
                    Some(WatchMsg::End) | None => ended = true,
                }
                // Whatever else is queued goes out in the same write.
                while !ended {
                    match rx.try_recv() {
                        Ok(WatchMsg::Line(line)) => out.extend(http::chunk(line.as_bytes())),
                        Ok(WatchMsg::End) => ended = true,
                        Err(_) => break,
                    }
                }
                if !out.is_empty() && wr.write_all(&out).await.is_err() {
                    return false;
                }
                if ended {
                    break;
                }
            }
            _ = &mut deadline => break,
            // A client sends nothing while it watches: anything readable
            // (most likely the end of the connection) means it is gone.
            _ = rd.fill_buf() => return false,
        }
    }
    wr.write_all(http::LAST_CHUNK).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_can_cross_threads() {
        fn send_sync<T: Send + Sync + 'static>() {}
        send_sync::<LocalApiServer>();
        send_sync::<Endpoint>();
    }

    #[tokio::test]
    async fn namespaces_are_created_once() {
        let server = LocalApiServer::start().await;
        assert!(server.object("v1", "Namespace", None, "default").is_some());
        server.create_namespace("c1").unwrap();
        let uid = server.object("v1", "Namespace", None, "c1").unwrap()["metadata"]["uid"].clone();
        server.create_namespace("c1").unwrap();
        assert_eq!(
            server.object("v1", "Namespace", None, "c1").unwrap()["metadata"]["uid"],
            uid
        );
        assert_eq!(server.create_namespace("Not_A_Name").unwrap_err().code, 422);
    }
}
