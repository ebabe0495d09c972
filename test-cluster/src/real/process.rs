//! Running the test-cluster binary as a child process that cannot outlive
//! the test binary.
//!
//! Three things stop it, whichever comes first:
//! * at normal exit, an `atexit` handler closes its standard input and waits
//!   for it (statics are never dropped, so `Drop` cannot do this);
//! * if the test binary dies any other way (a panic that aborts, SIGKILL),
//!   the kernel closes the pipe to the child's standard input, and the child
//!   stops on end of file;
//! * the child is started with `PR_SET_PDEATHSIG` = SIGTERM from a thread
//!   that lives as long as the process, so the kernel also signals it when
//!   the test binary goes.
//!
//! On any of these the child removes its temporary directory and exits; it
//! runs etcd and kube-apiserver inside itself, so no other process is left.
//! The clusters fault tests start of their own ([`crate::faults`]) are
//! children the same way, and also stopped at exit.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long the cluster may take from start to ready (it takes seconds).
const READY_LIMIT: Duration = Duration::from_secs(120);

/// How long the child may take to stop after its standard input closes.
const STOP_LIMIT: Duration = Duration::from_secs(10);

/// Logs older than this are removed when a cluster starts.
const LOG_KEEP: Duration = Duration::from_secs(24 * 3600);

/// A started cluster: what its ready line said.
#[derive(Debug)]
pub(crate) struct Started {
    /// Which child this is, for [`stop_one`], [`kill`] and [`command`].
    pub id: u64,
    /// The kubeconfig it wrote (server, CA, admin token).
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    /// What `/version` reports.
    pub version: String,
    /// The child's process id.
    pub pid: u32,
    /// The child's temporary directory.
    pub dir: PathBuf,
    /// From the child's start to /readyz answering, as the child measured.
    pub ready_in: Duration,
    /// The child's log (its standard error).
    pub log: PathBuf,
}

/// A running child, for the exit handler and the fault calls.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The lines the child prints after its ready line: answers to
    /// commands.
    answers: mpsc::Receiver<String>,
}

/// Every running child of this process, by id: the shared cluster and the
/// clusters fault tests start of their own.
static RUNNING: Mutex<BTreeMap<u64, Running>> = Mutex::new(BTreeMap::new());

fn running() -> std::sync::MutexGuard<'static, BTreeMap<u64, Running>> {
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts `binary` with `args` and waits for its ready line. Its standard
/// error goes to `log` (appended to, so a restarted cluster's runs share
/// one log).
pub(crate) fn start(binary: &Path, args: &[String], log: &Path) -> Result<Started, String> {
    static NEXT_ID: AtomicU64 = AtomicU64::new(0);
    let log_file = File::options()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("open {}: {e}", log.display()))?;

    let mut child = spawn_on_keeper_thread(binary, args, log_file)?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    let (answers_tx, answers) = mpsc::channel();
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    // Registered before waiting, so even a cluster that never gets ready is
    // stopped at exit.
    running().insert(
        id,
        Running {
            child,
            stdin,
            answers,
        },
    );
    register_exit_handler();

    std::thread::Builder::new()
        .name("test-cluster-stdout".into())
        .spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next();
            let _ = tx.send(first);
            // Keep reading so the child never blocks on a full pipe; later
            // lines answer commands.
            for line in lines.map_while(Result::ok) {
                let _ = answers_tx.send(line);
            }
        })
        .map_err(|e| format!("spawn a thread: {e}"))?;

    let line = match rx.recv_timeout(READY_LIMIT) {
        Ok(Some(Ok(line))) => line,
        Ok(_) => {
            let status = wait_stopped(id, Duration::from_secs(5));
            return Err(format!(
                "the test cluster exited before it was ready ({status}); its log, {}:\n{}",
                log.display(),
                tail(log)
            ));
        }
        Err(_) => {
            stop_one(id);
            return Err(format!(
                "the test cluster was not ready after {READY_LIMIT:?}; its log, {}:\n{}",
                log.display(),
                tail(log)
            ));
        }
    };
    parse_ready(&line, log.to_path_buf()).map(|started| Started { id, ..started })
}

/// A log file for a cluster of this process under `log_dir` (old logs
/// there are removed): `<executable>-<pid>[-<suffix>].log`.
pub(crate) fn log_path(log_dir: &Path, suffix: &str) -> Result<PathBuf, String> {
    fs::create_dir_all(log_dir).map_err(|e| format!("create {}: {e}", log_dir.display()))?;
    remove_old_logs(log_dir);
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "tests".into());
    Ok(log_dir.join(format!("{exe}-{}{suffix}.log", std::process::id())))
}

/// Sends `line` to child `id` and waits (for at most `limit`) for its
/// one-line answer.
pub(crate) fn command(id: u64, line: &str, limit: Duration) -> Result<String, String> {
    let mut all = running();
    let run = all
        .get_mut(&id)
        .ok_or_else(|| "the test cluster is not running".to_string())?;
    // Answers to commands that timed out earlier are stale.
    while run.answers.try_recv().is_ok() {}
    let stdin = run
        .stdin
        .as_mut()
        .ok_or_else(|| "the test cluster's standard input is closed".to_string())?;
    stdin
        .write_all(format!("{line}\n").as_bytes())
        .and_then(|()| stdin.flush())
        .map_err(|e| format!("write to the test cluster: {e}"))?;
    run.answers
        .recv_timeout(limit)
        .map_err(|_| format!("the test cluster did not answer `{line}` within {limit:?}"))
}

/// Kills child `id` at once (SIGKILL: a crash, nothing cleaned up) and
/// waits for it to be gone.
pub(crate) fn kill(id: u64) -> Result<(), String> {
    let Some(mut run) = running().remove(&id) else {
        return Err("the test cluster is not running".into());
    };
    run.child
        .kill()
        .map_err(|e| format!("kill the test cluster: {e}"))?;
    run.child
        .wait()
        .map_err(|e| format!("wait for the killed test cluster: {e}"))?;
    Ok(())
}

fn parse_ready(line: &str, log: PathBuf) -> Result<Started, String> {
    let ready: Value = serde_json::from_str(line)
        .map_err(|e| format!("the test cluster's ready line {line:?}: {e}"))?;
    let text = |field: &str| {
        ready[field]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("the test cluster's ready line lacks {field}: {line}"))
    };
    if ready["ready"] != Value::Bool(true) {
        return Err(format!(
            "the test cluster's ready line is not ready: {line}"
        ));
    }
    Ok(Started {
        id: 0,
        kubeconfig: text("kubeconfig")?.into(),
        server: text("server")?,
        version: text("version")?,
        pid: ready["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| format!("the test cluster's ready line lacks pid: {line}"))?,
        dir: text("dir")?.into(),
        ready_in: Duration::from_millis(ready["total_ms"].as_u64().unwrap_or(0)),
        log,
    })
}

/// Spawns the child from a thread that never ends: `PR_SET_PDEATHSIG`
/// fires when the thread that forked the child ends, not the process, so
/// forking from a test's thread would stop the cluster with that test.
fn spawn_on_keeper_thread(binary: &Path, args: &[String], log: File) -> Result<Child, String> {
    let mut cmd = Command::new(binary);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // One keeper thread for every child of the process (a restarted
    // cluster's too): it takes commands to spawn and never ends.
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static KEEPER: Mutex<Option<mpsc::Sender<Request>>> = Mutex::new(None);
    let mut keeper = KEEPER.lock().unwrap_or_else(|e| e.into_inner());
    if keeper.is_none() {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("test-cluster-keeper".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The sender lives in a static: never reached.
                loop {
                    std::thread::park();
                }
            })
            .map_err(|e| format!("spawn a thread: {e}"))?;
        *keeper = Some(tx);
    }
    let (reply, spawned) = mpsc::channel();
    keeper
        .as_ref()
        .expect("started above")
        .send((cmd, reply))
        .map_err(|_| "the keeper thread died".to_string())?;
    drop(keeper);
    spawned
        .recv()
        .map_err(|_| "the keeper thread died".to_string())?
        .map_err(|e| format!("start {}: {e}", binary.display()))
}

fn register_exit_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        extern "C" fn at_exit() {
            stop_all();
        }
        // SAFETY: registering a plain function; it runs on the exiting
        // thread after main returns.
        unsafe {
            libc::atexit(at_exit);
        }
    });
}

/// Stops every child (see [`stop_one`]), all at once.
pub(crate) fn stop_all() {
    let ids: Vec<u64> = running().keys().copied().collect();
    for id in &ids {
        if let Some(run) = running().get_mut(id) {
            drop(run.stdin.take());
        }
    }
    for id in ids {
        stop_one(id);
    }
}

/// Closes child `id`'s standard input and waits for it to stop; kills it
/// if it takes longer than `STOP_LIMIT`.
pub(crate) fn stop_one(id: u64) {
    wait_stopped(id, STOP_LIMIT);
}

fn wait_stopped(id: u64, limit: Duration) -> String {
    let Some(mut run) = running().remove(&id) else {
        return "not running".into();
    };
    drop(run.stdin.take());
    let deadline = Instant::now() + limit;
    loop {
        match run.child.try_wait() {
            Ok(Some(status)) => return status.to_string(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = run.child.kill();
                return match run.child.wait() {
                    Ok(status) => format!("killed after {limit:?}: {status}"),
                    Err(e) => format!("killed after {limit:?}: {e}"),
                };
            }
        }
    }
}

/// One log per test binary run adds up: keep a day's.
fn remove_old_logs(log_dir: &Path) {
    let Ok(entries) = fs::read_dir(log_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > LOG_KEEP);
        if old {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// The last lines of a log, for error messages.
fn tail(path: &Path) -> String {
    const TAIL: u64 = 6000;
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(TAIL)));
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_gives_the_kubeconfig_and_timings() {
        let line = r#"{"ready":true,"kubeconfig":"/tmp/x/kubeconfig","server":"https://127.0.0.1:4000","token":"t","ca_file":"/tmp/x/ca.crt","etcd":"http://127.0.0.1:4001","dir":"/tmp/x","version":"v1.37.2","pid":7,"etcd_ms":300,"apiserver_ms":2100,"total_ms":2500}"#;
        let started = parse_ready(line, "log".into()).unwrap();
        assert_eq!(started.kubeconfig, Path::new("/tmp/x/kubeconfig"));
        assert_eq!(started.server, "https://127.0.0.1:4000");
        assert_eq!(started.version, "v1.37.2");
        assert_eq!(started.pid, 7);
        assert_eq!(started.dir, Path::new("/tmp/x"));
        assert_eq!(started.ready_in, Duration::from_millis(2500));
    }

    #[test]
    fn a_bad_ready_line_is_an_error_that_quotes_it() {
        let err = parse_ready("panic: something", "log".into()).unwrap_err();
        assert!(err.contains("panic: something"), "{err}");
        let err = parse_ready(r#"{"ready":true}"#, "log".into()).unwrap_err();
        assert!(err.contains("lacks kubeconfig"), "{err}");
    }
}
