//! The worker's HTTP endpoints from a test: a free port, a GET, the Prometheus metrics.

use std::io::{Read, Write};
use std::net::TcpStream;

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET <path>` from the worker's HTTP listener (HTTP/1.0, so the server closes the connection after the body):
/// the status code and the body.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// `GET /metrics`: the body.
pub fn scrape(port: u16) -> Option<String> {
    http_get(port, "/metrics").map(|(_, body)| body)
}

/// The sum of the samples of `metric` (whatever their labels) in `body`.
pub fn total(body: &str, metric: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(metric) && !l.starts_with('#'))
        .filter(|l| l[metric.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
