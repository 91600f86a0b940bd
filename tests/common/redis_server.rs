//! A throwaway `redis-server` (Debian package `redis-server`; `.ci/run` installs it) on a
//! loopback port, for the tests and the load harness: its own port and directory, nothing
//! persisted (`--save ''`, no AOF), stopped when dropped — also when a test panics — and killed
//! by the kernel should the process that started it die first.
//!
//! Include it with `#[path = "../common/redis_server.rs"] mod redis_server;`.

#![allow(
    dead_code,
    reason = "shared by the integration tests and the load harness, each using part of it"
)]

use std::{
    net::TcpListener,
    os::unix::process::CommandExt,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A running redis-server.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    /// The TLS listener's port, for a server started with [`RedisServer::start_tls`].
    tls_port: Option<u16>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts one on a free loopback port and waits until it answers.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like [`Self::start`], with more `redis-server` arguments (e.g. `--requirepass`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_on_free_ports(extra, false)
    }

    /// Like [`Self::start_with`], also listening for TLS on a port of its own (see
    /// [`Self::tls_port`]); `extra` gives the certificate arguments.
    pub fn start_tls(extra: &[&str]) -> RedisServer {
        Self::start_on_free_ports(extra, true)
    }

    /// One attempt on `port` (no TLS): `None` when no redis-server of ours answers there.
    pub fn try_start_on(port: u16, extra: &[&str]) -> Option<RedisServer> {
        let mut server = RedisServer {
            child: None,
            port,
            tls_port: None,
            dir: tempfile::tempdir().expect("temp dir for redis"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn().then_some(server)
    }

    fn start_on_free_ports(extra: &[&str], tls: bool) -> RedisServer {
        let mut server = RedisServer {
            child: None,
            port: 0,
            tls_port: None,
            dir: tempfile::tempdir().expect("temp dir for redis"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        // redis-server takes a port number, not port 0, so its ports are probed here. Another
        // process may take one between our probe and redis binding it: try again, with new ones.
        for _ in 0..5 {
            server.port = free_port();
            server.tls_port = tls.then(free_port);
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start on free loopback ports");
    }

    /// Runs redis-server on `self.port`; true once it answers, and is the one we started:
    /// another Redis already on the probed port answers PING too, while ours exits (the port is
    /// taken), so the answer is only taken as ours when `INFO server` names our child's pid.
    fn spawn(&mut self) -> bool {
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string()])
            .args(
                self.tls_port
                    .iter()
                    .flat_map(|port| ["--tls-port".to_owned(), port.to_string()]),
            )
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .args(["--loglevel", "warning"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        #[expect(
            unsafe_code,
            reason = "pre_exec: the child asks to die with its parent"
        )]
        // SAFETY: prctl is async-signal-safe; the child only asks to be killed with its parent.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) => panic!(
                "cannot run redis-server ({err}); install the Debian package redis-server (.ci/run does)"
            ),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                // Exited: most likely the port was taken.
                return false;
            }
            if ping(self.port) && server_pid(self.port, self.password()) == Some(child.id()) {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `--requirepass` it was started with, if any.
    fn password(&self) -> Option<&str> {
        self.extra
            .iter()
            .position(|arg| arg == "--requirepass")
            .and_then(|at| self.extra.get(at + 1))
            .map(String::as_str)
    }

    /// The TLS port of a server started with [`Self::start_tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it at once (SIGKILL): an outage, as a crash or a partition looks to clients.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            // The port is ours; the old socket may take a moment to be released.
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// A client for commands of the test's own (CLIENT PAUSE, SCRIPT FLUSH, MEMORY USAGE, …).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis client")
    }

    /// Runs one command and returns its answer.
    pub async fn command(&self, args: &[&str]) -> redis::Value {
        self.command_within(args, Duration::from_secs(5)).await
    }

    /// Runs one command as a client that logs in with `password` (`--requirepass`).
    pub async fn command_authed(&self, password: &str, args: &[&str]) -> redis::Value {
        let client = redis::Client::open(format!("redis://:{password}@127.0.0.1:{}", self.port))
            .expect("redis client");
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test redis");
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command
            .query_async(&mut connection)
            .await
            .unwrap_or_else(|err| panic!("redis {args:?}: {err}"))
    }

    /// Runs one command, waiting up to `within` for its answer (e.g. through a `CLIENT PAUSE`).
    pub async fn command_within(&self, args: &[&str], within: Duration) -> redis::Value {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(within));
        let mut connection = self
            .client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("connect to the test redis");
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command
            .query_async(&mut connection)
            .await
            .unwrap_or_else(|err| panic!("redis {args:?}: {err}"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Whether a Redis answers on this port (a raw RESP PING; an answer asking for a password
/// counts too).
fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut answer = [0u8; 5];
    stream.read_exact(&mut answer).is_ok() && (&answer == b"+PONG" || &answer == b"-NOAU")
}

/// The `process_id` a Redis on this port reports in `INFO server` (after `AUTH`, with a
/// password), or `None` when it does not answer with one.
fn server_pid(port: u16, password: Option<&str>) -> Option<u32> {
    use std::io::{BufRead, BufReader, Read, Write};
    fn resp(args: &[&str]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
        }
        out
    }
    let stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut writer = stream;
    let mut line = String::new();
    if let Some(password) = password {
        writer.write_all(&resp(&["AUTH", password])).ok()?;
        reader.read_line(&mut line).ok()?;
        if !line.starts_with("+OK") {
            return None;
        }
    }
    writer.write_all(&resp(&["INFO", "server"])).ok()?;
    line.clear();
    reader.read_line(&mut line).ok()?;
    let length: usize = line.strip_prefix('$')?.trim().parse().ok()?;
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// A Redis Cluster of throwaway servers on loopback: each a [`RedisServer`] with cluster mode
/// on, joined by `redis-cli --cluster create` (Debian's redis-tools, installed with
/// redis-server), every slot served before it is handed out.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `n` primaries (at least 3, as Redis Cluster asks), no replicas.
    pub fn start(n: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli (Debian package redis-tools)");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        // Every node must see the cluster as ok before clients are pointed at it.
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &nodes {
            loop {
                let info = Command::new("redis-cli")
                    .args(["-p", &node.port().to_string(), "cluster", "info"])
                    .output()
                    .expect("redis-cli cluster info");
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "the cluster did not become ok");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        RedisCluster { nodes }
    }

    /// A seed node's URL.
    pub fn url(&self) -> String {
        self.nodes[0].url()
    }
}
