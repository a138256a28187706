//! A real S3 server for tests: `s3s-fs` (S3 over a local folder, from crates.io; `tools/test.sh`
//! installs it) on 127.0.0.1, behind a small HTTP proxy that logs every request and injects
//! faults (error answers, dropped connections, bodies cut short) on the requests it is told to.
//! Each request goes over its own connection (`Connection: close` both ways), so a fault hits
//! exactly the request it was meant for. The proxy also serves as an HTTP forward proxy
//! (`HTTP_PROXY`), which lets a client address the bucket virtual-hosted style
//! (`http://BUCKET.localhost/key`) without resolving that name: the server is started with
//! `--domain localhost:PROXY_PORT` and takes the bucket from the `Host` header.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The bucket every test writes to; tests keep apart by key prefix.
pub const BUCKET: &str = "tpde-test";
const ACCESS_KEY: &str = "tpde-test-key";
const SECRET_KEY: &str = "tpde-test-secret";

/// One request the proxy saw.
#[derive(Clone, Debug)]
pub struct Logged {
    pub method: String,
    /// The request target: path and query.
    pub target: String,
    /// The `Range` header, if any.
    pub range: Option<String>,
    /// The status sent back (0: the connection was dropped).
    pub status: u16,
    /// Response body bytes sent back.
    pub body_bytes: u64,
    /// The `x-amz-checksum-sha256` header the client sent, if any.
    pub checksum: Option<String>,
}

/// What the proxy does to a request instead of forwarding it faithfully.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Answer with this status and no body.
    Status(u16),
    /// Close the connection without an answer.
    Drop,
    /// Forward, but send only this many bytes of the response body, then close.
    CutBody(usize),
    /// Forward with one byte of the request body flipped (damage in transit).
    CorruptRequest,
    /// Forward, with one byte in the middle of the response body flipped (damage in transit,
    /// past the store's own checks).
    CorruptResponse,
}

struct Rule {
    method: &'static str,
    target_part: String,
    fault: Fault,
    times: usize,
}

#[derive(Default)]
struct Shared {
    log: Mutex<Vec<Logged>>,
    rules: Mutex<Vec<Rule>>,
}

/// The server, the proxy in front of it, and the folder it serves.
pub struct S3 {
    /// A shell that runs the server, and kills it and removes its folder when its standard input
    /// closes: when this value is dropped or the test process ends, however it ends.
    child: Child,
    keepalive: Option<std::process::ChildStdin>,
    root: tempfile::TempDir,
    pub proxy_port: u16,
    shared: Arc<Shared>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl S3 {
    /// Starts `s3s-fs` (from `$S3S_FS`, or `s3s-fs` on the PATH or in `~/.cargo/bin`) and the
    /// proxy; waits until the server answers.
    pub fn start() -> S3 {
        let root = tempfile::tempdir().expect("a temporary folder");
        std::fs::create_dir(root.path().join(BUCKET)).expect("the bucket's folder");
        let port = free_port();
        let listener = TcpListener::bind("127.0.0.1:0").expect("the proxy's port");
        let proxy_port = listener.local_addr().expect("bound").port();
        let exe = std::env::var_os("S3S_FS").map(PathBuf::from).unwrap_or_else(|| {
            let cargo_bin = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin/s3s-fs"));
            cargo_bin.filter(|p| p.is_file()).unwrap_or_else(|| PathBuf::from("s3s-fs"))
        });
        // The shell also removes the served folder: a server kept in a `static` is never
        // dropped, so only the shell sees the test process end.
        let mut child = Command::new("sh")
            .args(["-c", r#"root=$1; shift; "$0" "$@" & pid=$!; read _; kill $pid; wait $pid; rm -rf "$root""#])
            .arg(&exe)
            .arg(root.path())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .args(["--domain", &format!("localhost:{proxy_port}")])
            .arg(root.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh starts");
        let keepalive = child.stdin.take().expect("piped");
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let gone = child.try_wait().ok().flatten().is_some();
            assert!(
                !gone && start.elapsed() < Duration::from_secs(20),
                "{} did not start listening on {port} (cargo install s3s-fs --features binary)",
                exe.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || {
                    let _ = serve(client, port, &s);
                });
            }
        });
        S3 { child, keepalive: Some(keepalive), root, proxy_port, shared }
    }

    /// The variables that make a client address the bucket virtual-hosted style
    /// (`http://BUCKET.localhost`), through the proxy as its HTTP proxy.
    pub fn virtual_hosted_env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.env();
        env[0].1 = format!("http://{BUCKET}.localhost:{}", self.proxy_port);
        env.push(("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "true".into()));
        env.push(("HTTP_PROXY", format!("http://127.0.0.1:{}", self.proxy_port)));
        env.push(("NO_PROXY", String::new()));
        env
    }

    /// The variables that point a client at the proxy, as AWS's tools read them.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", self.proxy_port)),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }

    /// `s3://BUCKET/key`.
    pub fn url(&self, key: &str) -> String {
        format!("s3://{BUCKET}/{key}")
    }

    /// Where the server keeps the object `key` on disk.
    pub fn object_path(&self, key: &str) -> PathBuf {
        self.root.path().join(BUCKET).join(key)
    }

    /// The requests whose target contains `part`, in the order they were answered.
    pub fn requests(&self, part: &str) -> Vec<Logged> {
        self.shared.log.lock().unwrap().iter().filter(|l| l.target.contains(part)).cloned().collect()
    }

    /// The next `times` requests of `method` whose target contains `part` get `fault`.
    pub fn inject(&self, method: &'static str, part: &str, fault: Fault, times: usize) {
        self.shared.rules.lock().unwrap().push(Rule { method, target_part: part.into(), fault, times });
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        drop(self.keepalive.take()); // the shell reads end-of-file and stops the server
        let _ = self.child.wait();
    }
}

/// Handles one request on `client`: forwards it to the server on `upstream` (or applies a fault)
/// and logs it.
fn serve(client: TcpStream, upstream: u16, shared: &Shared) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line == "\r\n" {
            break;
        }
        head.push(line);
    }
    let mut words = head[0].split_whitespace();
    let (method, target, version) =
        (words.next().unwrap_or(""), words.next().unwrap_or(""), words.next().unwrap_or(""));
    // A request to a forward proxy names the whole URL; the server wants its path.
    let target = match target.strip_prefix("http://") {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    let (method, target) = (method.to_owned(), target.to_owned());
    head[0] = format!("{method} {target} {version}\r\n");
    let headers: HashMap<String, String> = head[1..]
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body_len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0u8; body_len];
    reader.read_exact(&mut body)?;
    let fault = {
        let mut rules = shared.rules.lock().unwrap();
        let hit = rules.iter_mut().find(|r| r.times > 0 && r.method == method && target.contains(&r.target_part));
        hit.map(|r| {
            r.times -= 1;
            r.fault
        })
    };
    let mut logged = Logged {
        method: method.clone(),
        target: target.clone(),
        range: headers.get("range").cloned(),
        status: 0,
        body_bytes: 0,
        checksum: headers.get("x-amz-checksum-sha256").cloned(),
    };
    let result = match fault {
        Some(Fault::Drop) => {
            log(shared, logged);
            Ok(())
        }
        Some(Fault::Status(code)) => {
            logged.status = code;
            log(shared, logged);
            client.write_all(
                format!("HTTP/1.1 {code} Injected\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
            )
        }
        _ => {
            let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
            let mut request = head[0].clone().into_bytes();
            for line in &head[1..] {
                if !line.to_ascii_lowercase().starts_with("connection:") {
                    request.extend_from_slice(line.as_bytes());
                }
            }
            request.extend_from_slice(b"Connection: close\r\n\r\n");
            if let (Some(Fault::CorruptRequest), Some(b)) = (fault, body.last_mut()) {
                *b ^= 1;
            }
            request.extend_from_slice(&body);
            up.write_all(&request)?;
            let mut response = Vec::new();
            up.read_to_end(&mut response)?;
            let split = response.windows(4).position(|w| w == b"\r\n\r\n").map_or(response.len(), |p| p + 4);
            let (resp_head, resp_body) = response.split_at(split);
            let resp_head = String::from_utf8_lossy(resp_head);
            logged.status = resp_head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            let mut out: String = resp_head
                .split("\r\n")
                .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
                .map(|l| format!("{l}\r\n"))
                .collect();
            out.push_str("Connection: close\r\n\r\n");
            let mut body = resp_body.to_vec();
            if let (Some(Fault::CorruptResponse), false) = (fault, body.is_empty()) {
                let mid = body.len() / 2;
                body[mid] ^= 0x10;
            }
            let sent = match fault {
                Some(Fault::CutBody(n)) => &body[..n.min(body.len())],
                _ => &body[..],
            };
            logged.body_bytes = sent.len() as u64;
            log(shared, logged);
            client.write_all(out.as_bytes()).and_then(|_| client.write_all(sent))
        }
    };
    result
}

/// Logs a request before its answer goes out, so that a client that has its answer finds it
/// in the log.
fn log(shared: &Shared, logged: Logged) {
    shared.log.lock().unwrap().push(logged);
}
