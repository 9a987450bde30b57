//! Benchmark only (bench/proxy_floor.py's `native` forwarder): what the capturing proxy's per-call path would cost
//! if HTTP were served and forwarded outside Python, and Python only recorded the calls, in batches.
//!
//! hyper serves `http://127.0.0.1:<port>/v1` on one thread (tokio's current-thread runtime), forwards each request
//! to `--backend` plus the rest of its path over a pooled keep-alive client, reads the whole answer and answers
//! with it. Each finished call (start and end times in ns since the epoch, status, path, request body, answer body)
//! is appended to a buffer that goes to stdout every `--flush-ms` (default 20), so the Python process that records
//! the calls wakes at most that often, however many calls come. Frame, little-endian:
//! `u64 start_ns, u64 end_ns, u16 status, u32 path_len, u32 request_len, u32 answer_len`, then the three byte runs.
//! The first line on stdout is the address to call. Not a usable proxy: no streaming, no retries, no gate, no
//! request rewriting; it says what forwarding costs when no Python runs per call.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::io::FromRawFd;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::body::Bytes;
use hyper::client::HttpConnector;
use hyper::header::{HeaderName, CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use hyper::service::{make_service_fn, service_fn};
use hyper::{Body, Client, Request, Response, Server, StatusCode, Uri};
use tokio::sync::mpsc;

struct Call {
    start_ns: u64,
    end_ns: u64,
    status: u16,
    path: String,
    request: Bytes,
    answer: Bytes,
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

fn hop_by_hop(name: &HeaderName) -> bool {
    name == CONNECTION || name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == HOST || name == "keep-alive"
}

fn bad_gateway(error: impl std::fmt::Display) -> Response<Body> {
    let mut answer = Response::new(Body::from(format!("{{\"error\": \"native forwarder: {error}\"}}")));
    *answer.status_mut() = StatusCode::BAD_GATEWAY;
    answer
}

async fn forward(
    request: Request<Body>,
    client: Client<HttpConnector>,
    backend: Arc<String>,
    calls: mpsc::UnboundedSender<Call>,
) -> Result<Response<Body>, Infallible> {
    let start_ns = now_ns();
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_string();
    let rest = path.strip_prefix("/v1").unwrap_or(&path);
    let body = match hyper::body::to_bytes(body).await {
        Ok(body) => body,
        Err(error) => return Ok(bad_gateway(error)),
    };
    let uri: Uri = match format!("{backend}{rest}").parse() {
        Ok(uri) => uri,
        Err(error) => return Ok(bad_gateway(error)),
    };
    let mut upstream = Request::builder().method(parts.method).uri(uri);
    for (name, value) in parts.headers.iter().filter(|(name, _)| !hop_by_hop(name)) {
        upstream = upstream.header(name, value);
    }
    let upstream = match upstream.body(Body::from(body.clone())) {
        Ok(upstream) => upstream,
        Err(error) => return Ok(bad_gateway(error)),
    };
    let answer = match client.request(upstream).await {
        Ok(answer) => answer,
        Err(error) => return Ok(bad_gateway(error)),
    };
    let (head, answer_body) = answer.into_parts();
    let data = match hyper::body::to_bytes(answer_body).await {
        Ok(data) => data,
        Err(error) => return Ok(bad_gateway(error)),
    };
    let status = head.status;
    let _ = calls.send(Call { start_ns, end_ns: now_ns(), status: status.as_u16(), path, request: body, answer: data.clone() });
    let mut reply = Response::builder().status(status);
    for (name, value) in head.headers.iter().filter(|(name, _)| !hop_by_hop(name)) {
        reply = reply.header(name, value);
    }
    Ok(reply.body(Body::from(data)).unwrap_or_else(bad_gateway))
}

fn frame(buffer: &mut Vec<u8>, call: &Call) {
    buffer.extend_from_slice(&call.start_ns.to_le_bytes());
    buffer.extend_from_slice(&call.end_ns.to_le_bytes());
    buffer.extend_from_slice(&call.status.to_le_bytes());
    for part in [call.path.as_bytes(), &call.request[..], &call.answer[..]] {
        buffer.extend_from_slice(&(part.len() as u32).to_le_bytes());
    }
    buffer.extend_from_slice(call.path.as_bytes());
    buffer.extend_from_slice(&call.request);
    buffer.extend_from_slice(&call.answer);
}

/// Every `every`, the calls finished since the last flush go to stdout in one write.
async fn hand_over(mut calls: mpsc::UnboundedReceiver<Call>, every: Duration) {
    // Plain writes to the pipe: tokio's stdout hands every write to its blocking pool (a thread woken each time),
    // and std's is line-buffered (a write per newline in the frames). SAFETY: fd 1 is open for the whole process,
    // and nothing else writes to it after the address line.
    let mut out = unsafe { std::fs::File::from_raw_fd(1) };
    let mut buffer: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            call = calls.recv() => match call {
                Some(call) => frame(&mut buffer, &call),
                None => break,
            },
            _ = tick.tick() => {
                if !buffer.is_empty() {
                    if out.write_all(&buffer).is_err() || out.flush().is_err() {
                        return; // the recording process went away
                    }
                    buffer.clear();
                }
            }
        }
    }
}

fn argument(name: &str, default: Option<&str>) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| default.map(str::to_string))
        .unwrap_or_else(|| panic!("usage: native-forwarder --backend URL [--flush-ms N]; {name} is missing"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let backend = Arc::new(argument("--backend", None).trim_end_matches('/').to_string());
    let every = Duration::from_millis(argument("--flush-ms", Some("20")).parse().expect("--flush-ms: an integer"));
    let client: Client<HttpConnector> = Client::builder().pool_max_idle_per_host(usize::MAX).build_http();
    let (sender, receiver) = mpsc::unbounded_channel();
    let make = make_service_fn(move |_| {
        let (client, backend, sender) = (client.clone(), backend.clone(), sender.clone());
        async move {
            Ok::<_, Infallible>(service_fn(move |request| {
                forward(request, client.clone(), backend.clone(), sender.clone())
            }))
        }
    });
    let server = Server::bind(&SocketAddr::from(([127, 0, 0, 1], 0))).http1_keepalive(true).serve(make);
    println!("http://127.0.0.1:{}/v1", server.local_addr().port());
    let handing = tokio::spawn(hand_over(receiver, every));
    if let Err(error) = server.await {
        eprintln!("native forwarder: {error}");
    }
    let _ = handing.await;
}
