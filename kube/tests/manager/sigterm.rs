//! A real SIGTERM to a process running a `Manager` with the default
//! shutdown (no `shutdown_on`): every controller drains its in-flight
//! reconciles, the Lease is released, and `run` returns `Ok`, so the process
//! exits 0, as a Pod's containers are stopped.
//!
//! The process is this test binary again, started with the local API
//! server's address in `MANAGER_SIGTERM_CHILD`, which runs only the `child`
//! test (a no-op otherwise). Both sides read the API server only: each
//! reconcile writes a ConfigMap when it starts and another when it ends,
//! and the parent checks those and the Lease, never what the manager says.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::PostParams;
use kube_client::{Api, Client};
use kube_local_apiserver::LocalApiServer;
use kube_runtime::watcher;
use tokio_workqueue_kube::leader::{LeaderElection, LeaseConfig};
use tokio_workqueue_kube::{Action, Manager};

const CHILD: &str = "MANAGER_SIGTERM_CHILD";
const LIMIT: Duration = Duration::from_secs(30);
/// Long enough that every reconcile is still running when the signal
/// comes (the parent checks that it was).
const WORK: Duration = Duration::from_secs(2);
const JOBS: usize = 2;
const CONTROLLERS: [&str; 2] = ["first", "second"];

#[derive(Debug)]
struct TestError;

impl std::fmt::Display for TestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("test error")
    }
}

impl std::error::Error for TestError {}

struct Ctx {
    client: Client,
    controller: &'static str,
}

async fn mark(client: &Client, name: String) {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name);
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .expect("write a marker");
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, TestError> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    mark(&ctx.client, format!("{}-started-{name}", ctx.controller)).await;
    tokio::time::sleep(WORK).await;
    mark(&ctx.client, format!("{}-finished-{name}", ctx.controller)).await;
    Ok(Action::await_change())
}

fn policy(_: Arc<ConfigMap>, _: &TestError, _: Arc<Ctx>) -> Action {
    Action::await_change()
}

/// The manager's process: two controllers on the labelled ConfigMaps, one
/// election, shut down by signals only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let Ok(url) = std::env::var(CHILD) else {
        return;
    };
    let config = kube_client::Config::new(url.parse().expect("the server's URL"));
    let client = Client::try_from(config).expect("a client");
    let mut manager = Manager::new(client.clone());
    manager
        .leader_election(LeaderElection::new(
            client.clone(),
            LeaseConfig::new("sigterm", "default", "child"),
        ))
        .expect("an election");
    for controller in CONTROLLERS {
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            controller,
        });
        let results = manager
            .controller(
                Api::<ConfigMap>::namespaced(client.clone(), "default"),
                watcher::Config::default().labels("work=yes"),
            )
            .run(reconcile, policy, ctx);
        manager.add(controller, results).expect("distinct names");
    }
    manager.run().await.expect("a clean shutdown");
}

/// The name the harness lists `child` under in this binary.
fn child_test() -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::child"),
        None => "child".to_owned(),
    }
}

fn markers(server: &LocalApiServer, what: &str) -> usize {
    server
        .object_names("v1", "ConfigMap")
        .iter()
        .filter(|name| name.contains(what))
        .count()
}

/// Polls `done` on real time (a child process does not follow tokio's
/// clock) until it holds or `LIMIT` passes.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + LIMIT;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_every_controller_releases_the_lease_and_exits_0() {
    let server = LocalApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for i in 0..JOBS {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("job-{i}"));
        cm.metadata.labels = Some([("work".to_owned(), "yes".to_owned())].into());
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &child_test(), "--nocapture", "--test-threads=1"])
        .env(CHILD, server.url())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the manager's process");
    // Killed on the way out if the test fails before it ends.
    struct Reap(Option<std::process::Child>);
    impl Drop for Reap {
        fn drop(&mut self) {
            if let Some(mut child) = self.0.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let pid = child.id();
    let mut child = Reap(Some(child));

    let all = JOBS * CONTROLLERS.len();
    until("every reconcile to start", || {
        markers(&server, "-started-") == all
    })
    .await;
    assert_eq!(
        markers(&server, "-finished-"),
        0,
        "a reconcile ended before the signal: the test proves nothing"
    );
    let signalled = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(signalled.success());

    let deadline = std::time::Instant::now() + LIMIT;
    let status = loop {
        let process = child.0.as_mut().expect("not reaped yet");
        if let Some(status) = process.try_wait().unwrap() {
            child.0 = None;
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the manager's process did not exit within {LIMIT:?} of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        status.success(),
        "the manager's process exited with {status}"
    );
    assert_eq!(
        markers(&server, "-finished-"),
        all,
        "in-flight reconciles were cut short"
    );
    let lease = Api::<Lease>::namespaced(server.client(), "default")
        .get("sigterm")
        .await
        .expect("the Lease");
    let holder = lease.spec.and_then(|spec| spec.holder_identity);
    assert_eq!(holder, None, "the Lease was not released");
}
