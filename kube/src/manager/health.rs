//! What `/healthz` and `/readyz` read: which controllers died, which caches
//! have not synced, whether the lease is renewed on time.

use std::sync::Arc;

use parking_lot::Mutex;

/// A readiness condition: `None` when met, otherwise what is missing.
pub(crate) type Check = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// The manager's health, shared with its endpoint.
#[derive(Default)]
pub(crate) struct Health {
    /// Controllers whose task ended before the manager stopped them.
    dead: Mutex<Vec<String>>,
    /// Conditions `/readyz` needs, checked on each request.
    ready: Mutex<Vec<Check>>,
}

impl Health {
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Marks `name` dead for good: `/healthz` fails from now on.
    pub(crate) fn died(&self, name: &str) {
        self.dead.lock().push(name.to_owned());
    }

    /// The controllers that died, by name.
    pub(crate) fn dead(&self) -> Vec<String> {
        self.dead.lock().clone()
    }

    /// Adds a condition to `/readyz`.
    pub(crate) fn require(&self, check: Check) {
        self.ready.lock().push(check);
    }

    /// What `/readyz` misses, empty when ready.
    pub(crate) fn not_ready(&self) -> Vec<String> {
        self.ready
            .lock()
            .iter()
            .filter_map(|check| check())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_fails_for_good_once_a_controller_died() {
        let health = Health::new();
        assert!(health.dead().is_empty());
        health.died("configmaps");
        assert_eq!(health.dead(), ["configmaps"]);
    }

    #[test]
    fn readiness_lists_every_unmet_condition() {
        let health = Health::new();
        assert!(health.not_ready().is_empty());
        health.require(Box::new(|| Some("cache a".into())));
        health.require(Box::new(|| None));
        health.require(Box::new(|| Some("lease".into())));
        assert_eq!(health.not_ready(), ["cache a", "lease"]);
    }
}
