//! A loopback TCP proxy that can delay, stall, reset and cut the
//! connections through it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a [`FaultProxy`] does to the bytes and connections through it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyState {
    /// Held before each chunk is passed on, in each direction (0: none).
    pub delay: Duration,
    /// Half-open: connections stay open (and new ones are accepted) but no
    /// byte passes, in either direction, until this is cleared. What was
    /// read meanwhile is passed on then, so nothing is lost: the peer sees
    /// a connection that hangs.
    pub stalled: bool,
    /// Cut off: every connection is reset (TCP RST) and new ones are reset
    /// as soon as they are accepted, until this is cleared.
    pub cut: bool,
    /// Incremented by [`FaultProxy::reset`]: connections accepted before
    /// are reset.
    resets: u64,
}

/// A loopback TCP proxy in front of one address (an API server's port),
/// for one client or a group of them, on which faults are switched on and
/// off: [`delay`](FaultProxy::delay) (slow responses),
/// [`stall`](FaultProxy::stall) (half-open connections),
/// [`reset`](FaultProxy::reset) (every connection reset at once, as when a
/// server or a load balancer restarts) and [`cut`](FaultProxy::cut) (a
/// client that lost the server: resets, then refusal, until
/// [`heal`](FaultProxy::heal)). Give each replica of a test a proxy of its
/// own to cut one off while the others keep the server.
///
/// It forwards bytes and knows nothing of TLS or HTTP: a client verifies
/// the server's certificate through it as it would directly (the test
/// cluster's certificate names 127.0.0.1, whatever the port).
/// [`ChaosCluster::client_config_via`](crate::faults::ChaosCluster::client_config_via)
/// makes a client configuration that goes through one.
///
/// Runs on the tokio runtime it was started in; dropping it (or the
/// runtime) closes its listener and every connection through it.
///
/// ```no_run
/// # async fn example() -> std::io::Result<()> {
/// use std::time::Duration;
/// use kube_test_cluster::faults::FaultProxy;
///
/// let proxy = FaultProxy::start("127.0.0.1:6443".parse().unwrap()).await?;
/// // Clients connect to proxy.addr() instead.
/// proxy.delay(Duration::from_millis(300)); // slow
/// proxy.stall(); // half-open
/// proxy.heal(); // everything passes again, what was held first
/// proxy.reset(); // every connection reset once
/// proxy.cut(); // reset, and refused until healed
/// proxy.heal();
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    state: Arc<watch::Sender<ProxyState>>,
    accepted: Arc<AtomicU64>,
    listener: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port that forwards every
    /// connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (state, _) = watch::channel(ProxyState::default());
        let state = Arc::new(state);
        let accepted = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(accept_loop(
            listener,
            upstream,
            state.clone(),
            accepted.clone(),
        ));
        Ok(FaultProxy {
            addr,
            upstream,
            state,
            accepted,
            listener: task,
        })
    }

    /// The address clients connect to: `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address it forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// What it does now.
    pub fn state(&self) -> ProxyState {
        *self.state.borrow()
    }

    /// How many connections it accepted so far.
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Holds each chunk of bytes for `delay` before passing it on, in both
    /// directions (`Duration::ZERO`: no delay). Connections stay up.
    pub fn delay(&self, delay: Duration) {
        self.state.send_modify(|s| s.delay = delay);
    }

    /// Stops passing bytes, in both directions, on every connection, old
    /// and new, until [`heal`](FaultProxy::heal): half-open connections, as
    /// when a network path silently drops everything.
    pub fn stall(&self) {
        self.state.send_modify(|s| s.stalled = true);
    }

    /// Resets (TCP RST) every connection through it now; new connections
    /// are accepted as usual.
    pub fn reset(&self) {
        self.state.send_modify(|s| s.resets += 1);
    }

    /// Cuts the client off: resets every connection and resets new ones
    /// at once, until [`heal`](FaultProxy::heal).
    pub fn cut(&self) {
        self.state.send_modify(|s| {
            s.cut = true;
            s.resets += 1;
        });
    }

    /// Ends every fault: no delay, no stall, no cut. Bytes held by a stall
    /// are passed on.
    pub fn heal(&self) {
        self.state.send_modify(|s| {
            s.delay = Duration::ZERO;
            s.stalled = false;
            s.cut = false;
        });
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.listener.abort();
        // Connections end when they see the sender gone.
        self.state.send_modify(|s| s.resets += 1);
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    state: Arc<watch::Sender<ProxyState>>,
    accepted: Arc<AtomicU64>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        let rx = state.subscribe();
        if rx.borrow().cut {
            reset(client);
            continue;
        }
        tokio::spawn(connection(client, upstream, rx));
    }
}

/// Drops `stream` with SO_LINGER 0, so the peer gets a RST, not a FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut state: watch::Receiver<ProxyState>,
) {
    let resets = state.borrow().resets;
    let _ = client.set_nodelay(true);
    let server = tokio::select! {
        server = TcpStream::connect(upstream) => server.ok(),
        _ = reset_requested(&mut state, resets) => None,
    };
    let Some(mut server) = server else {
        reset(client);
        return;
    };
    let _ = server.set_nodelay(true);
    let reset_now = {
        // Borrowed halves: unlike owned ones, dropping them does not send
        // a FIN, so a reset below is a RST and nothing else.
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let up = pump(client_read, server_write, state.clone());
        let down = pump(server_read, client_write, state.clone());
        tokio::select! {
            _ = async { tokio::join!(up, down) } => false,
            _ = reset_requested(&mut state, resets) => true,
        }
    };
    if reset_now {
        reset(client);
        reset(server);
    }
}

/// Waits until a reset after `resets` is asked for, or the proxy is gone.
async fn reset_requested(state: &mut watch::Receiver<ProxyState>, resets: u64) {
    let _ = state.wait_for(|s| s.resets != resets).await;
}

/// Copies from `from` to `to` under the proxy's state until `from` ends
/// (then shuts `to` down) or a write fails.
async fn pump(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    mut state: watch::Receiver<ProxyState>,
) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // A stall holds what was read until it is healed.
        if state.wait_for(|s| !s.stalled).await.is_err() {
            return;
        }
        let delay = state.borrow().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
