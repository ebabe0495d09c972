//! A small fake Kubernetes API server for ConfigMaps, shared by the `kube`
//! tests and the `kube_controller` example (which includes this file with
//! `#[path]`). It is not part of the library.
//!
//! It speaks just enough plain HTTP/1.1 on `127.0.0.1` for a real
//! `kube::Client` and kube-runtime `watcher`:
//!
//! * `GET /api/v1/configmaps` and `GET /api/v1/namespaces/{ns}/configmaps`:
//!   a `ConfigMapList` with the current `resourceVersion`;
//! * the same with `watch=true`: a chunked stream of `ADDED` / `MODIFIED` /
//!   `DELETED` / `BOOKMARK` JSON lines from the requested `resourceVersion`
//!   on, or a single `ERROR` event with code 410 (Gone) when that version
//!   was expired, which makes the watcher re-list;
//! * `GET /api/v1/namespaces/{ns}/configmaps/{name}`: one object or 404.
//!
//! The test drives it: [`FakeApiServer::apply`] and [`FakeApiServer::delete`]
//! change objects and notify open watches, [`FakeApiServer::expire_watches`]
//! forces a re-list, [`FakeApiServer::forget_silently`] removes an object
//! without any watch event (as if the event was missed). Every request is
//! answered with `Connection: close`. The server stops when dropped: the
//! accept loop and every connection task are aborted.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::serde_json::{self, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

/// Longest request head the server reads before giving up on a connection.
const MAX_HEAD: usize = 16 * 1024;

/// A running fake API server; stops when dropped.
#[derive(Debug)]
pub struct FakeApiServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

#[derive(Debug)]
enum WatchMsg {
    Line(String),
    Close,
}

#[derive(Debug, Default)]
struct State {
    /// The last resourceVersion handed out.
    rv: u64,
    /// Watches from a version below this one get 410 Gone.
    oldest_rv: u64,
    /// Current objects by (namespace, name).
    objects: BTreeMap<(String, String), Value>,
    /// Every change since `oldest_rv`: (rv, type, namespace, object).
    history: Vec<(u64, &'static str, String, Value)>,
    /// Open watches: namespace filter and where to send lines.
    watchers: Vec<(Option<String>, mpsc::UnboundedSender<WatchMsg>)>,
    lists: usize,
    watches: usize,
    gets: usize,
}

impl State {
    fn notify(&mut self, ty: &'static str, ns: &str, object: &Value) {
        let line = event_line(ty, object);
        self.watchers.retain(|(filter, tx)| {
            if filter.as_deref().is_some_and(|f| f != ns) {
                return !tx.is_closed();
            }
            tx.send(WatchMsg::Line(line.clone())).is_ok()
        });
    }
}

fn event_line(ty: &str, object: &Value) -> String {
    let mut line = serde_json::to_string(&json!({ "type": ty, "object": object }))
        .expect("JSON values serialize");
    line.push('\n');
    line
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

impl FakeApiServer {
    /// Starts a server on an ephemeral port of 127.0.0.1 with no objects.
    pub async fn start() -> FakeApiServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let state = Arc::new(Mutex::new(State {
            rv: 100,
            oldest_rv: 100,
            ..State::default()
        }));
        let accept_state = state.clone();
        let task = tokio::spawn(async move {
            // Dropping the set (when this task is aborted) aborts every
            // connection, open watches included.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            connections.spawn(serve(stream, accept_state.clone()));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        FakeApiServer { addr, state, task }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the cluster URL for a client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client configuration pointing at this server (plain HTTP, namespace
    /// `default`).
    pub fn client_config(&self) -> kube_client::Config {
        let mut config = kube_client::Config::new(self.url().parse().expect("a valid URL"));
        config.connect_timeout = Some(Duration::from_secs(5));
        config.read_timeout = Some(Duration::from_secs(30));
        config
    }

    /// A `kube::Client` for this server.
    pub fn client(&self) -> kube_client::Client {
        kube_client::Client::try_from(self.client_config()).expect("client for the fake server")
    }

    /// Creates or modifies ConfigMap `ns/name` with `data`, notifies watches
    /// (`ADDED` or `MODIFIED`) and returns its new resourceVersion.
    pub fn apply(&self, ns: &str, name: &str, data: &[(&str, &str)]) -> u64 {
        self.apply_with_meta(ns, name, data, &[], &[])
    }

    /// As [`apply`](Self::apply), with labels and annotations.
    pub fn apply_with_meta(
        &self,
        ns: &str,
        name: &str,
        data: &[(&str, &str)],
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> u64 {
        let map = |pairs: &[(&str, &str)]| -> serde_json::Map<String, Value> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                .collect()
        };
        let mut st = self.state.lock().unwrap();
        st.rv += 1;
        let rv = st.rv;
        let object = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": format!("uid-{ns}-{name}"),
                "resourceVersion": rv.to_string(),
                "labels": map(labels),
                "annotations": map(annotations),
            },
            "data": map(data),
        });
        let key = (ns.to_string(), name.to_string());
        let ty = if st.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        st.objects.insert(key, object.clone());
        st.history.push((rv, ty, ns.to_string(), object.clone()));
        st.notify(ty, ns, &object);
        rv
    }

    /// Deletes ConfigMap `ns/name` and notifies watches (`DELETED`). Returns
    /// whether it existed.
    pub fn delete(&self, ns: &str, name: &str) -> bool {
        let mut st = self.state.lock().unwrap();
        let Some(mut object) = st.objects.remove(&(ns.to_string(), name.to_string())) else {
            return false;
        };
        st.rv += 1;
        let rv = st.rv;
        object["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        st.history
            .push((rv, "DELETED", ns.to_string(), object.clone()));
        st.notify("DELETED", ns, &object);
        true
    }

    /// Removes ConfigMap `ns/name` without telling anyone, as if its
    /// `DELETED` event had been lost: only a re-list reveals it.
    pub fn forget_silently(&self, ns: &str, name: &str) -> bool {
        let mut st = self.state.lock().unwrap();
        let existed = st
            .objects
            .remove(&(ns.to_string(), name.to_string()))
            .is_some();
        if existed {
            st.rv += 1;
        }
        existed
    }

    /// Sends a `BOOKMARK` at the current resourceVersion to every open watch.
    pub fn bookmark(&self) {
        let mut st = self.state.lock().unwrap();
        let object = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "resourceVersion": st.rv.to_string() },
        });
        let line = event_line("BOOKMARK", &object);
        st.watchers
            .retain(|(_, tx)| tx.send(WatchMsg::Line(line.clone())).is_ok());
    }

    /// Expires every resourceVersion up to now: open watches get an `ERROR`
    /// event with code 410 (Gone) and are closed, and a watch resuming from
    /// an older version gets the same, so watchers re-list.
    pub fn expire_watches(&self) {
        let mut st = self.state.lock().unwrap();
        st.oldest_rv = st.rv;
        let oldest = st.oldest_rv;
        st.history.retain(|(rv, ..)| *rv > oldest);
        let line = event_line(
            "ERROR",
            &status(
                410,
                "Expired",
                "too old resource version (expired by the test)",
            ),
        );
        for (_, tx) in st.watchers.drain(..) {
            let _ = tx.send(WatchMsg::Line(line.clone()));
            let _ = tx.send(WatchMsg::Close);
        }
    }

    /// Closes every open watch normally (end of stream), as an API server
    /// does when a watch times out; watchers resume from their last version.
    pub fn close_watches(&self) {
        let mut st = self.state.lock().unwrap();
        for (_, tx) in st.watchers.drain(..) {
            let _ = tx.send(WatchMsg::Close);
        }
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.lock().unwrap().rv
    }

    /// How many list requests were served.
    pub fn list_count(&self) -> usize {
        self.state.lock().unwrap().lists
    }

    /// How many watch requests were served.
    pub fn watch_count(&self) -> usize {
        self.state.lock().unwrap().watches
    }

    /// How many single-object GET requests were served.
    pub fn get_count(&self) -> usize {
        self.state.lock().unwrap().gets
    }

    /// How many watches are open now.
    pub fn open_watches(&self) -> usize {
        let mut st = self.state.lock().unwrap();
        st.watchers.retain(|(_, tx)| !tx.is_closed());
        st.watchers.len()
    }

    /// Waits (up to `limit`) until at least `n` watches are open.
    pub async fn wait_for_watches(&self, n: usize, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while self.open_watches() < n {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// The names (`ns/name`) of the objects that exist now.
    pub fn object_names(&self) -> Vec<String> {
        let st = self.state.lock().unwrap();
        st.objects
            .keys()
            .map(|(ns, name)| format!("{ns}/{name}"))
            .collect()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A parsed request: path segments and query parameters.
struct Request {
    method: String,
    segments: Vec<String>,
    query: BTreeMap<String, String>,
}

async fn read_request(stream: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        let n = stream.read_line(&mut line).await.ok()?;
        if n == 0 {
            return None;
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        head.push_str(&line);
        if head.len() > MAX_HEAD {
            return None;
        }
    }
    let request_line = head.lines().next()?;
    let mut parts = request_line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let segments = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let query = query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    Some(Request {
        method,
        segments,
        query,
    })
}

async fn write_json(stream: &mut BufReader<TcpStream>, code: u16, body: &Value) {
    let body = serde_json::to_string(body).expect("JSON values serialize");
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Error",
    };
    let response = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.get_mut().write_all(response.as_bytes()).await;
    let _ = stream.get_mut().shutdown().await;
}

async fn write_chunk(stream: &mut TcpStream, data: &str) -> std::io::Result<()> {
    let chunk = format!("{:x}\r\n{data}\r\n", data.len());
    stream.write_all(chunk.as_bytes()).await?;
    stream.flush().await
}

async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) {
    let mut stream = BufReader::new(stream);
    let Some(req) = read_request(&mut stream).await else {
        return;
    };
    if req.method != "GET" {
        let body = status(
            405,
            "MethodNotAllowed",
            "the fake API server only serves GET",
        );
        return write_json(&mut stream, 405, &body).await;
    }
    let segs: Vec<&str> = req.segments.iter().map(String::as_str).collect();
    let (ns, name) = match segs.as_slice() {
        ["api", "v1", "configmaps"] => (None, None),
        ["api", "v1", "namespaces", ns, "configmaps"] => (Some(ns.to_string()), None),
        ["api", "v1", "namespaces", ns, "configmaps", name] => {
            (Some(ns.to_string()), Some(name.to_string()))
        }
        _ => {
            let body = status(
                404,
                "NotFound",
                "the fake API server only serves configmaps",
            );
            return write_json(&mut stream, 404, &body).await;
        }
    };
    if let Some(name) = name {
        let found = {
            let mut st = state.lock().unwrap();
            st.gets += 1;
            st.objects
                .get(&(ns.clone().unwrap_or_default(), name.clone()))
                .cloned()
        };
        return match found {
            Some(object) => write_json(&mut stream, 200, &object).await,
            None => {
                let message = format!("configmaps \"{name}\" not found");
                write_json(&mut stream, 404, &status(404, "NotFound", &message)).await
            }
        };
    }
    let watch = matches!(
        req.query.get("watch").map(String::as_str),
        Some("true" | "1")
    );
    if !watch {
        let body = {
            let mut st = state.lock().unwrap();
            st.lists += 1;
            let items: Vec<Value> = st
                .objects
                .iter()
                .filter(|((ons, _), _)| ns.as_ref().is_none_or(|n| n == ons))
                .map(|(_, o)| o.clone())
                .collect();
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMapList",
                "metadata": { "resourceVersion": st.rv.to_string() },
                "items": items,
            })
        };
        return write_json(&mut stream, 200, &body).await;
    }

    // A watch: register under the lock together with the backlog, so no
    // change falls between the two.
    let from: Option<u64> = req
        .query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .filter(|v| *v != 0);
    let timeout = req
        .query
        .get("timeoutSeconds")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(290);
    let (tx, mut rx) = mpsc::unbounded_channel();
    {
        let mut st = state.lock().unwrap();
        st.watches += 1;
        let matches_ns = |ons: &str| ns.as_deref().is_none_or(|n| n == ons);
        match from {
            Some(rv) if rv < st.oldest_rv => {
                let gone = status(410, "Expired", "too old resource version");
                let _ = tx.send(WatchMsg::Line(event_line("ERROR", &gone)));
                let _ = tx.send(WatchMsg::Close);
            }
            Some(rv) => {
                for (_, ty, ons, object) in st.history.iter().filter(|(at, ..)| *at > rv) {
                    if matches_ns(ons) {
                        let _ = tx.send(WatchMsg::Line(event_line(ty, object)));
                    }
                }
                st.watchers.push((ns.clone(), tx));
            }
            None => {
                for ((ons, _), object) in &st.objects {
                    if matches_ns(ons) {
                        let _ = tx.send(WatchMsg::Line(event_line("ADDED", object)));
                    }
                }
                st.watchers.push((ns.clone(), tx));
            }
        }
    }
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    let stream = stream.get_mut();
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let deadline = tokio::time::sleep(Duration::from_secs(timeout));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(WatchMsg::Line(line)) => {
                    if write_chunk(stream, &line).await.is_err() {
                        return;
                    }
                }
                Some(WatchMsg::Close) | None => break,
            },
            _ = &mut deadline => break,
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let _ = stream.shutdown().await;
}
