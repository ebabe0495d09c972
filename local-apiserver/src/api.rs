//! From an HTTP request to a reply: the URL layout of the Kubernetes API
//! (`/api/v1/...`, `/apis/{group}/{version}/...`, namespaced and
//! cluster-wide paths, subresources), query parameters, counting, faults,
//! and the JSON the verbs answer with.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::counts::{RequestCounts, Verb};
use crate::discovery;
use crate::faults::{self, Fault, Injected, RequestInfo};
use crate::http::Request;
use crate::kinds::KindSpec;
use crate::patch::PatchType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{ListOpts, Store, parse_resource_version};
use crate::verbs::{DeleteOpts, PatchOpts};
use crate::watch::{WatchMsg, WatchSub, metadata_only};

/// A watch without `timeoutSeconds` lasts this long (a real apiserver picks
/// between 30 and 60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// The state all endpoints share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Mutex<Store>,
    pub counts: Mutex<RequestCounts>,
    pub faults: Mutex<Vec<Fault>>,
    /// Signalled whenever a watch opens.
    pub watch_opened: tokio::sync::Notify,
}

/// What one endpoint keeps for itself.
#[derive(Debug, Default)]
pub(crate) struct EndpointState {
    pub counts: Mutex<RequestCounts>,
    pub faults: Mutex<Vec<Fault>>,
}

/// What to send back.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A whole response.
    Json { code: u16, body: Vec<u8> },
    /// A watch stream.
    Watch {
        rx: mpsc::UnboundedReceiver<WatchMsg>,
        timeout: Duration,
    },
}

impl Reply {
    fn json(code: u16, value: &Value) -> Reply {
        Reply::Json {
            code,
            body: serde_json::to_vec(value).expect("JSON values serialize"),
        }
    }

    fn error(e: &ApiError) -> Reply {
        Reply::json(e.code, &e.to_status())
    }
}

/// The resource part of a request's path, before the registry is asked
/// what it names.
#[derive(Debug)]
struct Path {
    group: String,
    version: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

/// A path the registry serves: its kind, and whether it is `/status`.
struct Target {
    kind: KindSpec,
    namespace: Option<String>,
    status: bool,
}

/// What a request asks for: the verb, with the object's name for the verbs
/// on one object. Decided once, from the method, the path and `watch`.
#[derive(Debug)]
enum Op {
    Get(String),
    List,
    Watch,
    Create,
    Update(String),
    Patch(String),
    Delete(String),
    DeleteCollection,
}

impl Op {
    fn verb(&self) -> Verb {
        match self {
            Op::Get(_) => Verb::Get,
            Op::List => Verb::List,
            Op::Watch => Verb::Watch,
            Op::Create => Verb::Create,
            Op::Update(_) => Verb::Update,
            Op::Patch(_) => Verb::Patch,
            Op::Delete(_) => Verb::Delete,
            Op::DeleteCollection => Verb::DeleteCollection,
        }
    }
}

/// An admitted request: where it goes and what it does.
#[derive(Debug)]
pub(crate) struct Call {
    path: Path,
    op: Op,
}

/// How a request is answered: at once (a fault, discovery or an error), or
/// by [`handle`] after a delay (injected; zero for none).
pub(crate) enum Plan {
    Now(Reply),
    Later(Duration, Call),
}

/// First step: parse the request into a [`Call`], count it and consult the
/// faults.
pub(crate) fn admit(shared: &Shared, endpoint: &EndpointState, req: &Request) -> Plan {
    let segments: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
    if let ["healthz" | "readyz" | "livez"] = segments.as_slice() {
        return Plan::Now(Reply::Json {
            code: 200,
            body: b"ok".to_vec(),
        });
    }
    let parsed = {
        let store = shared.store.lock();
        if req.method == "GET"
            && let Some(doc) = discovery::document(&store.registry, &segments)
        {
            return Plan::Now(Reply::json(200, &doc));
        }
        parse_path(&segments).and_then(|path| {
            let target = resolve(&store, &path)?;
            let op = op(req, &path, &target)?;
            Ok((path, target, op))
        })
    };
    let (path, target, op) = match parsed {
        Ok(p) => p,
        Err(e) => return Plan::Now(Reply::error(&e)),
    };
    let verb = op.verb();
    let resource = if target.status {
        format!("{}/status", target.kind.plural)
    } else {
        target.kind.plural.clone()
    };
    shared
        .counts
        .lock()
        .record(verb, &target.kind.group, &resource);
    endpoint
        .counts
        .lock()
        .record(verb, &target.kind.group, &resource);
    let info = RequestInfo {
        verb,
        resource: &resource,
        namespace: target.namespace.as_deref(),
        name: path.name.as_deref(),
    };
    let mut injected = Injected::default();
    faults::check(&mut shared.faults.lock(), &info, &mut injected);
    faults::check(&mut endpoint.faults.lock(), &info, &mut injected);
    match injected {
        Injected { error: Some(e), .. } => Plan::Now(Reply::error(&e)),
        Injected { delay, .. } => Plan::Later(delay.unwrap_or_default(), Call { path, op }),
    }
}

/// Second step: carry the call out.
pub(crate) fn handle(shared: &Shared, call: &Call, req: &Request) -> Reply {
    let mut store = shared.store.lock();
    // The store was unlocked since `admit` (for an injected delay, or while
    // other requests ran): a CRD may have been created, changed or deleted
    // since, so the kind is looked up again, as it is served now.
    let result = resolve(&store, &call.path).and_then(|t| execute(&mut store, &t, &call.op, req));
    match result {
        Ok(reply) => {
            if let Reply::Watch { .. } = reply {
                shared.watch_opened.notify_waiters();
            }
            reply
        }
        Err(e) => Reply::error(&e),
    }
}

/// Splits the resource part of a path: `/api/v1/...` or
/// `/apis/{group}/{version}/...`, then `[namespaces/{ns}/]{plural}[/{name}[/{sub}]]`.
fn parse_path(segments: &[&str]) -> Result<Path, ApiError> {
    let (group, version, rest) = match segments {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::no_such_resource()),
    };
    let (namespace, plural, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] if *plural != "status" && *plural != "finalize" => {
            (Some(*ns), *plural, tail)
        }
        [plural, tail @ ..] => (None, *plural, tail),
        [] => return Err(ApiError::no_such_resource()),
    };
    if tail.len() > 2 {
        return Err(ApiError::no_such_resource());
    }
    Ok(Path {
        group: group.to_string(),
        version: version.to_string(),
        plural: plural.to_string(),
        namespace: namespace.map(str::to_string),
        name: tail.first().map(|s| s.to_string()),
        subresource: tail.get(1).map(|s| s.to_string()),
    })
}

/// What the registry serves at `path`: 404 for a kind it does not serve, a
/// scope the kind does not have, or a subresource other than a declared
/// `/status`.
fn resolve(store: &Store, path: &Path) -> Result<Target, ApiError> {
    let kind = store
        .registry
        .get(&path.group, &path.version, &path.plural)
        .cloned()
        .ok_or_else(ApiError::no_such_resource)?;
    if (kind.namespaced && path.namespace.is_none() && path.name.is_some())
        || (!kind.namespaced && path.namespace.is_some())
    {
        return Err(ApiError::no_such_resource());
    }
    let status = match path.subresource.as_deref() {
        None => false,
        Some("status") if kind.status_subresource => true,
        Some(_) => return Err(ApiError::no_such_resource()),
    };
    Ok(Target {
        kind,
        namespace: path.namespace.clone(),
        status,
    })
}

/// The operation a request asks for; 405 for a method the path does not
/// take.
fn op(req: &Request, path: &Path, t: &Target) -> Result<Op, ApiError> {
    let method = req.method.as_str();
    Ok(match (method, path.name.clone()) {
        ("GET", Some(name)) => Op::Get(name),
        ("GET", None) if is_true(req.query("watch")) => Op::Watch,
        ("GET", None) => Op::List,
        ("POST", None) if !t.kind.namespaced || t.namespace.is_some() => Op::Create,
        ("PUT", Some(name)) => Op::Update(name),
        ("PATCH", Some(name)) => Op::Patch(name),
        ("DELETE", Some(name)) if !t.status => Op::Delete(name),
        ("DELETE", None) => Op::DeleteCollection,
        _ => return Err(ApiError::method_not_allowed(method)),
    })
}

fn is_true(v: Option<&str>) -> bool {
    matches!(v, Some("true" | "1" | ""))
}

fn execute(store: &mut Store, t: &Target, op: &Op, req: &Request) -> Result<Reply, ApiError> {
    let kind = &t.kind;
    let ns = t.namespace.as_deref().unwrap_or("");
    let metadata = wants_metadata(req);
    let dry_run = req.query("dryRun").is_some_and(|v| v == "All");
    let one = |code: u16, o: &Arc<Value>| Reply::json(code, &present(kind, o, metadata));
    match op {
        Op::Get(name) => Ok(one(200, &store.get(kind, ns, name)?)),
        Op::Watch => watch(store, t, req, metadata),
        Op::List => {
            let opts = list_opts(kind, req)?;
            let page = store.list(kind, t.namespace.as_deref(), &opts)?;
            Ok(list_reply(kind, &page, metadata))
        }
        Op::Create => {
            let body = json_body(req)?;
            Ok(one(201, &store.create(kind, ns, body, dry_run)?))
        }
        Op::Update(name) => {
            let body = json_body(req)?;
            Ok(one(
                200,
                &store.update(kind, ns, name, body, t.status, dry_run)?,
            ))
        }
        Op::Patch(name) => {
            let ptype = PatchType::from_content_type(req.header("content-type").unwrap_or(""))?;
            let body: Value = serde_json::from_slice(&req.body).map_err(|e| {
                if ptype == PatchType::Apply {
                    ApiError::bad_request(format!(
                        "the local API server reads apply configurations as JSON only: {e}"
                    ))
                } else {
                    ApiError::bad_request(format!("error decoding patch: {e}"))
                }
            })?;
            let opts = PatchOpts {
                field_manager: req.query("fieldManager").map(str::to_string),
                dry_run,
            };
            let (code, o) = store.patch(kind, ns, name, ptype, &body, t.status, &opts)?;
            Ok(one(code, &o))
        }
        Op::Delete(name) => {
            let opts = delete_opts(req)?;
            Ok(one(200, &store.delete(kind, ns, name, &opts)?))
        }
        Op::DeleteCollection => {
            let opts = delete_opts(req)?;
            let list = list_opts(kind, req)?;
            let deleted = store.delete_collection(kind, t.namespace.as_deref(), &list, &opts)?;
            let page = crate::store::ListPage {
                items: deleted,
                rv: store.rv,
                continue_token: None,
                remaining: None,
            };
            Ok(list_reply(kind, &page, metadata))
        }
    }
}

fn watch(store: &mut Store, t: &Target, req: &Request, metadata: bool) -> Result<Reply, ApiError> {
    let kind = &t.kind;
    let (labels, fields) = selectors(kind, req)?;
    let bookmarks = is_true(req.query("allowWatchBookmarks"));
    let initial_events = req.query("sendInitialEvents") == Some("true");
    if initial_events {
        if !bookmarks {
            return Err(ApiError::new(
                422,
                "Invalid",
                "sendInitialEvents: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
        if req.query("resourceVersionMatch") != Some("NotOlderThan") {
            return Err(ApiError::new(
                422,
                "Invalid",
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
    }
    let from = parse_resource_version(req.query("resourceVersion"))?;
    let timeout =
        match req.query("timeoutSeconds") {
            Some(s) => Duration::from_secs(s.parse().map_err(|_| {
                ApiError::bad_request(format!("timeoutSeconds: Invalid value: {s:?}"))
            })?),
            None => DEFAULT_WATCH_TIMEOUT,
        };
    let (tx, rx) = mpsc::unbounded_channel();
    let sub = WatchSub::new(
        kind,
        t.namespace.clone(),
        labels,
        fields,
        bookmarks,
        metadata,
        tx,
    );
    store.watch(sub, from, initial_events);
    Ok(Reply::Watch { rx, timeout })
}

/// Whether the client asked for `PartialObjectMetadata`.
fn wants_metadata(req: &Request) -> bool {
    req.header("accept")
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

/// An object as the client asked for it: in the URL's version, or as
/// metadata only.
fn present(kind: &KindSpec, o: &Arc<Value>, metadata: bool) -> Value {
    if metadata {
        return metadata_only(o);
    }
    let mut v = (**o).clone();
    let api_version = kind.api_version();
    if v.get("apiVersion").and_then(Value::as_str) != Some(&api_version) {
        v["apiVersion"] = json!(api_version);
    }
    v
}

fn list_reply(kind: &KindSpec, page: &crate::store::ListPage, metadata: bool) -> Reply {
    let mut meta = json!({ "resourceVersion": page.rv.to_string() });
    if let Some(c) = &page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(n) = page.remaining {
        meta["remainingItemCount"] = json!(n);
    }
    let (api_version, list_kind) = if metadata {
        (
            "meta.k8s.io/v1".to_string(),
            "PartialObjectMetadataList".to_string(),
        )
    } else {
        (kind.api_version(), format!("{}List", kind.kind))
    };
    // Items are written one by one, not cloned into a list first: lists of
    // thousands of objects are the common case for a controller's start.
    let mut body = Vec::with_capacity(64 + page.items.len() * 256);
    body.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut body, &api_version).expect("strings serialize");
    body.extend_from_slice(b",\"kind\":");
    serde_json::to_writer(&mut body, &list_kind).expect("strings serialize");
    body.extend_from_slice(b",\"metadata\":");
    serde_json::to_writer(&mut body, &meta).expect("JSON values serialize");
    body.extend_from_slice(b",\"items\":[");
    let wanted = kind.api_version();
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        if metadata || item.get("apiVersion").and_then(Value::as_str) != Some(&wanted) {
            serde_json::to_writer(&mut body, &present(kind, item, metadata))
        } else {
            serde_json::to_writer(&mut body, &**item)
        }
        .expect("JSON values serialize");
    }
    body.extend_from_slice(b"]}");
    Reply::Json { code: 200, body }
}

fn list_opts(kind: &KindSpec, req: &Request) -> Result<ListOpts, ApiError> {
    let limit = match req.query("limit") {
        None | Some("") => None,
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("limit: Invalid value: {l:?}")))?,
        ),
    };
    let (labels, fields) = selectors(kind, req)?;
    Ok(ListOpts {
        labels,
        fields,
        limit,
        continue_token: req
            .query("continue")
            .filter(|c| !c.is_empty())
            .map(str::to_string),
        resource_version: req.query("resourceVersion").map(str::to_string),
        resource_version_match: req.query("resourceVersionMatch").map(str::to_string),
    })
}

/// The `labelSelector` and `fieldSelector` of a list, watch or
/// deletecollection (400 if either does not parse).
fn selectors(kind: &KindSpec, req: &Request) -> Result<(LabelSelector, FieldSelector), ApiError> {
    Ok((
        LabelSelector::parse(req.query("labelSelector").unwrap_or(""))?,
        FieldSelector::parse(
            req.query("fieldSelector").unwrap_or(""),
            &kind.selectable_fields,
        )?,
    ))
}

fn delete_opts(req: &Request) -> Result<DeleteOpts, ApiError> {
    let mut opts = DeleteOpts {
        dry_run: req.query("dryRun").is_some_and(|v| v == "All"),
        ..DeleteOpts::default()
    };
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(opts);
    }
    let body: Value = serde_json::from_slice(&req.body)
        .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
    let s = |p: &str| body.pointer(p).and_then(Value::as_str).map(str::to_string);
    opts.uid = s("/preconditions/uid");
    opts.resource_version = s("/preconditions/resourceVersion");
    if let Some(dry) = body.get("dryRun").and_then(Value::as_array) {
        opts.dry_run |= dry.iter().any(|v| v == "All");
    }
    Ok(opts)
}

fn json_body(req: &Request) -> Result<Value, ApiError> {
    serde_json::from_slice(&req.body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}
