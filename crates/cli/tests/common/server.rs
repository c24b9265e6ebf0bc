//! A running `hearth serve` for the HTTP tests (`serve.rs`, `structured.rs`): started on
//! a free port with an API key, requests as raw HTTP/1.1, killed on drop.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The API key every test server requires.
pub const KEY: &str = "test-key";

/// A running `hearth serve`, killed on drop.
pub struct Server {
    /// The `hearth serve` process.
    pub child: Child,
    /// `HOST:PORT` it listens on.
    pub addr: String,
    /// Its stderr after the listening line, as it arrives.
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    /// Start on a free port with `args` added; wait for the listening line.
    pub fn start(args: &[&str]) -> Server {
        Self::start_model(&super::model(), args)
    }

    /// [`Self::start`] serving `model`.
    pub fn start_model(model: &std::path::Path, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(["serve", "--port", "0", "-t", "2", "--api-key", KEY, "-m"])
            .arg(model)
            .args(args)
            .env_remove("HEARTH_MODEL")
            .env_remove("HEARTH_API_KEY")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next().expect("the server exited before listening").unwrap();
            if let Some(a) = line.strip_prefix("hearth serve listening on http://") {
                break a.trim().to_string();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Server { child, addr, log }
    }

    /// One request; returns (status, body).
    pub fn request(&self, method: &str, path: &str, key: Option<&str>, body: &str) -> (u16, String) {
        self.request_auth(method, path, &key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default(), body)
    }

    /// [`Self::request`] with the `Authorization` header line(s) `auth` as given.
    pub fn request_auth(&self, method: &str, path: &str, auth: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_string() };
        (status, body)
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.request("POST", path, Some(KEY), &body.to_string());
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
    }

    pub fn get(&self, path: &str) -> String {
        let (status, text) = self.request("GET", path, Some(KEY), "");
        assert_eq!(status, 200, "{path}: {text}");
        text
    }

    /// A streamed request's `data:` chunks (without `[DONE]`).
    pub fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let (status, text) = self.request("POST", path, Some(KEY), &body.to_string());
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("data: [DONE]"), "{text}");
        text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Undo HTTP/1.1 chunked transfer encoding.
pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}
