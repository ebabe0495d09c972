//! Which API servers the tests run against: the `TEST_CLUSTER` variable.

use std::fmt;

/// The environment variable that selects the backends: `local`, `real` or
/// `all` (the default when unset or empty).
pub const ENV: &str = "TEST_CLUSTER";

/// An API server the tests can run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// `kube-local-apiserver`'s in-process API server: fast, and the only
    /// one with request counts and fault injection.
    Local,
    /// A real kube-apiserver with an embedded etcd, built from this crate's
    /// Go module (`go/`) on first use and run as one child process.
    Real,
}

impl Backend {
    /// Both backends, local first.
    pub const ALL: [Backend; 2] = [Backend::Local, Backend::Real];

    /// The name `TEST_CLUSTER` uses for this backend.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::Real => "real",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Local => "the local API server",
            Backend::Real => "the real kube-apiserver",
        })
    }
}

/// The backends `TEST_CLUSTER` selects, local first.
///
/// # Panics
///
/// On a value other than `local`, `real`, `all` or empty: a typo must not
/// quietly run fewer tests.
pub fn backends() -> Vec<Backend> {
    let value = std::env::var(ENV).ok();
    parse(value.as_deref()).unwrap_or_else(|e| panic!("{e}"))
}

fn parse(value: Option<&str>) -> Result<Vec<Backend>, String> {
    match value.map(str::trim) {
        None | Some("" | "all") => Ok(Backend::ALL.to_vec()),
        Some("local") => Ok(vec![Backend::Local]),
        Some("real") => Ok(vec![Backend::Real]),
        Some(other) => Err(format!(
            "{ENV}={other:?}: expected `local`, `real` or `all` (the default)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_all_selects_both_local_first() {
        for value in [None, Some(""), Some("all"), Some(" all ")] {
            assert_eq!(parse(value).unwrap(), [Backend::Local, Backend::Real]);
        }
    }

    #[test]
    fn one_backend_by_name() {
        assert_eq!(parse(Some("local")).unwrap(), [Backend::Local]);
        assert_eq!(parse(Some("real")).unwrap(), [Backend::Real]);
    }

    #[test]
    fn anything_else_is_an_error_naming_the_choices() {
        let err = parse(Some("reel")).unwrap_err();
        assert!(err.contains("TEST_CLUSTER=\"reel\""), "{err}");
        assert!(err.contains("`local`, `real` or `all`"), "{err}");
    }
}
