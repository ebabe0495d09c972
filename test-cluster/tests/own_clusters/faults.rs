//! The fault calls of `kube_test_cluster::faults`: the proxy's faults on a
//! plain TCP echo server (fast), and a `ChaosCluster`'s restart and
//! compaction on a real kube-apiserver.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::{Api, PostParams, WatchEvent, WatchParams};
use kube_client::{Client, ResourceExt};
use kube_test_cluster::faults::{ChaosCluster, FaultProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout};

/// An echo server on a loopback port.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Sends `text` and reads it back, within `limit`.
async fn round_trip(
    conn: &mut TcpStream,
    text: &[u8],
    limit: Duration,
) -> std::io::Result<Vec<u8>> {
    conn.write_all(text).await?;
    let mut back = vec![0u8; text.len()];
    match timeout(limit, conn.read_exact(&mut back)).await {
        Ok(read) => read.map(|_| back),
        Err(_) => Err(ErrorKind::TimedOut.into()),
    }
}

#[tokio::test]
async fn a_healthy_proxy_passes_bytes_both_ways() {
    let proxy = FaultProxy::start(echo_server().await).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    let back = round_trip(&mut conn, b"hello", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(back, b"hello");
    assert_eq!(proxy.connections(), 1);
}

#[tokio::test]
async fn a_delay_holds_each_chunk_each_way() {
    let proxy = FaultProxy::start(echo_server().await).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    proxy.delay(Duration::from_millis(200));
    let started = Instant::now();
    round_trip(&mut conn, b"slow", Duration::from_secs(5))
        .await
        .unwrap();
    // Held once on the way there and once on the way back.
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    proxy.heal();
    let started = Instant::now();
    round_trip(&mut conn, b"fast", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_stall_holds_the_bytes_until_healed_on_old_and_new_connections() {
    let proxy = FaultProxy::start(echo_server().await).await.unwrap();
    let mut old = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut old, b"before", Duration::from_secs(5))
        .await
        .unwrap();
    proxy.stall();
    let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
    for conn in [&mut old, &mut new] {
        let err = round_trip(conn, b"stalled", Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::TimedOut,
            "half-open: no error, no answer"
        );
    }
    proxy.heal();
    // What was held comes through, nothing lost.
    for conn in [&mut old, &mut new] {
        let mut back = [0u8; 7];
        timeout(Duration::from_secs(5), conn.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&back, b"stalled");
    }
}

#[tokio::test]
async fn a_reset_breaks_every_connection_once() {
    let proxy = FaultProxy::start(echo_server().await).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut conn, b"before", Duration::from_secs(5))
        .await
        .unwrap();
    proxy.reset();
    let mut buf = [0u8; 1];
    let read = timeout(Duration::from_secs(5), conn.read(&mut buf))
        .await
        .unwrap();
    assert_eq!(read.unwrap_err().kind(), ErrorKind::ConnectionReset);
    let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut again, b"after", Duration::from_secs(5))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_cut_resets_old_and_new_connections_until_healed() {
    let proxy = FaultProxy::start(echo_server().await).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut conn, b"before", Duration::from_secs(5))
        .await
        .unwrap();
    proxy.cut();
    let mut buf = [0u8; 1];
    let read = timeout(Duration::from_secs(5), conn.read(&mut buf))
        .await
        .unwrap();
    assert_eq!(read.unwrap_err().kind(), ErrorKind::ConnectionReset);
    let mut during = TcpStream::connect(proxy.addr()).await.unwrap();
    let err = round_trip(&mut during, b"x", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof
        ),
        "{err:?}"
    );
    proxy.heal();
    let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
    round_trip(&mut after, b"after", Duration::from_secs(5))
        .await
        .unwrap();
}

fn configmap(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm
}

/// Restart keeps the data, the address and the credentials; compaction
/// makes a watch from an older resourceVersion fail with 410 Gone; a cut
/// proxy's client loses the server while a direct client keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chaos_cluster_restarts_with_its_data_compacts_and_cuts_one_client() {
    let mut cluster = ChaosCluster::builder()
        .watch_cache(false)
        .start()
        .await
        .unwrap();
    let direct = Client::try_from(cluster.client_config().await).unwrap();
    let proxy = cluster.proxy().await;
    let proxied = Client::try_from(cluster.client_config_via(&proxy).await).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(direct.clone(), "default");
    let via_proxy: Api<ConfigMap> = Api::namespaced(proxied.clone(), "default");

    let first = cms
        .create(&PostParams::default(), &configmap("first"))
        .await
        .unwrap();
    let old_version = first.resource_version().unwrap();
    // Compaction at revision R keeps R itself: a watch from `first` starts
    // at the revision after it, which must be older than R.
    for name in ["second", "third"] {
        cms.create(&PostParams::default(), &configmap(name))
            .await
            .unwrap();
    }

    // Compaction: the older version is gone for a watch that reaches etcd.
    let revision = cluster.compact().await.unwrap();
    assert!(revision >= old_version.parse::<u64>().unwrap());
    let mut events = cms
        .watch(&WatchParams::default().timeout(10), &old_version)
        .await
        .unwrap()
        .boxed();
    let gone = loop {
        match timeout(Duration::from_secs(10), events.next())
            .await
            .unwrap()
        {
            Some(Ok(WatchEvent::Error(e))) => break e.code,
            Some(Err(kube_client::Error::Api(e))) => break e.code,
            Some(Ok(WatchEvent::Bookmark(_))) => continue,
            other => panic!("expected 410 Gone, got {other:?}"),
        }
    };
    assert_eq!(gone, 410);

    // A cut: the proxied client loses the server, the direct one keeps it.
    proxy.cut();
    assert!(via_proxy.get("first").await.is_err());
    cms.get("first").await.unwrap();
    proxy.heal();
    via_proxy.get("first").await.unwrap();

    // Restart: same address, same credentials, the data kept.
    let server = cluster.server().to_string();
    let pid = cluster.pid();
    let down = cluster.restart().await.unwrap();
    assert_eq!(cluster.server(), server);
    assert_ne!(cluster.pid(), pid);
    assert_eq!(cluster.restarts(), 1);
    assert!(down < Duration::from_secs(60), "{down:?}");
    let names: Vec<String> = cms
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|cm| cm.name_any())
        .collect();
    assert!(
        names.contains(&"first".to_string()) && names.contains(&"second".to_string()),
        "{names:?}"
    );
    // The clients made before the restart work again (they reconnect).
    via_proxy.get("second").await.unwrap();

    let dir = cluster.dir().to_path_buf();
    drop(cluster);
    assert!(
        !dir.exists(),
        "the data directory is removed when the cluster stops"
    );
}
