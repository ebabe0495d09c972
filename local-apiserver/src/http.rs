//! Just enough HTTP/1.1 for kube-client over plain `http://`: requests with
//! `Content-Length` or chunked bodies, responses with `Content-Length`, and
//! chunked responses for watches. Connections are kept alive (hyper's pool
//! reuses them) unless the client asks to close.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// Longest request head the server reads.
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body the server reads (a real apiserver refuses bodies
/// over 3 MiB; etcd's object limit is about 1.5 MiB).
pub(crate) const MAX_BODY: usize = 3 * 1024 * 1024;

/// One request.
#[derive(Debug, Default)]
pub(crate) struct Request {
    pub method: String,
    /// The path, percent-decoded.
    pub path: String,
    /// Query parameters, decoded (`+` is a space).
    pub query: Vec<(String, String)>,
    /// Headers with lower-case names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn query(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the connection should close after this request.
    pub fn wants_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"))
    }
}

/// Why a request could not be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The connection ended or failed: nothing to answer.
    Closed,
    /// Not HTTP we understand: answer 400 and close.
    Malformed(String),
    /// The body is over [`MAX_BODY`]: answer 413 and close.
    TooLarge,
}

/// Reads one request; `Err(Closed)` at the end of the connection.
pub(crate) async fn read_request<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Request, ReadError> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        let n = r
            .read_until(b'\n', &mut head)
            .await
            .map_err(|_| ReadError::Closed)?;
        if n == 0 {
            return Err(ReadError::Closed);
        }
        let line = &head[before..];
        if line == b"\r\n" || line == b"\n" {
            if before == 0 {
                // Stray empty line between requests (allowed by RFC 9112).
                head.clear();
                continue;
            }
            break;
        }
        if head.len() > MAX_HEAD {
            return Err(ReadError::Malformed("request head too large".into()));
        }
    }
    let head = String::from_utf8(head).map_err(|_| ReadError::Malformed("not UTF-8".into()))?;
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Malformed(format!(
            "bad request line {request_line:?}"
        )));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(ReadError::Malformed(format!("unsupported {version}")));
    }
    let mut req = Request {
        method: method.to_string(),
        ..Request::default()
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    req.path = percent_decode(path, false);
    req.query = query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect();
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(ReadError::Malformed(format!("bad header line {line:?}")));
        };
        req.headers
            .push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let chunked = req
        .header("transfer-encoding")
        .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"));
    if chunked {
        req.body = read_chunked(r).await?;
    } else if let Some(len) = req.header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| ReadError::Malformed("bad Content-Length".into()))?;
        if len > MAX_BODY {
            return Err(ReadError::TooLarge);
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body)
            .await
            .map_err(|_| ReadError::Closed)?;
        req.body = body;
    }
    Ok(req)
}

async fn read_chunked<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let mut size_line = String::new();
        r.read_line(&mut size_line)
            .await
            .map_err(|_| ReadError::Closed)?;
        let size_hex = size_line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| ReadError::Malformed("bad chunk size".into()))?;
        if size == 0 {
            // Trailers, then an empty line.
            loop {
                let mut line = String::new();
                let n = r
                    .read_line(&mut line)
                    .await
                    .map_err(|_| ReadError::Closed)?;
                if n == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_BODY {
            return Err(ReadError::TooLarge);
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])
            .await
            .map_err(|_| ReadError::Closed)?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)
            .await
            .map_err(|_| ReadError::Closed)?;
    }
}

/// Decodes `%XX` escapes (and `+` as a space in query strings).
pub(crate) fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' if plus_is_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The reason phrase for a status code.
fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// A whole response with a JSON body, as bytes ready to write in one go.
pub(crate) fn full_response(code: u16, body: &[u8], keep_alive: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n",
        reason(code),
        body.len(),
        if keep_alive {
            ""
        } else {
            "Connection: close\r\n"
        }
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// The head of a chunked (watch) response.
pub(crate) fn chunked_head(keep_alive: bool) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n{}\r\n",
        if keep_alive {
            ""
        } else {
            "Connection: close\r\n"
        }
    )
    .into_bytes()
}

/// One chunk of a chunked body.
pub(crate) fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// The end of a chunked body.
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_requests_with_both_body_framings() {
        let raw = b"PUT /api/v1/namespaces/a%20b/configmaps/x?labelSelector=app+in+%28a%2Cb%29&watch HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}POST /x HTTP/1.1\r\ntransfer-encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let mut r = tokio::io::BufReader::new(&raw[..]);
        let a = read_request(&mut r).await.unwrap();
        assert_eq!(a.method, "PUT");
        assert_eq!(a.path, "/api/v1/namespaces/a b/configmaps/x");
        assert_eq!(a.query("labelSelector"), Some("app in (a,b)"));
        assert_eq!(a.query("watch"), Some(""));
        assert_eq!(a.body, b"{}");
        assert!(!a.wants_close());
        let b = read_request(&mut r).await.unwrap();
        assert_eq!(b.body, b"abcde");
        assert!(b.wants_close());
        assert!(matches!(read_request(&mut r).await, Err(ReadError::Closed)));
    }

    #[tokio::test]
    async fn refuses_what_it_cannot_read() {
        let mut r = tokio::io::BufReader::new(&b"nonsense\r\n\r\n"[..]);
        assert!(matches!(
            read_request(&mut r).await,
            Err(ReadError::Malformed(_))
        ));
        let big = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        let mut r = tokio::io::BufReader::new(big.as_bytes());
        assert!(matches!(
            read_request(&mut r).await,
            Err(ReadError::TooLarge)
        ));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb+c", true), "a/b c");
        assert_eq!(percent_decode("a+b", false), "a+b");
        assert_eq!(percent_decode("100%", false), "100%");
        assert_eq!(percent_decode("%zz", false), "%zz");
        assert_eq!(percent_decode("%41", false), "A");
    }
}
