//! Building the Go program (`test-cluster/go`) once, into a cache under the
//! target directory keyed by the Kubernetes version and a digest of what
//! goes into the build.
//!
//! The first build downloads about 0.7 GB of Go modules and compiles
//! kube-apiserver, which takes minutes on two cores; after that the cached
//! binary is reused until the Go sources, `go.sum` or the Go toolchain
//! change. A file lock makes test binaries that start at the same time build
//! it once: the others wait and then use the result.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use sha2::{Digest, Sha256};

/// The Kubernetes release the Go module builds (its `k8s.io/kubernetes`
/// requirement); a unit test checks that `go.mod` agrees.
pub(crate) const KUBERNETES_VERSION: &str = "v1.37.2";

/// The environment variable that names the `go` command to use.
const GO_ENV: &str = "GO";

/// Where Go is installed when it is not on `PATH` (the official tarball's
/// place, which is where this project's machines have it).
const GO_FALLBACK: &str = "/usr/local/go/bin/go";

/// The Go module's directory.
pub(crate) fn go_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("go")
}

/// Returns the cached test-cluster binary, building it first if needed.
pub(crate) fn binary() -> Result<PathBuf, String> {
    let go = find_go()?;
    let go_version = run_go(&go, &["version"])?;
    let key = cache_key(&go_version, &go_dir())?;
    let cache = cache_root().join(format!("{KUBERNETES_VERSION}-{key}"));
    let binary = cache.join("test-cluster");
    if binary.is_file() {
        mark_used(&cache);
        return Ok(binary);
    }

    fs::create_dir_all(&cache).map_err(|e| format!("create {}: {e}", cache.display()))?;
    let lock_path = cache.join("build.lock");
    let lock = File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("lock {}: {e}", lock_path.display()))?;
    // Another test binary may have built it while this one waited.
    if binary.is_file() {
        return Ok(binary);
    }
    build(&go, go_version.trim(), &binary)?;
    mark_used(&cache);
    remove_stale_builds(&cache);
    Ok(binary)
}

/// A build not used for this long is removed when another is made.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Notes that the build in `cache` was used now (its `last-used` file).
fn mark_used(cache: &Path) {
    let _ = fs::write(cache.join("last-used"), b"");
}

/// Removes the builds of other keys (earlier sources or toolchains) beside
/// `current` that were not used for a day: each is a 170 MB binary nobody
/// will run again. Builds used more recently stay: a target directory
/// shared by several checkouts (branches with different Go sources) would
/// otherwise rebuild each time another checkout ran. A test binary still
/// running one keeps it open, which Linux allows.
fn remove_stale_builds(current: &Path) {
    let Some(root) = current.parent() else { return };
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_build = entry.file_name().to_string_lossy().starts_with('v');
        let recent = fs::metadata(path.join("last-used"))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < STALE_AFTER);
        if is_build && path != current && path.is_dir() && !recent {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// `$GO`, else `go` on `PATH`, else Go's default install place. Missing Go
/// is an error, never a reason to skip: a test run that was asked for the
/// real cluster and quietly did not run it would prove nothing.
fn find_go() -> Result<PathBuf, String> {
    find_go_in(
        std::env::var_os(GO_ENV),
        std::env::var_os("PATH"),
        Path::new(GO_FALLBACK),
    )
}

/// [`find_go`] with the environment as arguments, so a test can ask what
/// happens on a machine without Go.
fn find_go_in(
    go_env: Option<OsString>,
    path: Option<OsString>,
    fallback: &Path,
) -> Result<PathBuf, String> {
    if let Some(go) = go_env {
        let go = PathBuf::from(go);
        if go.is_file() {
            return Ok(go);
        }
        return Err(format!(
            "${GO_ENV} is {}, which is not a file; {}",
            go.display(),
            no_go_help()
        ));
    }
    if let Some(path) = path {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("go");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    if fallback.is_file() {
        return Ok(fallback.into());
    }
    Err(format!(
        "found no Go: not in ${GO_ENV}, not on PATH, not at {}; {}",
        fallback.display(),
        no_go_help()
    ))
}

fn no_go_help() -> String {
    format!(
        "kube-test-cluster's real backend needs Go 1.26 or newer to build kube-apiserver \
         {KUBERNETES_VERSION} and etcd from its Go module in {}. Install Go \
         (https://go.dev/dl/), put it on PATH or point ${GO_ENV} at it, or select only the \
         local API server with {}=local.",
        go_dir().display(),
        crate::ENV
    )
}

/// The environment every `go` command runs with: the local toolchain only
/// (never a download of another), and the committed go.mod and go.sum as
/// they are.
fn go_command(go: &Path) -> Command {
    let mut cmd = Command::new(go);
    cmd.current_dir(go_dir())
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly -buildvcs=false");
    cmd
}

fn run_go(go: &Path, args: &[&str]) -> Result<String, String> {
    let out = go_command(go)
        .args(args)
        .output()
        .map_err(|e| format!("run `{} {}`: {e}", go.display(), args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`{} {}` failed ({}): {}",
            go.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A digest of the Go toolchain's version and every file of the module that
/// goes into the build (go.mod, go.sum, the .go files), so any change to
/// them builds anew.
fn cache_key(go_version: &str, dir: &Path) -> Result<String, String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map_err(|e| format!("read {}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name == "go.mod" || name == "go.sum" || name.ends_with(".go"))
        .collect();
    names.sort();
    let mut digest = Sha256::new();
    digest.update(go_version.as_bytes());
    for name in &names {
        let contents =
            fs::read(dir.join(name)).map_err(|e| format!("read {}/{name}: {e}", dir.display()))?;
        digest.update((name.len() as u64).to_le_bytes());
        digest.update(name.as_bytes());
        digest.update((contents.len() as u64).to_le_bytes());
        digest.update(&contents);
    }
    let hex: String = digest.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(hex)
}

/// `<target dir>/test-cluster`: found from the running test binary, which
/// cargo puts under `<target dir>/<profile>/deps`, where cargo also leaves a
/// `CACHEDIR.TAG`; the workspace's `target/` if that fails.
pub(crate) fn cache_root() -> PathBuf {
    let from_exe = std::env::current_exe().ok().and_then(|exe| {
        exe.ancestors()
            .find(|dir| dir.join("CACHEDIR.TAG").is_file())
            .map(Path::to_path_buf)
    });
    from_exe
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("test-cluster")
}

/// Runs `go build` (niced: the machines are small and shared) into a
/// temporary name and renames it into place, so a build that is
/// interrupted never leaves a binary that looks complete.
fn build(go: &Path, go_version: &str, binary: &Path) -> Result<(), String> {
    // Straight to the terminal: the test harness captures print macros, and
    // a build of minutes with no word would look like a hang.
    let _ = writeln!(
        std::io::stderr(),
        "kube-test-cluster: building kube-apiserver {KUBERNETES_VERSION} and etcd with {go_version} \
         into {} (the first build downloads ~0.7 GB of Go modules and takes minutes; it is cached)",
        binary.display()
    );
    let started = Instant::now();
    let partial = binary.with_extension("partial");
    let ldflags = format!("-X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}");
    let go_args = [
        "build",
        "-ldflags",
        &ldflags,
        "-o",
        partial.to_str().ok_or("the target path is not UTF-8")?,
        ".",
    ];
    // `nice` when there is one; plain `go` otherwise.
    let mut cmd = if Path::new("/usr/bin/nice").is_file() {
        let mut cmd = go_command(Path::new("/usr/bin/nice"));
        cmd.args(["-n", "10"]).arg(go);
        cmd
    } else {
        go_command(go)
    };
    let out = cmd
        .args(go_args)
        .output()
        .map_err(|e| format!("run go build: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the test cluster failed ({}): `{} {}` in {}:\n{}{}",
            out.status,
            go.display(),
            go_args.join(" "),
            go_dir().display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    fs::rename(&partial, binary).map_err(|e| format!("rename {}: {e}", partial.display()))?;
    let _ = writeln!(
        std::io::stderr(),
        "kube-test-cluster: built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_mod_builds_the_version_the_harness_names() {
        let go_mod = fs::read_to_string(go_dir().join("go.mod")).unwrap();
        let required = format!("k8s.io/kubernetes {KUBERNETES_VERSION}");
        assert!(go_mod.contains(&required), "go.mod lacks `{required}`");
        // Every staging module at the matching v0 release.
        let staging = KUBERNETES_VERSION.replacen("v1.", "v0.", 1);
        let replaces: Vec<&str> = go_mod.lines().filter(|l| l.contains("=>")).collect();
        assert_eq!(replaces.len(), 33, "{replaces:#?}");
        for line in replaces {
            assert!(line.trim_end().ends_with(&staging), "{line}");
        }
    }

    #[test]
    fn without_go_the_error_says_what_is_missing_and_what_to_do() {
        let empty =
            std::env::temp_dir().join(format!("kube-test-cluster-nogo-{}", std::process::id()));
        fs::create_dir_all(&empty).unwrap();
        let missing = empty.join("go-is-not-here");
        let err = find_go_in(None, Some(empty.clone().into_os_string()), &missing).unwrap_err();
        assert!(
            err.starts_with("found no Go: not in $GO, not on PATH"),
            "{err}"
        );
        assert!(err.contains("Go 1.26 or newer"), "{err}");
        assert!(err.contains(&go_dir().display().to_string()), "{err}");
        assert!(err.contains("TEST_CLUSTER=local"), "{err}");

        let err = find_go_in(Some(missing.clone().into_os_string()), None, &missing).unwrap_err();
        assert!(
            err.contains("$GO is ") && err.contains("which is not a file"),
            "{err}"
        );

        // Found on PATH before the fallback is looked at.
        fs::write(empty.join("go"), "").unwrap();
        let found = find_go_in(None, Some(empty.clone().into_os_string()), &missing).unwrap();
        assert_eq!(found, empty.join("go"));
        fs::remove_dir_all(&empty).unwrap();
    }

    #[test]
    fn the_cache_key_follows_every_input() {
        let dir =
            std::env::temp_dir().join(format!("kube-test-cluster-key-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("go.mod"), "module m\n").unwrap();
        fs::write(dir.join("main.go"), "package main\n").unwrap();
        fs::write(dir.join("README"), "not an input\n").unwrap();
        let first = cache_key("go1.26.8", &dir).unwrap();
        assert_eq!(first.len(), 16);
        assert_eq!(cache_key("go1.26.8", &dir).unwrap(), first);
        assert_ne!(cache_key("go1.26.9", &dir).unwrap(), first);
        fs::write(dir.join("README"), "still not an input\n").unwrap();
        assert_eq!(cache_key("go1.26.8", &dir).unwrap(), first);
        fs::write(dir.join("main.go"), "package main // changed\n").unwrap();
        let changed = cache_key("go1.26.8", &dir).unwrap();
        assert_ne!(changed, first);
        fs::write(dir.join("go.sum"), "").unwrap();
        assert_ne!(cache_key("go1.26.8", &dir).unwrap(), changed);
        fs::remove_dir_all(&dir).unwrap();
    }
}
