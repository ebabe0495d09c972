//! The HTTP layer, spoken to by hand: connections are reused unless the
//! client asks to close, chunked request bodies are read, and what is not
//! HTTP or not JSON gets a `Status` with 400, what is not served 404 or
//! 405, an unknown patch type 415.

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use kube_local_apiserver::LocalApiServer;

/// Reads one response: (code, headers with lower-case names, body).
async fn response(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut line = String::new();
    r.read_line(&mut line).await.unwrap();
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .expect("a status line")
        .parse()
        .unwrap();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).await.unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':').unwrap();
        headers.push((n.to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map(|(_, v)| v.parse().unwrap())
        .expect("a Content-Length");
    let mut body = vec![0; len];
    r.read_exact(&mut body).await.unwrap();
    (code, headers, body)
}

async fn connect(server: &LocalApiServer) -> BufReader<TcpStream> {
    let addr = server.main_endpoint().addr();
    BufReader::new(TcpStream::connect(addr).await.unwrap())
}

fn status_of(body: &[u8]) -> (String, u64) {
    let v: Value = serde_json::from_slice(body).expect("a JSON Status");
    assert_eq!(v["kind"], "Status");
    (
        v["reason"].as_str().unwrap().to_string(),
        v["code"].as_u64().unwrap(),
    )
}

#[tokio::test]
async fn one_connection_serves_many_requests_until_asked_to_close() {
    let server = LocalApiServer::start().await;
    let mut c = connect(&server).await;
    let body = r#"{"metadata":{"name":"by-hand"},"data":{"a":"1"}}"#;
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    c.get_mut()
        .write_all(
            format!(
                "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (code, headers, _) = response(&mut c).await;
    assert_eq!(code, 201);
    assert!(
        !headers
            .iter()
            .any(|(n, v)| n == "connection" && v == "close")
    );

    c.get_mut()
        .write_all(b"GET /api/v1/namespaces/default/configmaps/by-hand HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (code, headers, body) = response(&mut c).await;
    assert_eq!(code, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["data"]["a"], "1");
    assert!(
        headers
            .iter()
            .any(|(n, v)| n == "connection" && v == "close")
    );
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "the server closed the connection");
}

/// A request with a body of the given type (and its length).
fn req(method: &str, path: &str, content_type: &str, body: &str) -> String {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n");
    if !content_type.is_empty() {
        r.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    r.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    r
}

#[tokio::test]
async fn bad_requests_get_a_status() {
    let server = LocalApiServer::start().await;
    let cm = "/api/v1/namespaces/default/configmaps";
    let cases: Vec<(String, u16, &str)> = vec![
        (req("GET", "/api/v1/widgets", "", ""), 404, "NotFound"),
        (
            req("GET", "/apis/no.such/v1/things", "", ""),
            404,
            "NotFound",
        ),
        (req("GET", "/api/v1/configmaps/x", "", ""), 404, "NotFound"),
        (
            req("GET", &format!("{cm}/x/scale"), "", ""),
            404,
            "NotFound",
        ),
        (req("PUT", cm, "", ""), 405, "MethodNotAllowed"),
        (
            req("POST", "/api/v1/configmaps", "application/json", "{}"),
            405,
            "MethodNotAllowed",
        ),
        (
            req("POST", cm, "application/json", "{x}"),
            400,
            "BadRequest",
        ),
        (
            req(
                "POST",
                cm,
                "application/json",
                r#"{"kind":"Secret","metadata":{"name":"s"}}"#,
            ),
            400,
            "BadRequest",
        ),
        (
            req(
                "POST",
                "/api/v1/namespaces/nowhere/configmaps",
                "application/json",
                r#"{"metadata":{"name":"x"}}"#,
            ),
            404,
            "NotFound",
        ),
        (
            req("POST", cm, "application/json", r#"{"metadata":{}}"#),
            422,
            "Invalid",
        ),
        (
            req("PATCH", &format!("{cm}/x"), "text/plain", "{}"),
            415,
            "UnsupportedMediaType",
        ),
        (
            req("GET", &format!("{cm}?labelSelector=a%20in%20(b"), "", ""),
            400,
            "BadRequest",
        ),
        (
            req("GET", &format!("{cm}?fieldSelector=data.x%3D1"), "", ""),
            400,
            "BadRequest",
        ),
        (
            req("GET", &format!("{cm}?limit=x"), "", ""),
            400,
            "BadRequest",
        ),
        (
            req("GET", &format!("{cm}?watch=1&resourceVersion=x"), "", ""),
            400,
            "BadRequest",
        ),
    ];
    for (raw, code, reason) in cases {
        let mut c = connect(&server).await;
        c.get_mut().write_all(raw.as_bytes()).await.unwrap();
        let (got, _, body) = response(&mut c).await;
        assert_eq!(got, code, "{raw}");
        let (r, c2) = status_of(&body);
        assert_eq!((r.as_str(), c2), (reason, u64::from(code)), "{raw}");
    }
    // Not HTTP at all: 400, and the connection closes.
    let mut c = connect(&server).await;
    c.get_mut().write_all(b"hello\r\n\r\n").await.unwrap();
    let (code, _, _) = response(&mut c).await;
    assert_eq!(code, 400);
    let (code, _, _) = {
        let mut c = connect(&server).await;
        c.get_mut()
            .write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut line = String::new();
        c.read_line(&mut line).await.unwrap();
        (
            line.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u16>()
                .unwrap(),
            (),
            (),
        )
    };
    assert_eq!(code, 200);
}
