//! The process's shutdown signals, for [`Manager::run`](crate::Manager::run)
//! and [`Controller::shutdown_on_signal`](crate::Controller::shutdown_on_signal):
//! SIGTERM (what Kubernetes sends a Pod's containers) or SIGINT (Ctrl-C);
//! Ctrl-C only where there are no Unix signals.

use futures_util::FutureExt;
use futures_util::future::BoxFuture;

/// Resolves at the first SIGTERM or SIGINT after this call. Fails when the
/// handlers cannot be installed (outside a tokio runtime with signal
/// handling, for one).
pub(crate) fn shutdown_signal() -> std::io::Result<BoxFuture<'static, ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        .boxed())
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        }
        .boxed())
    }
}
