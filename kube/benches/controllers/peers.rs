//! The controller processes: how each implementation is built and started,
//! what it prints, and what /proc and the API server's /metrics say about it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube_client::Client;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// One implementation under test.
#[derive(Clone)]
pub struct Peer {
    /// The name in the table.
    pub name: &'static str,
    /// The program and the arguments before `--kubeconfig`.
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// The wall clock in Unix nanoseconds: the controllers stamp their lines
/// with it, and the benchmark its writes.
pub fn unix_nanos() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as i128
}

/// The workspace's target folder (as `cargo` was told, else the one this
/// benchmark was built into).
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    // .../target/release/deps/controllers-HASH
    let exe = std::env::current_exe().expect("the benchmark's path");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")))
}

/// Builds the Rust controllers (`examples/bench_controller.rs`, release,
/// with rustls) and returns the binary.
pub fn build_rust() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    // Not the variables cargo set for this benchmark (build scripts rerun
    // on some of them, which would rebuild half the tree each time).
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if (key.starts_with("CARGO_") && key != "CARGO_HOME")
            || key == "OUT_DIR"
            || key.starts_with("RUST") && key != "RUSTUP_HOME" && key != "RUSTUP_TOOLCHAIN"
        {
            cmd.env_remove(&*key);
        }
    }
    let status = cmd
        .args([
            "build",
            "--release",
            "-p",
            "tokio-workqueue-kube",
            "--example",
            "bench_controller",
            "--features",
            "rustls",
        ])
        .env("CARGO_TARGET_DIR", target_dir())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "cargo build of the bench_controller example: {status}"
        ));
    }
    Ok(target_dir().join("release/examples/bench_controller"))
}

/// The Go toolchain: `$GO`, else `go` on `PATH`, else `/usr/local/go/bin/go`
/// (as kube-test-cluster finds it).
fn go() -> Option<PathBuf> {
    if let Some(go) = std::env::var_os("GO") {
        return Some(PathBuf::from(go));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("go");
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    let fallback = PathBuf::from("/usr/local/go/bin/go");
    fallback.is_file().then_some(fallback)
}

/// Builds the controller-runtime peer (`benches/go-controller`) and returns
/// the binary, or why it could not.
pub fn build_go() -> Result<PathBuf, String> {
    let go = go().ok_or(
        "no Go toolchain ($GO, `go` on PATH, /usr/local/go/bin/go): install Go 1.26 or newer, \
         or pass --no-go to run without the controller-runtime peer",
    )?;
    let out = target_dir().join("go-controller/go-controller");
    let output = std::process::Command::new(&go)
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .env("GOTOOLCHAIN", "local")
        .current_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/go-controller"
        ))
        .output()
        .map_err(|e| format!("running {}: {e}", go.display()))?;
    if !output.status.success() {
        return Err(format!(
            "go build of benches/go-controller failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(out)
}

/// A line a controller printed.
pub enum Line {
    /// `START ns/name resourceVersion unix_nanos`: a reconcile started.
    Start { name: String, rv: u64, at: i128 },
    /// `SYNCED unix_nanos`: its cache has the first list.
    Synced,
    /// `HELD n`: a replica's store holds `n` objects (C5).
    Held(usize),
}

fn parse(line: &str) -> Option<Line> {
    let mut it = line.split_whitespace();
    match it.next()? {
        "START" => {
            let key = it.next()?;
            let name = key.rsplit_once('/').map_or(key, |(_, n)| n).to_string();
            let rv = it.next()?.parse().ok()?;
            let at = it.next()?.parse().ok()?;
            Some(Line::Start { name, rv, at })
        }
        "SYNCED" => Some(Line::Synced),
        "HELD" => Some(Line::Held(it.next()?.parse().ok()?)),
        _ => None,
    }
}

/// A `perf record` of a controller (`--perf=DIR`): profiles for the
/// targets a run misses. Never during measured runs' figures that matter:
/// perf costs the profiled process CPU time.
pub struct Perf(std::process::Child);

impl Perf {
    /// Records `pid` (`None`: every CPU, without call graphs) into
    /// `dir/name.data`, with `event` (`None`: cycles).
    pub fn start(dir: &Path, name: &str, pid: Option<u32>, event: Option<&str>) -> Perf {
        std::fs::create_dir_all(dir).expect("the perf folder");
        let file = dir.join(format!("{}.data", name.replace([' ', '(', ')'], "_")));
        let mut cmd = std::process::Command::new("perf");
        cmd.arg("record").arg("-o").arg(&file);
        if let Some(event) = event {
            cmd.args(["-e", event]);
        }
        match pid {
            Some(pid) => cmd.arg("-g").arg("-p").arg(pid.to_string()),
            None => cmd.arg("-a"),
        };
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        Perf(cmd.spawn().expect("perf (is it installed?)"))
    }

    /// Stops the recording (SIGINT, as perf expects) and waits for it.
    pub fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// A running controller process.
pub struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    pub pid: u32,
    /// When it was started (Unix nanoseconds, just before the spawn).
    pub started: i128,
    pub lines: mpsc::UnboundedReceiver<Line>,
}

impl Running {
    /// Starts `peer` on the ConfigMaps of `namespace`.
    pub fn start(peer: &Peer, kubeconfig: &Path, namespace: &str) -> Running {
        let mut cmd = Command::new(&peer.program);
        cmd.args(&peer.args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--namespace")
            .arg(namespace)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let started = unix_nanos();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", peer.program.display()));
        let pid = child.id().expect("a running child");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Some(line) = parse(&line)
                    && tx.send(line).is_err()
                {
                    break;
                }
            }
        });
        Running {
            child,
            stdin,
            pid,
            started,
            lines,
        }
    }

    /// The next line, or `None` after `timeout` (or if the process ended).
    pub async fn next(&mut self, timeout: Duration) -> Option<Line> {
        tokio::time::timeout(timeout, self.lines.recv())
            .await
            .ok()
            .flatten()
    }

    /// Resident memory (VmRSS) in bytes.
    pub fn rss(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .expect("/proc/PID/status of a running controller");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .expect("VmRSS in /proc/PID/status")
            * 1024.0
    }

    /// CPU time (user and system) in seconds.
    pub fn cpu(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .expect("/proc/PID/stat of a running controller");
        let rest = &stat[stat.rfind(')').expect("comm in /proc/PID/stat") + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the command: state is field 3, utime 14, stime 15.
        let ticks: f64 =
            fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
        ticks / clock_ticks()
    }

    /// Kills it at once (SIGKILL): a crash, nothing released.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// Closes its standard input (it exits), waits up to 5 s, then kills it.
    pub async fn stop(mut self) {
        self.stdin.take();
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// ConfigMap requests by verb and watch events sent, from kube-apiserver's
/// own /metrics (`apiserver_request_total`, `apiserver_watch_events_total`).
#[derive(Default, Clone)]
pub struct ApiLoad {
    pub by_verb: HashMap<String, f64>,
    pub watch_events: f64,
}

impl ApiLoad {
    pub async fn read(client: &Client) -> ApiLoad {
        let text = client
            .request_text(
                http::Request::get("/metrics")
                    .body(Vec::new())
                    .expect("a GET /metrics request"),
            )
            .await
            .expect("kube-apiserver's /metrics");
        parse_metrics(&text).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn verb(&self, verb: &str) -> f64 {
        self.by_verb.get(verb).copied().unwrap_or(0.0)
    }

    /// What was counted since `before`.
    pub fn since(&self, before: &ApiLoad) -> ApiLoad {
        ApiLoad {
            by_verb: self
                .by_verb
                .iter()
                .map(|(k, v)| (k.clone(), v - before.verb(k)))
                .collect(),
            watch_events: self.watch_events - before.watch_events,
        }
    }
}

fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let start = labels
        .match_indices(&key)
        .find(|(i, _)| *i == 0 || labels.as_bytes()[i - 1] == b',')?
        .0
        + key.len();
    let end = labels[start..].find('"')? + start;
    Some(&labels[start..end])
}

/// The ConfigMap series of a /metrics text. An error when there is no
/// ConfigMap request series at all (the seeding's creates make some), so a
/// renamed metric or label cannot pass for zero requests.
fn parse_metrics(metrics: &str) -> Result<ApiLoad, String> {
    let mut load = ApiLoad::default();
    let mut series = 0;
    for line in metrics.lines() {
        let (name, rest) = match line.split_once('{') {
            Some(x) => x,
            None => continue,
        };
        if name != "apiserver_request_total" && name != "apiserver_watch_events_total" {
            continue;
        }
        let Some((labels, value)) = rest.rsplit_once('}') else {
            return Err(format!("unreadable /metrics line {line:?}"));
        };
        let is_configmaps = label(labels, "resource") == Some("configmaps")
            || label(labels, "kind") == Some("ConfigMap");
        if !is_configmaps {
            continue;
        }
        let value: f64 = value
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .parse()
            .map_err(|e| format!("the value of /metrics line {line:?}: {e}"))?;
        if name == "apiserver_request_total" {
            series += 1;
            let verb = label(labels, "verb").unwrap_or("?").to_string();
            *load.by_verb.entry(verb).or_default() += value;
        } else {
            load.watch_events += value;
        }
    }
    if series == 0 {
        return Err(
            "kube-apiserver's /metrics has no apiserver_request_total series for configmaps".into(),
        );
    }
    Ok(load)
}
