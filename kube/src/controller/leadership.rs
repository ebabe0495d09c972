//! The controller's side of leader election: start the elector, know
//! whether to hand keys out, fence reconciles in flight, release on the
//! way out.

use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::time::Instant;

use super::at_end::AtEnd;
use super::watched::Watched;
use crate::leader::{LeaderElection, LeaderElector, LeaderState};

/// The runner's leader election.
pub(crate) struct Leadership {
    /// Until the first poll (starting needs a runtime).
    election: Option<LeaderElection>,
    elector: Option<LeaderElector>,
    /// Wakes the runner when the state changes.
    state: Option<Watched<LeaderState>>,
    grace: Duration,
    release: AtEnd,
}

impl Leadership {
    /// `election`'s config must have been validated.
    pub(crate) fn new(election: LeaderElection) -> Self {
        let grace = election.config().fencing_grace();
        Leadership {
            election: Some(election),
            elector: None,
            state: None,
            grace,
            release: AtEnd::default(),
        }
    }

    /// Starts the elector on the first call, and has `cx` woken when the
    /// leadership changes.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) {
        if let Some(election) = self.election.take() {
            match election.start() {
                Ok(elector) => {
                    self.state = Some(Watched::new(elector.state()));
                    self.elector = Some(elector);
                }
                // Validated when the controller was run: cannot happen.
                Err(error) => tracing::error!(%error, "leader election not started"),
            }
        }
        if let Some(state) = &mut self.state {
            state.poll(cx);
        }
    }

    /// Whether this replica leads now.
    pub(crate) fn leading(&self) -> bool {
        self.state
            .as_ref()
            .is_some_and(|s| s.receiver().borrow().is_leading())
    }

    /// What a reconcile started now must watch: it ends `grace` after
    /// this leadership does.
    pub(crate) fn fence(&self) -> Option<Fence> {
        let state = self.state.as_ref()?.receiver().clone();
        let LeaderState::Leading { since } = *state.borrow() else {
            return None;
        };
        Some(Fence {
            state,
            since,
            grace: self.grace,
        })
    }

    /// Releases the lease (once the controller is done); ready when it is
    /// released or there was nothing to release.
    pub(crate) fn poll_release(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.election = None;
        let elector = &mut self.elector;
        self.release.poll(cx, || {
            let elector = elector.take()?;
            Some(
                async move {
                    if let Err(error) = elector.release().await {
                        tracing::warn!(%error, "could not release the lease; it will expire");
                    }
                }
                .boxed(),
            )
        })
    }
}

/// The leadership a reconcile was started under.
pub(crate) struct Fence {
    state: watch::Receiver<LeaderState>,
    since: Instant,
    grace: Duration,
}

impl Fence {
    /// Whether that leadership still holds.
    pub(crate) fn holds(&self) -> bool {
        *self.state.borrow() == LeaderState::Leading { since: self.since }
    }

    /// Completes `grace` after that leadership ended.
    pub(crate) async fn ended(mut self) {
        let since = self.since;
        // A closed channel means the elector is gone: not leading.
        let _ = self
            .state
            .wait_for(|s| *s != LeaderState::Leading { since })
            .await;
        tokio::time::sleep(self.grace).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(state: &watch::Sender<LeaderState>, grace: Duration) -> Fence {
        let LeaderState::Leading { since } = *state.borrow() else {
            panic!("not leading");
        };
        Fence {
            state: state.subscribe(),
            since,
            grace,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_ends_grace_after_its_leadership() {
        let since = Instant::now();
        let (tx, _rx) = watch::channel(LeaderState::Leading { since });
        let grace = Duration::from_millis(250);
        let fence = fence(&tx, grace);
        assert!(fence.holds());
        let ended = tokio::spawn(async move {
            fence.ended().await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!ended.is_finished(), "ended while still leading");
        let fenced = Instant::now();
        tx.send_replace(LeaderState::Fenced);
        assert_eq!(ended.await.unwrap() - fenced, grace);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_leadership_does_not_keep_an_old_fence_alive() {
        let (tx, _rx) = watch::channel(LeaderState::Leading {
            since: Instant::now(),
        });
        let fence = fence(&tx, Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Lost and won again before the fence looked: still a new term.
        tx.send_replace(LeaderState::Leading {
            since: Instant::now(),
        });
        assert!(!fence.holds());
        let started = Instant::now();
        fence.ended().await;
        assert_eq!(started.elapsed(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_ends_when_the_elector_is_gone() {
        let (tx, _rx) = watch::channel(LeaderState::Leading {
            since: Instant::now(),
        });
        let fence = fence(&tx, Duration::from_millis(100));
        drop(tx);
        let started = Instant::now();
        fence.ended().await;
        assert_eq!(started.elapsed(), Duration::from_millis(100));
    }
}
