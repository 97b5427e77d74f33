//! A small HTTP/1.1 client for plain-HTTP tool origins: one request at a time on a kept-alive
//! connection, written in one piece, its response framed here (status line and headers read by
//! `httparse`, then the body by `Content-Length`, chunked or until the close), every part bounded.
//!
//! Why not hyper's connection API (used before): its dispatcher, request and header types and the
//! channel between a request handle and its connection were more than half of the instructions
//! of a loopback tool call, for features a tool call does not use (pipelining, streaming bodies,
//! upgrades). What a tool call needs is small and all here: the request as a general client
//! sends it, the framing rules of RFC 9112 §6.3, informational (1xx) responses skipped, and
//! limits on every length a server chooses (head, header count, chunk lines, trailers, body).
//!
//! A connection is reused only when its response was framed (not read until the close), nothing
//! followed it, and neither side said `Connection: close` (HTTP/1.0 only with `keep-alive`).

use std::mem::MaybeUninit;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{ToolError, too_large};
use crate::failure::ReasonClass;

/// The largest response head (status line and headers) read.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Headers a response may have at most (hyper's default too).
pub const MAX_HEADERS: usize = 100;
/// The longest chunk-size line, chunk extensions included.
const MAX_CHUNK_LINE_BYTES: usize = 4 * 1024;
/// The largest trailer section of a chunked body.
const MAX_TRAILER_BYTES: usize = 16 * 1024;
/// Room made in the read buffer before each read.
const READ_CHUNK: usize = 8 * 1024;
/// Informational responses skipped before the final one at most.
const MAX_INTERIM: usize = 16;

/// One connection to a tool origin.
#[derive(Debug)]
pub(super) struct Conn {
    stream: TcpStream,
    /// Bytes read and not yet used; kept between requests for its allocation.
    buf: Vec<u8>,
    /// When it last went idle.
    pub(super) idle_since: Instant,
}

/// A final response, as the tool client uses it.
#[derive(Debug)]
pub(super) struct Response {
    pub status: u16,
    /// A redirect's target, when the header is text.
    pub location: Option<String>,
    pub body: Vec<u8>,
    /// Whether the connection may carry another request.
    pub reusable: bool,
}

/// How an exchange ended when it did not end with a response.
#[derive(Debug)]
pub(super) enum Failed {
    /// Not a byte of the request was written: it may be sent again on another connection.
    NotSent,
    /// After the request was (or may have been) written: never sent again.
    Error(ToolError),
}

/// How the body of a response is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// 1xx, 204 and 304 responses have none.
    Empty,
    Length(u64),
    Chunked,
    /// No length and not chunked (or chunked not last): the body ends with the connection.
    UntilClose,
}

/// What the head of a response says.
#[derive(Debug)]
struct Head {
    status: u16,
    /// Bytes the head took in the buffer.
    len: usize,
    framing: Framing,
    /// The server keeps the connection open after this response.
    keep_alive: bool,
    location: Option<String>,
}

fn broken(message: impl Into<String>) -> Failed {
    Failed::Error(ToolError { class: ReasonClass::ToolConnection, message: message.into() })
}

impl Conn {
    pub(super) fn new(stream: TcpStream) -> Conn {
        Conn { stream, buf: Vec::new(), idle_since: Instant::now() }
    }

    /// Whether an idle connection can still take a request: nothing came on it while it was
    /// idle (the server's close, above all, when it dropped the kept-alive connection).
    pub(super) fn alive(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Writes `request` (head and body) and reads its response, the body up to `max` bytes.
    pub(super) async fn exchange(&mut self, request: &[u8], max: usize) -> Result<Response, Failed> {
        self.buf.clear();
        let mut written = 0;
        while written < request.len() {
            match self.stream.write(&request[written..]).await {
                Ok(n) if n > 0 => written += n,
                // Refused before a byte went out: the connection was already gone.
                Ok(_) | Err(_) if written == 0 => return Err(Failed::NotSent),
                Ok(_) => return Err(broken("the connection closed while the request was sent")),
                Err(e) => return Err(broken(format!("the request could not be sent: {e}"))),
            }
        }
        let mut interim = 0;
        let head = loop {
            match parse_head(&self.buf)? {
                Some(head) if (100..200).contains(&head.status) => {
                    // 101 would switch protocols, which a tool call never asks for.
                    if head.status == 101 || interim == MAX_INTERIM {
                        return Err(broken(format!("unexpected HTTP {} response", head.status)));
                    }
                    interim += 1;
                    self.buf.drain(..head.len);
                }
                Some(head) => break head,
                None if self.buf.len() >= MAX_HEAD_BYTES => {
                    return Err(broken(format!("the response head is larger than {} KiB", MAX_HEAD_BYTES / 1024)));
                }
                None => {
                    if self.fill().await? == 0 {
                        let why = if self.buf.is_empty() && interim == 0 {
                            "the connection closed before the response came"
                        } else {
                            "the connection closed in the response head"
                        };
                        return Err(broken(why));
                    }
                }
            }
        };
        let mut pos = head.len;
        let body = match head.framing {
            Framing::Empty => Vec::new(),
            Framing::Length(n) => {
                if n > max as u64 {
                    return Err(Failed::Error(too_large(max)));
                }
                let n = n as usize;
                while self.buf.len() - pos < n {
                    pos = self.compact(pos);
                    if self.fill_upto(n - self.buf.len()).await? == 0 {
                        return Err(broken("the response broke off: the connection closed before the body ended"));
                    }
                }
                let body = self.buf[pos..pos + n].to_vec();
                pos += n;
                body
            }
            Framing::Chunked => {
                let (body, end) = self.chunked(pos, max).await?;
                pos = end;
                body
            }
            Framing::UntilClose => {
                self.compact(pos);
                while self.fill().await? > 0 {
                    if self.buf.len() > max {
                        return Err(Failed::Error(too_large(max)));
                    }
                }
                let body = std::mem::take(&mut self.buf);
                pos = body.len();
                body
            }
        };
        // Bytes after the response were never asked for: the connection is not trusted again.
        let reusable = head.keep_alive && head.framing != Framing::UntilClose && pos == self.buf.len();
        self.buf.clear();
        Ok(Response { status: head.status, location: head.location, body, reusable })
    }

    /// Decodes a chunked body starting at `pos` of the buffer: the body and where it ended.
    async fn chunked(&mut self, mut pos: usize, max: usize) -> Result<(Vec<u8>, usize), Failed> {
        let mut body = Vec::new();
        loop {
            let size = loop {
                match httparse::parse_chunk_size(&self.buf[pos..]) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        pos += used;
                        break size;
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() - pos > MAX_CHUNK_LINE_BYTES => {
                        return Err(broken("the response has a chunk-size line that does not end"));
                    }
                    Ok(httparse::Status::Partial) => {
                        pos = self.compact(pos);
                        self.more("in a chunk size").await?;
                    }
                    Err(_) => return Err(broken("the response has an invalid chunk size")),
                }
            };
            if size == 0 {
                break;
            }
            if size > (max - body.len()) as u64 {
                return Err(Failed::Error(too_large(max)));
            }
            let size = size as usize;
            // The chunk and the line end after it.
            while self.buf.len() - pos < size + 2 {
                pos = self.compact(pos);
                self.more("in a chunk").await?;
            }
            body.extend_from_slice(&self.buf[pos..pos + size]);
            if &self.buf[pos + size..pos + size + 2] != b"\r\n" {
                return Err(broken("the response has a chunk without its line end"));
            }
            pos += size + 2;
        }
        // Trailers (ignored), up to the empty line.
        loop {
            let rest = &self.buf[pos..];
            if rest.starts_with(b"\r\n") {
                return Ok((body, pos + 2));
            }
            if let Some(end) = memchr::memmem::find(rest, b"\r\n\r\n") {
                return Ok((body, pos + end + 4));
            }
            if rest.len() > MAX_TRAILER_BYTES {
                return Err(broken(format!("the response's trailers are larger than {} KiB", MAX_TRAILER_BYTES / 1024)));
            }
            pos = self.compact(pos);
            self.more("in the trailers").await?;
        }
    }

    /// Drops the bytes before `pos` once they are many: the new start of what is left.
    fn compact(&mut self, pos: usize) -> usize {
        if pos > 0 {
            self.buf.drain(..pos);
        }
        0
    }

    /// Reads what the socket has (at least [`READ_CHUNK`] of room): the bytes read, 0 at its end.
    async fn fill(&mut self) -> Result<usize, Failed> {
        self.buf.reserve(READ_CHUNK);
        self.stream.read_buf(&mut self.buf).await.map_err(|e| broken(format!("the response broke off: {e}")))
    }

    /// As [`Conn::fill`], but never more than `want` bytes: what follows a framed body stays in
    /// the socket, where the next use of the connection sees it.
    async fn fill_upto(&mut self, want: usize) -> Result<usize, Failed> {
        self.buf.reserve(want.min(64 * 1024));
        let room = (self.buf.capacity() - self.buf.len()).min(want);
        let mut limited = (&mut self.stream).take(room as u64);
        limited.read_buf(&mut self.buf).await.map_err(|e| broken(format!("the response broke off: {e}")))
    }

    /// Reads more of a chunked body; its end there is an error.
    async fn more(&mut self, what: &str) -> Result<(), Failed> {
        match self.fill().await? {
            0 => Err(broken(format!("the response broke off: the connection closed {what}"))),
            _ => Ok(()),
        }
    }
}

/// Reads a response head from the start of `buf`: `None` while it is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, Failed> {
    if buf.is_empty() {
        return Ok(None);
    }
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut response, buf, &mut headers) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(broken(format!("the response has more than {MAX_HEADERS} headers"))),
        Err(e) => return Err(broken(format!("the response is not valid HTTP/1.1: {e}"))),
    };
    let status = response.code.unwrap_or(0);
    let http10 = response.version == Some(0);
    let mut length: Option<u64> = None;
    let mut chunked_last = None;
    let (mut close, mut keep_alive) = (false, false);
    let mut location = None;
    for h in response.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            // `5`, or the same value repeated (`5, 5`, or in several headers); anything else
            // leaves the body's end unknown, which is refused (RFC 9112 §6.3, item 5).
            for part in h.value.split(|&b| b == b',') {
                let n = decimal(trim(part)).ok_or_else(|| broken("the response has an invalid Content-Length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(broken("the response has conflicting Content-Length values"));
                }
                length = Some(n);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Only the last coding decides whether the body is chunked.
            if let Some(last) = h.value.split(|&b| b == b',').map(trim).rfind(|t| !t.is_empty()) {
                chunked_last = Some(last.eq_ignore_ascii_case(b"chunked"));
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',').map(trim) {
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case("location") {
            // As a header value's text: visible ASCII (and tabs) only.
            location = h.value.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)).then(|| String::from_utf8_lossy(h.value).into_owned());
        }
    }
    let framing = match (status, chunked_last, length) {
        (100..=199 | 204 | 304, _, _) => Framing::Empty,
        // A Transfer-Encoding overrides any Content-Length (and such a message is not reused).
        (_, Some(true), _) => Framing::Chunked,
        (_, Some(false), _) => Framing::UntilClose,
        (_, None, Some(n)) => Framing::Length(n),
        (_, None, None) => Framing::UntilClose,
    };
    let smuggled = chunked_last.is_some() && length.is_some();
    let keep_alive = !close && !smuggled && (!http10 || keep_alive);
    Ok(Some(Head { status, len, framing, keep_alive, location }))
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !matches!(b, b' ' | b'\t')).map_or(start, |i| i + 1);
    &bytes[start..end.max(start)]
}

/// A non-negative decimal without sign or spaces, within u64.
fn decimal(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 19 {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| if b.is_ascii_digit() { n.checked_mul(10)?.checked_add(u64::from(b - b'0')) } else { None })
}

/// The request a general client sends: `GET` or `POST` of `path` and `query` with the `host`
/// (and `port` when it is not the scheme's), `accept: */*` and, with a JSON body, `content-type`
/// and `content-length` headers; head and body in one buffer, written at once.
pub(super) fn request(post: bool, path: &str, query: Option<&str>, host: &str, port: Option<u16>, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len() + query.map_or(0, str::len) + host.len() + body.len() + 112);
    out.extend_from_slice(if post { b"POST " } else { b"GET " });
    out.extend_from_slice(path.as_bytes());
    if let Some(q) = query {
        out.push(b'?');
        out.extend_from_slice(q.as_bytes());
    }
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    if let Some(port) = port {
        out.push(b':');
        push_decimal(&mut out, usize::from(port));
    }
    out.extend_from_slice(b"\r\naccept: */*\r\n");
    if post {
        out.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
        push_decimal(&mut out, body.len());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

fn push_decimal(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback server that reads one request head and answers it with `parts`, written one
    /// after the other (so a response arrives split where the test says), then keeps the
    /// connection open a little (`linger`) or closes it at once.
    async fn answering(parts: Vec<Vec<u8>>, linger: bool) -> Conn {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                    return;
                }
                head.push(byte[0]);
            }
            for part in parts {
                socket.write_all(&part).await.unwrap();
                socket.flush().await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            if linger {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
        });
        Conn::new(TcpStream::connect(address).await.unwrap())
    }

    async fn get(parts: &[&[u8]], max: usize) -> Result<Response, Failed> {
        let mut conn = answering(parts.iter().map(|p| p.to_vec()).collect(), true).await;
        conn.exchange(&request(false, "/t", None, "h", None, b""), max).await
    }

    fn error(r: Result<Response, Failed>) -> ToolError {
        match r {
            Err(Failed::Error(e)) => e,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn framed_bodies_and_reuse() {
        let r = get(&[b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"], 100).await.unwrap();
        assert_eq!((r.status, r.body.as_slice(), r.reusable), (200, &b"hello"[..], true));
        // Split anywhere, byte by byte through the head.
        let whole = b"HTTP/1.1 201 Created\r\nLocation: /x\r\nContent-Length: 3\r\n\r\nabc";
        let parts: Vec<&[u8]> = whole.chunks(1).collect();
        let r = get(&parts, 100).await.unwrap();
        assert_eq!((r.status, r.location.as_deref(), r.body.as_slice()), (201, Some("/x"), &b"abc"[..]));
        // Chunked, with extensions, split chunks and trailers.
        let r = get(&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nab", b"c\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n"], 100).await.unwrap();
        assert_eq!((r.body.as_slice(), r.reusable), (&b"abcde"[..], true));
        // Informational responses are skipped; 204 has no body.
        let r = get(&[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", b"HTTP/1.1 204 No Content\r\n\r\n"], 100).await.unwrap();
        assert_eq!((r.status, r.body.len(), r.reusable), (204, 0, true));
        // The same length repeated is one length.
        let r = get(&[b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\nok"], 100).await.unwrap();
        assert_eq!(r.body, b"ok");
    }

    #[tokio::test]
    async fn what_ends_reuse() {
        // Said so, HTTP/1.0 without keep-alive, bytes after the response, a length and a coding.
        for head in [
            &b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"[..],
            b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        ] {
            let r = get(&[head], 100).await.unwrap();
            assert_eq!((r.body.as_slice(), r.reusable), (&b"ok"[..], false), "{}", String::from_utf8_lossy(head));
        }
        let r = get(&[b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"], 100).await.unwrap();
        assert!(r.reusable);
        // No length: the body is what comes until the close.
        let mut conn = answering(vec![b"HTTP/1.1 200 OK\r\n\r\nuntil".to_vec(), b" the close".to_vec()], false).await;
        let r = conn.exchange(&request(false, "/", None, "h", None, b""), 100).await.unwrap();
        assert_eq!((r.body.as_slice(), r.reusable), (&b"until the close"[..], false));
    }

    #[tokio::test]
    async fn every_length_a_server_chooses_is_bounded() {
        let too_large = |r| error(r).class == ReasonClass::ToolResponseTooLarge;
        assert!(too_large(get(&[b"HTTP/1.1 200 OK\r\nContent-Length: 101\r\n\r\n"], 100).await));
        assert!(too_large(get(&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n60\r\n", &[b'x'; 96], b"\r\n10\r\n"], 100).await));
        let mut conn = answering(vec![b"HTTP/1.1 200 OK\r\n\r\n".to_vec(), vec![b'x'; 101]], false).await;
        assert!(too_large(conn.exchange(&request(false, "/", None, "h", None, b""), 100).await));
        let many: String = (0..MAX_HEADERS + 1).map(|i| format!("X-{i}: v\r\n")).collect();
        let e = error(get(&[format!("HTTP/1.1 200 OK\r\n{many}\r\n").as_bytes()], 100).await);
        assert!(e.message.contains("more than 100 headers"), "{e:?}");
        let long = format!("HTTP/1.1 200 OK\r\nX: {}", "v".repeat(MAX_HEAD_BYTES));
        let e = error(get(&[long.as_bytes()], 100).await);
        assert!(e.message.contains("head is larger than 64 KiB"), "{e:?}");
        let ext = format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;{}", "e".repeat(MAX_CHUNK_LINE_BYTES + 8));
        assert!(error(get(&[ext.as_bytes()], 100).await).message.contains("chunk-size line"));
        let trailers = format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: {}", "t".repeat(MAX_TRAILER_BYTES + 8));
        assert!(error(get(&[trailers.as_bytes()], 100).await).message.contains("trailers are larger"));
        let interim = "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM + 1);
        assert!(error(get(&[interim.as_bytes()], 100).await).message.contains("unexpected HTTP 100"));
    }

    #[tokio::test]
    async fn broken_responses_are_connection_errors() {
        for (answer, why) in [
            (&b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n"[..], "conflicting Content-Length"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "invalid Content-Length"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", "invalid Content-Length"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", "closed before the body ended"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "invalid chunk size"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX", "without its line end"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nok", "closed in a chunk"),
            (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "unexpected HTTP 101"),
            (b"SSH-2.0-OpenSSH_9.2\r\n", "not valid HTTP/1.1"),
            (b"HTTP/1.1 200 OK\r\nContent-", "closed in the response head"),
            (b"", "closed before the response came"),
        ] {
            let mut conn = answering(vec![answer.to_vec()], false).await;
            let e = error(conn.exchange(&request(false, "/", None, "h", None, b""), 100).await);
            assert_eq!(e.class, ReasonClass::ToolConnection, "{why}");
            assert!(e.message.contains(why), "{why}: {}", e.message);
        }
    }

    #[test]
    fn requests_as_a_general_client_sends_them() {
        let get = request(false, "/search", Some("q=a+b"), "127.0.0.1", Some(8080), b"");
        assert_eq!(get, b"GET /search?q=a+b HTTP/1.1\r\nhost: 127.0.0.1:8080\r\naccept: */*\r\n\r\n");
        let post = request(true, "/add", None, "[::1]", None, br#"{"a":1}"#);
        assert_eq!(
            String::from_utf8(post).unwrap(),
            "POST /add HTTP/1.1\r\nhost: [::1]\r\naccept: */*\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\n{\"a\":1}"
        );
        assert_eq!(decimal(b"0"), Some(0));
        assert_eq!(decimal(b"18446744073709551615"), None);
        assert_eq!(decimal(b"1844674407370955161"), Some(1_844_674_407_370_955_161));
        assert_eq!(decimal(b"+1"), None);
        assert_eq!(trim(b" \t5 "), b"5");
        assert_eq!(trim(b"   "), b"");
    }
}
