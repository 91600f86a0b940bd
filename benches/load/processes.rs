//! The servers the harness starts and what it reads of them: toolgate binaries ([`Spawned`], then
//! [`Binary`] once health says SERVING), the bare echo as its own process, `redis-server`, the
//! port of the harness's OTLP collector; and from `/proc` and the admin endpoint, their memory,
//! CPU time, context switches and shadow counters. Every child is killed if it is still running
//! when dropped, and every wait here is bounded.

use std::{
    collections::BTreeMap,
    fs::File,
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use tokio::runtime::Runtime;

use crate::{
    bare_echo,
    catalog::{SECRET, SECRET_ENV},
    load::connect,
    redis_server::RedisServer,
};

/// `target/release/toolgate serve` with the bench catalog, started but not yet known to serve.
/// It listens on a port it chooses itself and says which on its log: a port probed here and
/// handed over could be taken by another process (another binary's admin port, say) before the
/// binary binds it.
pub struct Spawned {
    child: Process,
    spawned: Instant,
    config: PathBuf,
    log: PathBuf,
}

/// A binary that answered SERVING, and where.
pub struct Binary {
    child: Process,
    pub addr: SocketAddr,
    /// The admin listener (`/metrics`), when the binary's environment asked for one.
    pub admin: Option<SocketAddr>,
    /// The MCP door, when its catalog has one (`server.mcp`).
    pub mcp: Option<SocketAddr>,
    /// The approvals console, when its catalog has one (`server.console`).
    pub console: Option<SocketAddr>,
    /// The catalog it serves.
    pub config: PathBuf,
    /// Its stderr: JSON logs.
    pub log: PathBuf,
}

impl Spawned {
    /// Starts `exe serve` with `config`, logging to `DIR/SERVICE.log`, spans named `service`.
    pub fn spawn(
        exe: &Path,
        config: &Path,
        dir: &Path,
        service: &str,
        envs: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let log = dir.join(format!("{service}.log"));
        let spawned = Instant::now();
        let child = Command::new(exe)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .env(SECRET_ENV, SECRET)
            .env("OTEL_SERVICE_NAME", service)
            .envs(envs.iter().copied())
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        Ok(Spawned {
            child: Process(Some(child)),
            spawned,
            config: config.to_path_buf(),
            log,
        })
    }

    /// Waits until the health service answers SERVING; returns the binary and how long after
    /// spawning its port accepted a connection and health said SERVING.
    pub fn wait_serving(mut self, client_rt: &Runtime) -> anyhow::Result<(Binary, Startup)> {
        let mut listening = Duration::ZERO;
        let limit = Duration::from_secs(10);
        let serving = self.child.running().and_then(|child| {
            let addr = announced_addr(child, &self.log, limit, |line| {
                json_log_addr(line, "serving gRPC over TCP")
            })?;
            wait_listening(child, addr, limit)?;
            listening = self.spawned.elapsed();
            client_rt.block_on(health_serving(addr))?;
            // Every listener is bound, and said so, before health says SERVING.
            let log = std::fs::read_to_string(&self.log)?;
            let announced = |message| log.lines().find_map(|line| json_log_addr(line, message));
            let admin = announced("serving /metrics, /healthz and /readyz");
            let mcp = announced("serving MCP over Streamable HTTP");
            let console = announced("serving the approvals console");
            Ok((addr, admin, mcp, console))
        });
        match serving {
            Ok((addr, admin, mcp, console)) => {
                let startup = Startup {
                    listening,
                    serving: self.spawned.elapsed(),
                };
                let binary = Binary {
                    child: self.child,
                    addr,
                    admin,
                    mcp,
                    console,
                    config: self.config,
                    log: self.log,
                };
                Ok((binary, startup))
            }
            Err(err) => {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                Err(err.context(format!("toolgate did not start; its log:\n{log}")))
            }
        }
    }
}

impl Binary {
    /// Its id; 0 once stopped.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// SIGTERM, then SIGKILL after 15 seconds.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.child.stop(Duration::from_secs(15))
    }
}

/// A child process that is killed if it is still running when dropped (an error on the way).
struct Process(Option<Child>);

impl Process {
    fn running(&mut self) -> anyhow::Result<&mut Child> {
        self.0.as_mut().context("the process was already stopped")
    }

    /// Its id; 0 once stopped.
    fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// SIGTERM, then SIGKILL after `grace` (see [`stop`]); nothing if already stopped.
    fn stop(&mut self, grace: Duration) -> anyhow::Result<()> {
        match self.0.take() {
            Some(child) => stop(child, grace),
            None => Ok(()),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How long one start took.
#[derive(Debug, Clone, Copy)]
pub struct Startup {
    /// Until the port accepted a TCP connection.
    pub listening: Duration,
    /// Until the health service answered SERVING.
    pub serving: Duration,
}

/// The address in toolgate's JSON log line `line` if its message is `message`.
fn json_log_addr(line: &str, message: &str) -> Option<SocketAddr> {
    let event: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = event.get("fields")?;
    if fields.get("message")?.as_str()? != message {
        return None;
    }
    fields.get("addr")?.as_str()?.parse().ok()
}

/// The address a child process says it listens on: reads its log every 200 µs until a line
/// `announced` recognises appears, the child exits, or `limit` passes.
fn announced_addr(
    child: &mut Child,
    log: &Path,
    limit: Duration,
    announced: impl Fn(&str) -> Option<SocketAddr>,
) -> anyhow::Result<SocketAddr> {
    let deadline = Instant::now() + limit;
    loop {
        let text =
            std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
        if let Some(addr) = text.lines().find_map(&announced) {
            return Ok(addr);
        }
        if let Some(status) = child.try_wait()? {
            bail!("the server exited before it said where it listens: {status}");
        }
        if Instant::now() > deadline {
            bail!("the server did not say where it listens within {limit:?}");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The bare echo as a process of its own.
pub struct BareProcess {
    child: Process,
    pub addr: SocketAddr,
}

impl BareProcess {
    /// Its id; 0 once stopped.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// SIGTERM, then SIGKILL after five seconds.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.child.stop(Duration::from_secs(5))
    }
}

/// The bare echo as a process of its own (this executable re-run as its `serve-bare-echo`), on
/// a port it chose itself; returns once it listens.
pub fn spawn_bare(log: &Path) -> anyhow::Result<BareProcess> {
    let mut child = Process(Some(
        Command::new(std::env::current_exe()?)
            .args([bare_echo::SUBCOMMAND, "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(log)?)
            .spawn()?,
    ));
    let bare_listening = |line: &str| line.strip_prefix(bare_echo::LISTENING)?.trim().parse().ok();
    // On an error the process is dropped, and with it killed.
    let addr = announced_addr(
        child.running()?,
        log,
        Duration::from_secs(10),
        bare_listening,
    )?;
    Ok(BareProcess { child, addr })
}

/// Polls a TCP connect every 200 µs until `addr` accepts, the child exits, or `limit` passes.
fn wait_listening(child: &mut Child, addr: SocketAddr, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("the server exited before listening on {addr}: {status}");
        }
        if Instant::now() > deadline {
            bail!("nothing listens on {addr} after {limit:?}");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Asks the standard health service until it says SERVING (bounded).
async fn health_serving(addr: SocketAddr) -> anyhow::Result<()> {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = String::new();
    while Instant::now() < deadline {
        match connect(addr).await {
            Ok(channel) => {
                let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
                match health.check(HealthCheckRequest::default()).await {
                    Ok(r) if r.get_ref().status == ServingStatus::Serving as i32 => return Ok(()),
                    Ok(r) => last = format!("status {}", r.get_ref().status),
                    Err(status) => last = status.to_string(),
                }
            }
            Err(err) => last = err.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    bail!("health never said SERVING: {last}")
}

/// SIGTERM, then SIGKILL if the process has not exited within `grace`.
fn stop(mut child: Child, grace: Duration) -> anyhow::Result<()> {
    let pid = libc::pid_t::try_from(child.id())?;
    // SAFETY: kill(2) with a pid we spawned and still own (not yet waited for).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill()?;
    child.wait()?;
    bail!("process {pid} ignored SIGTERM for {grace:?} and was killed")
}

/// A process's resident memory from /proc/PID/status, in KiB: VmRSS (= RssAnon + RssFile +
/// RssShmem), and the anonymous (heap, stacks) and file-backed (pages of the mapped executable,
/// shared with the page cache) parts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub file_kib: u64,
}

/// The memory of process `pid`, `None` when it cannot be read (the process is gone).
pub fn memory(pid: u32) -> Option<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
    };
    Some(Memory {
        rss_kib: field("VmRSS:")?,
        anon_kib: field("RssAnon:")?,
        file_kib: field("RssFile:")?,
    })
}

/// A `redis-server` of its own on loopback, nothing saved: the Redis row's state backend.
pub fn start_redis() -> anyhow::Result<RedisServer> {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        bail!(
            "the toolgate + Redis row needs redis-server on the PATH (Debian package redis-server)"
        );
    }
    Ok(RedisServer::start())
}

/// A loopback port for the harness's OTLP collector, bound now so that its endpoint (returned
/// beside it) is known before anything that exports to it starts.
pub fn reserve_collector() -> anyhow::Result<(std::net::TcpListener, String)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    Ok((listener, endpoint))
}

/// The admin endpoint's metrics text (a bare HTTP/1.1 GET, loopback only).
fn admin_metrics(admin: SocketAddr) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect_timeout(&admin, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// The value of an unlabelled sample (or the sum of a family's samples) in Prometheus text.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, value| sum + value)
}

/// Waits (10 s at most) until the shadow binary has loaded its candidate.
pub fn wait_shadow_loaded(admin: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = admin_metrics(admin).unwrap_or_default();
        if sample(&text, "toolgate_shadow_catalog_loads_total{result=\"ok\"}") >= 1.0 {
            return Ok(());
        }
        if sample(
            &text,
            "toolgate_shadow_catalog_loads_total{result=\"refused\"}",
        ) >= 1.0
        {
            bail!("the shadow binary refused its candidate catalog");
        }
        if Instant::now() > deadline {
            bail!("the shadow binary did not load its candidate within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// (calls compared, calls skipped because the queue was full, differences) so far.
pub fn shadow_counts(admin: SocketAddr) -> anyhow::Result<(f64, f64, f64)> {
    let text = admin_metrics(admin)?;
    Ok((
        sample(&text, "toolgate_shadow_compared_total"),
        sample(&text, "toolgate_shadow_skipped_total"),
        sample(&text, "toolgate_shadow_differences_total"),
    ))
}

/// The 1, 5 and 15 minute load averages, as /proc/loadavg says.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// How often each of `pid`'s threads woke up while nothing was asked of it, per second, over
/// `window`: voluntary context switches by thread name (`switches_by_thread`). A thread that
/// wakes on a timer with nothing to do costs every pod CPU for as long as it runs.
pub fn idle_wakeups(pid: u32, window: Duration) -> Option<BTreeMap<String, f64>> {
    let before = switches_by_thread(pid)?;
    let started = Instant::now();
    std::thread::sleep(window);
    let after = switches_by_thread(pid)?;
    let seconds = started.elapsed().as_secs_f64();
    Some(
        after
            .into_iter()
            .map(|(name, (voluntary, _))| {
                let was = before.get(&name).map_or(0, |(v, _)| *v);
                (name, voluntary.saturating_sub(was) as f64 / seconds)
            })
            .collect(),
    )
}

/// Context switches (voluntary, involuntary) of every thread of a process so far, from
/// `/proc/PID/task/*/status`, summed per thread name (`Name:`; tokio's workers share one): each
/// voluntary one is a thread going to sleep to wait (for work, a lock, I/O), so per call they
/// count the wake-ups and hand-offs a call costs, and which threads a call wakes — its thread
/// hops.
pub fn switches_by_thread(pid: u32) -> Option<BTreeMap<String, (u64, u64)>> {
    let mut by_name: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(status) = std::fs::read_to_string(task.ok()?.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        let mut name = String::new();
        let mut counts = (0, 0);
        for line in status.lines() {
            let field = |key: &str| {
                line.strip_prefix(key)
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            if let Some(n) = line.strip_prefix("Name:") {
                name = n.trim().to_owned();
            } else if let Some(n) = field("voluntary_ctxt_switches:") {
                counts.0 = n;
            } else if let Some(n) = field("nonvoluntary_ctxt_switches:") {
                counts.1 = n;
            }
        }
        let entry = by_name.entry(name).or_default();
        entry.0 += counts.0;
        entry.1 += counts.1;
    }
    Some(by_name)
}

/// CPU time (user + system) a process has used so far, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}
