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

use tokio::io::AsyncReadExt;
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
/// Bytes of chunk extensions a body may carry in all (hyper's limit too).
const MAX_CHUNK_EXTENSION_BYTES: usize = 16 * 1024;
/// A read buffer larger than this is not kept with an idle connection, and a body is read in
/// steps of at most this much room.
const KEEP_BUFFER_BYTES: usize = 64 * 1024;
/// An idle connection is asked of the kernel whether it was closed (a real peek, one system call)
/// once it has been idle this long; sooner, what the runtime's reactor saw of the socket says it.
const PEEK_AFTER: std::time::Duration = std::time::Duration::from_millis(1);

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

/// Why a request was not all written once its first bytes went out: what the server said, if
/// anything, is read next, and this is the error only when it said nothing.
#[derive(Debug, thiserror::Error)]
enum CutShort {
    #[error("the connection closed while the request was sent")]
    Closed,
    #[error("the server answered before the request was all sent")]
    AnsweredEarly,
    #[error("the request could not be sent: {0}")]
    Io(std::io::Error),
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

/// A read of the response that failed.
fn broke_off(e: std::io::Error) -> Failed {
    broken(format!("the response broke off: {e}"))
}

impl Conn {
    pub(super) fn new(stream: TcpStream) -> Conn {
        Conn { stream, buf: Vec::new(), idle_since: Instant::now() }
    }

    /// Whether an idle connection can still take a request: nothing came on it while it was
    /// idle (the server's close, above all, when it dropped the kept-alive connection).
    pub(super) fn alive(&self, now: Instant) -> bool {
        let mut probe = [0u8; 1];
        // What the runtime's reactor saw (no system call unless it saw the socket readable).
        if !matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock) {
            return false;
        }
        if now.saturating_duration_since(self.idle_since) < PEEK_AFTER {
            return true;
        }
        // Idle a while: the kernel itself is asked, as the reactor may not have looked at the
        // socket since a close came (a busy runtime turns it only between tasks).
        let mut peek = [MaybeUninit::<u8>::uninit(); 1];
        matches!(socket2::SockRef::from(&self.stream).peek(&mut peek), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Writes `request` (head and body) and reads its response, the body up to `max` bytes.
    pub(super) async fn exchange(&mut self, request: &[u8], max: usize) -> Result<Response, Failed> {
        self.buf.clear();
        let sent = self.send(request).await?;
        let head = match self.read_head().await {
            Ok(head) => head,
            // No answer after a failed write: the write's error says more.
            Err(e) => return Err(sent.err().map_or(e, |cut| broken(cut.to_string()))),
        };
        let mut pos = head.len;
        let body = match head.framing {
            Framing::Empty => Vec::new(),
            Framing::Length(n) => {
                if n > max as u64 {
                    return Err(Failed::Error(too_large(max)));
                }
                let n = n as usize;
                // Read into the body itself: a large one is not copied, nor kept in the buffer.
                let have = (self.buf.len() - pos).min(n);
                let mut body = Vec::with_capacity(n.min(KEEP_BUFFER_BYTES).max(have));
                body.extend_from_slice(&self.buf[pos..pos + have]);
                pos += have;
                while body.len() < n {
                    body.reserve((n - body.len()).min(KEEP_BUFFER_BYTES));
                    let room = (body.capacity() - body.len()).min(n - body.len());
                    // Never past the body: what follows stays in the socket, where the next use
                    // of the connection sees it.
                    let read = (&mut self.stream).take(room as u64).read_buf(&mut body).await.map_err(broke_off)?;
                    if read == 0 {
                        return Err(broken("the response broke off: the connection closed before the body ended"));
                    }
                }
                body
            }
            Framing::Chunked => {
                let (body, end) = self.chunked(pos, max).await?;
                pos = end;
                body
            }
            Framing::UntilClose => {
                let mut body = self.buf[pos..].to_vec();
                pos = self.buf.len();
                loop {
                    if body.len() > max {
                        return Err(Failed::Error(too_large(max)));
                    }
                    body.reserve(READ_CHUNK);
                    if self.stream.read_buf(&mut body).await.map_err(broke_off)? == 0 {
                        break;
                    }
                }
                body
            }
        };
        // Bytes after the response were never asked for, and a request not all sent leaves the
        // server mid-request: the connection is not trusted again.
        let reusable = sent.is_ok() && head.keep_alive && head.framing != Framing::UntilClose && pos == self.buf.len();
        if self.buf.capacity() > KEEP_BUFFER_BYTES {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        Ok(Response { status: head.status, location: head.location, body, reusable })
    }

    /// Writes the request. `Err(cut)` inside `Ok`: the request was not all written (the server
    /// answered before it was, or the write failed after its first bytes), and what the server
    /// said, if anything, is read next; `Failed::NotSent`: not a byte of it went out.
    async fn send(&mut self, request: &[u8]) -> Result<Result<(), CutShort>, Failed> {
        let mut written = 0;
        while written < request.len() {
            match self.stream.try_write(&request[written..]) {
                Ok(n) if n > 0 => written += n,
                // Refused before a byte went out: the connection was already gone.
                Ok(_) if written == 0 => return Err(Failed::NotSent),
                Ok(_) => return Ok(Err(CutShort::Closed)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // The socket is full: wait for room, or for an answer that comes before the
                    // request is all sent (a server refusing a large body answers at once).
                    tokio::select! {
                        biased;
                        ready = self.stream.readable() => {
                            ready.map_err(|e| broken(format!("the request could not be sent: {e}")))?;
                            self.buf.reserve(READ_CHUNK);
                            match self.stream.try_read_buf(&mut self.buf) {
                                Ok(0) => return Ok(Err(CutShort::Closed)),
                                Ok(_) if matches!(parse_head(&self.buf), Ok(Some(h)) if h.status >= 200) || self.buf.len() >= MAX_HEAD_BYTES => {
                                    return Ok(Err(CutShort::AnsweredEarly));
                                }
                                Ok(_) => {}
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                                Err(e) => return Ok(Err(CutShort::Io(e))),
                            }
                        }
                        ready = self.stream.writable() => {
                            ready.map_err(|e| broken(format!("the request could not be sent: {e}")))?;
                        }
                    }
                }
                Err(_) if written == 0 => return Err(Failed::NotSent),
                // The server may have answered and closed: what it said is read next.
                Err(e) => return Ok(Err(CutShort::Io(e))),
            }
        }
        Ok(Ok(()))
    }

    /// Reads up to the head of the final response (informational ones skipped).
    async fn read_head(&mut self) -> Result<Head, Failed> {
        let mut interim = 0;
        // Where the buffer was last parsed to: a head is parsed again only once a line ended
        // after it (a head trickled in byte by byte is not parsed once per byte).
        let mut parsed_to = 0;
        loop {
            if memchr::memchr(b'\n', &self.buf[parsed_to..]).is_some() {
                match parse_head(&self.buf)? {
                    Some(head) if head.status < 200 => {
                        // 101 would switch protocols, which a tool call never asks for.
                        if head.status == 101 || interim == MAX_INTERIM {
                            return Err(broken(format!("unexpected HTTP {} response", head.status)));
                        }
                        interim += 1;
                        self.buf.drain(..head.len);
                        parsed_to = 0;
                        continue;
                    }
                    Some(head) => return Ok(head),
                    None => parsed_to = self.buf.len(),
                }
            }
            if self.buf.len() >= MAX_HEAD_BYTES {
                return Err(broken(format!("the response head is larger than {} KiB", MAX_HEAD_BYTES / 1024)));
            }
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

    /// Decodes a chunked body starting at `pos` of the buffer: the body and where it ended.
    async fn chunked(&mut self, mut pos: usize, max: usize) -> Result<(Vec<u8>, usize), Failed> {
        let mut body = Vec::new();
        let mut extensions = 0;
        loop {
            let size = loop {
                // At least one hex digit: an empty line is no size (httparse would read it as 0).
                if self.buf.get(pos).is_some_and(|b| !b.is_ascii_hexdigit()) {
                    return Err(broken("the response has an invalid chunk size"));
                }
                match httparse::parse_chunk_size(&self.buf[pos..]) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        let digits = self.buf[pos..].iter().take_while(|b| b.is_ascii_hexdigit()).count();
                        extensions += used - digits - 2;
                        if extensions > MAX_CHUNK_EXTENSION_BYTES {
                            return Err(broken(format!("the response's chunk extensions are larger than {} KiB", MAX_CHUNK_EXTENSION_BYTES / 1024)));
                        }
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
        // Trailer lines (ignored), each ending in CRLF, up to an empty one.
        let mut trailers = 0;
        loop {
            let rest = &self.buf[pos..];
            match memchr::memchr(b'\n', rest) {
                Some(i) if i == 0 || rest[i - 1] != b'\r' => return Err(broken("the response has a trailer line without its CRLF")),
                Some(1) => return Ok((body, pos + 2)),
                Some(i) => {
                    pos += i + 1;
                    trailers += i + 1;
                }
                None => {
                    // The line so far counts too: an endless one is refused as it comes.
                    if trailers + rest.len() > MAX_TRAILER_BYTES {
                        return Err(broken(format!("the response's trailers are larger than {} KiB", MAX_TRAILER_BYTES / 1024)));
                    }
                    pos = self.compact(pos);
                    self.more("in the trailers").await?;
                }
            }
            if trailers > MAX_TRAILER_BYTES {
                return Err(broken(format!("the response's trailers are larger than {} KiB", MAX_TRAILER_BYTES / 1024)));
            }
        }
    }

    /// Drops the bytes before `pos`: the new start of what is left.
    fn compact(&mut self, pos: usize) -> usize {
        if pos > 0 {
            self.buf.drain(..pos);
        }
        0
    }

    /// Reads what the socket has (at least [`READ_CHUNK`] of room): the bytes read, 0 at its end.
    async fn fill(&mut self) -> Result<usize, Failed> {
        self.buf.reserve(READ_CHUNK);
        self.stream.read_buf(&mut self.buf).await.map_err(broke_off)
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
    if status < 100 {
        return Err(broken(format!("the response has an invalid status ({status:03})")));
    }
    // An informational response's headers say nothing of the final one's framing.
    if status < 200 {
        return Ok(Some(Head { status, len, framing: Framing::Empty, keep_alive: true, location: None }));
    }
    let http10 = response.version == Some(0);
    let mut length: Option<u64> = None;
    // Some(last coding is `chunked`) once a Transfer-Encoding is there (even an empty one).
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
            let last = h.value.split(|&b| b == b',').map(trim).rfind(|t| !t.is_empty());
            chunked_last = Some(last.is_some_and(|t| t.eq_ignore_ascii_case(b"chunked")));
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',').map(trim) {
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case("location") && location.is_none() {
            // The first, as a header value's text: visible ASCII (and tabs) only.
            location = h.value.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)).then(|| String::from_utf8_lossy(h.value).into_owned());
        }
    }
    // HTTP/1.0 has no transfer codings: such a message's framing is faulty (RFC 9112 §6.1).
    if http10 && chunked_last.is_some() {
        return Err(broken("the response is HTTP/1.0 with a Transfer-Encoding"));
    }
    let framing = match (status, chunked_last, length) {
        (204 | 304, _, _) => Framing::Empty,
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
pub(super) mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Reads one request head from a raw socket, byte by byte; `None` once the peer closed.
    pub(in crate::tools) async fn read_head(socket: &mut TcpStream) -> Option<Vec<u8>> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if socket.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            head.push(byte[0]);
        }
        Some(head)
    }

    /// A loopback server that reads one request head and answers it with `parts`, written one
    /// after the other (so a response arrives split where the test says), then keeps the
    /// connection open a little (`linger`) or closes it at once.
    async fn answering(parts: Vec<Vec<u8>>, linger: bool) -> Conn {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            if read_head(&mut socket).await.is_none() {
                return;
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

    /// Review findings (an adversary's tool server), each its own case.
    #[tokio::test]
    async fn hostile_framing_found_in_review() {
        // A body until the close that came with its head in one piece is still capped.
        let mut answer = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
        answer.extend([b'x'; 5000]);
        let mut conn = answering(vec![answer], false).await;
        assert_eq!(error(conn.exchange(&request(false, "/", None, "h", None, b""), 100).await).class, ReasonClass::ToolResponseTooLarge);
        // An empty chunk-size line is no last chunk.
        let e = error(get(&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n\r\n\r\n"], 100).await);
        assert!(e.message.contains("invalid chunk size"), "{e:?}");
        // Chunk extensions are bounded over the whole body, not only per line.
        let line = format!("1;{}\r\nx\r\n", "e".repeat(4000));
        let mut answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        answer.extend(line.repeat(6).into_bytes());
        assert!(error(get(&[&answer], 1 << 20).await).message.contains("chunk extensions are larger than 16 KiB"));
        // A trailer line must end in CRLF (a bare LF would leave the call waiting).
        let e = error(get(&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\n"], 100).await);
        assert!(e.message.contains("trailer line without its CRLF"), "{e:?}");
        // HTTP/1.0 has no transfer codings; a status below 100 is none.
        let e = error(get(&[b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"], 100).await);
        assert!(e.message.contains("HTTP/1.0 with a Transfer-Encoding"), "{e:?}");
        assert!(error(get(&[b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n"], 100).await).message.contains("invalid status (099)"));
        // An empty Transfer-Encoding still overrides the length: read until the close, not reused.
        let mut conn = answering(vec![b"HTTP/1.1 200 OK\r\nTransfer-Encoding: \r\nContent-Length: 2\r\n\r\nok".to_vec()], false).await;
        let r = conn.exchange(&request(false, "/", None, "h", None, b""), 100).await.unwrap();
        assert_eq!((r.body.as_slice(), r.reusable), (&b"ok"[..], false));
        // An informational response's framing headers are not the final one's; the first
        // Location is the one (as a general client reads it).
        let r = get(&[b"HTTP/1.1 103 Early\r\nContent-Length: x\r\n\r\nHTTP/1.1 302 Found\r\nLocation: /a\r\nLocation: /b\r\nContent-Length: 0\r\n\r\n"], 100)
            .await
            .unwrap();
        assert_eq!((r.status, r.location.as_deref()), (302, Some("/a")));
    }

    #[tokio::test]
    async fn a_large_body_is_read_into_itself_and_the_buffer_kept_small() {
        let n = 4 * 1024 * 1024;
        let mut answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n").into_bytes();
        answer.extend(std::iter::repeat_n(b'x', n));
        let mut conn = answering(vec![answer], true).await;
        let r = conn.exchange(&request(false, "/", None, "h", None, b""), 64 << 20).await.unwrap();
        assert_eq!((r.body.len(), r.reusable), (n, true));
        assert!(conn.buf.capacity() <= KEEP_BUFFER_BYTES, "an idle connection keeps {} bytes", conn.buf.capacity());
    }

    #[tokio::test]
    async fn an_answer_before_the_request_is_all_sent_is_the_answer() {
        // The server refuses a large body at once and reads no more of it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            read_head(&mut socket).await.unwrap();
            socket.write_all(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbig!").await.unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        });
        let mut conn = Conn::new(TcpStream::connect(address).await.unwrap());
        let body = vec![b'a'; 64 << 20];
        let post = request(true, "/", None, "h", None, &body);
        let exchange = conn.exchange(&post, 100);
        // Bounded only so that a regression fails instead of hanging; it answers at once.
        let r = tokio::time::timeout(std::time::Duration::from_secs(20), exchange).await.expect("the early answer was not seen").unwrap();
        assert_eq!((r.status, r.body.as_slice(), r.reusable), (413, &b"big!"[..], false));
    }

    #[test]
    fn a_close_the_reactor_has_not_seen_is_found_before_reuse() {
        // One thread that does not turn the reactor while it works: a close that came meanwhile
        // is only in the kernel.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let (closed_tx, closed_rx) = std::sync::mpsc::channel();
            let server = std::thread::spawn(move || {
                let listener = listener.into_std().unwrap();
                listener.set_nonblocking(false).unwrap();
                let (mut socket, _) = listener.accept().unwrap();
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    std::io::Read::read_exact(&mut socket, &mut byte).unwrap();
                    head.push(byte[0]);
                }
                std::io::Write::write_all(&mut socket, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
                std::thread::sleep(std::time::Duration::from_millis(20));
                drop(socket);
                closed_tx.send(()).unwrap();
            });
            let mut conn = Conn::new(TcpStream::connect(address).await.unwrap());
            let r = conn.exchange(&request(false, "/", None, "h", None, b""), 100).await.unwrap();
            assert!(r.reusable);
            conn.idle_since = Instant::now();
            // The close happens while this thread is busy (no await: the reactor stands still).
            closed_rx.recv().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!conn.alive(Instant::now()), "a closed connection was taken for alive");
            server.join().unwrap();
        });
    }

    /// A seeded mutation fuzz of what a tool server may answer: whatever the bytes, split
    /// however, an exchange ends (the server closes after writing), never panics, keeps a body
    /// within its cap and fails with a connection or size error whose message carries none of
    /// the server's bytes.
    #[tokio::test]
    async fn any_answer_ends_in_a_bounded_response_or_a_plain_error() {
        const SEEDS: &[&[u8]] = &[
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\n\r\nuntil the close",
            b"HTTP/1.1 302 Found\r\nLocation: /next\r\nContent-Length: 0\r\n\r\n",
        ];
        const TOKENS: &[&[u8]] = &[
            b"\r\n",
            b"\n",
            b"\r",
            b"0",
            b";",
            b":",
            b" ",
            b"\t",
            b",",
            b"ffffffffffffffff",
            b"99999999999999999999",
            b"Content-Length: 3\r\n",
            b"Transfer-Encoding: chunked\r\n",
            b"Connection: close\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\n",
        ];
        // xorshift64*: the same cases on every run, so a failure can be replayed.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: usize| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n.max(1)
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (cases_tx, mut cases_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<Vec<u8>>>();
        tokio::spawn(async move {
            while let Some(parts) = cases_rx.recv().await {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                let _ = socket.set_nodelay(true);
                if read_head(&mut socket).await.is_none() {
                    continue;
                }
                // The client may stop reading early: a failed write ends the case, not the server.
                for part in parts {
                    if socket.write_all(&part).await.is_err() {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
        });
        for case in 0..3000 {
            let mut bytes = SEEDS[next(SEEDS.len())].to_vec();
            for _ in 0..1 + next(4) {
                let at = next(bytes.len() + 1);
                match next(6) {
                    0 if at < bytes.len() => bytes[at] = next(256) as u8,
                    1 => bytes.splice(at..at, TOKENS[next(TOKENS.len())].iter().copied()).for_each(drop),
                    2 => drop(bytes.drain(at..(at + next(8)).min(bytes.len()))),
                    3 => {
                        let copy = bytes[at..(at + next(16)).min(bytes.len())].to_vec();
                        bytes.splice(at..at, copy).for_each(drop);
                    }
                    4 => bytes.truncate(at),
                    _ => bytes.splice(at..at, SEEDS[next(SEEDS.len())].iter().copied()).for_each(drop),
                }
            }
            let mut parts = Vec::new();
            let mut rest = bytes.as_slice();
            while !rest.is_empty() {
                let (part, tail) = rest.split_at(1 + next(rest.len()));
                parts.push(part.to_vec());
                rest = tail;
            }
            let max = [0, 1, 10, 100, 4096][next(5)];
            cases_tx.send(parts).unwrap();
            let mut conn = Conn::new(TcpStream::connect(address).await.unwrap());
            let get = request(false, "/", None, "h", None, b"");
            let exchange = conn.exchange(&get, max);
            let shown = String::from_utf8_lossy(&bytes).into_owned();
            // Bounded only so that a regression fails instead of hanging.
            match tokio::time::timeout(std::time::Duration::from_secs(30), exchange).await {
                Err(_) => panic!("case {case}: no end to the exchange for {shown:?}"),
                Ok(Ok(r)) => {
                    assert!(r.body.len() <= max, "case {case}: a body of {} bytes over a cap of {max} for {shown:?}", r.body.len());
                    assert!((200..=999).contains(&r.status), "case {case}: final status {} for {shown:?}", r.status);
                }
                Ok(Err(Failed::NotSent)) => panic!("case {case}: the request was taken for unsent for {shown:?}"),
                Ok(Err(Failed::Error(e))) => {
                    assert!(matches!(e.class, ReasonClass::ToolConnection | ReasonClass::ToolResponseTooLarge), "case {case}: {e:?}");
                    assert!(!e.message.is_empty() && e.message.len() < 200, "case {case}: {:?}", e.message);
                }
            }
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
