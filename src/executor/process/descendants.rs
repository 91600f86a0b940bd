//! Keeping track of everything the sidecar's programs start, so nothing outlives its call.
//!
//! A process group is not enough: a descendant that calls `setsid()` (a daemon detaching) leaves
//! the group and, once its parent exits, is adopted by init. So:
//! - the sidecar is a child subreaper (`PR_SET_CHILD_SUBREAPER`): orphans of its descendants are
//!   re-parented to it instead of to init;
//! - each program it starts is a subreaper too (set between fork and exec; it survives exec), so
//!   while the program runs, every descendant stays in its subtree;
//! - each program's environment carries [`MARKER`] with the sidecar's pid; descendants inherit it.
//!
//! A call that ends early (timeout, cancel, oversized output) [`end`]s the program: it is
//! stopped, everything below it in `/proc` is killed, then the program itself. A program that
//! exits leaves its orphans with the sidecar; a [`sweep`] kills every marked child of the
//! sidecar that is not a program still running. Killed processes are collected through pidfds
//! ([`reap`]), which name exactly the process that was killed, never a later one with the same
//! pid. Linux only; elsewhere only the process group is killed.

use std::{collections::BTreeSet, io, sync::Mutex, time::Duration};

/// Set in the environment of every program the sidecar starts, to the sidecar's pid.
pub const MARKER: &str = "TOOLGATE_SIDECAR_PID";

/// Programs started and not yet collected: children of the sidecar that are not leftovers.
static RUNNING: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// How many times a subtree is scanned and killed before giving up on a fork loop.
const MAX_ROUNDS: usize = 32;

fn running() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    RUNNING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A started program; it counts as running (not a leftover) until this is dropped.
#[derive(Debug)]
pub struct Started {
    pid: i32,
}

impl Started {
    pub fn pid(&self) -> i32 {
        self.pid
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        running().remove(&self.pid);
    }
}

/// Makes the sidecar adopt the orphans of its descendants (once per process).
pub fn adopt_orphans() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: prctl with these arguments only sets a flag on the calling process.
            if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
                tracing::warn!(error = %io::Error::last_os_error(), "cannot become a child subreaper; detached descendants of process tools may outlive their calls");
            }
        }
    });
}

/// Starts `command` as a marked subreaper, in a process group of its own, and registers it.
pub fn spawn(
    command: &mut tokio::process::Command,
) -> io::Result<(tokio::process::Child, Started)> {
    adopt_orphans();
    command
        .env(MARKER, std::process::id().to_string())
        .process_group(0);
    #[cfg(target_os = "linux")]
    // SAFETY: the closure runs between fork and exec and only makes one async-signal-safe
    // system call.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Registered under the lock it is spawned under, so a concurrent sweep never mistakes a
    // program that just started for a leftover.
    let mut running = running();
    let child = command.spawn()?;
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| io::Error::other("the started program has no pid"))?;
    running.insert(pid);
    Ok((child, Started { pid }))
}

/// A killed process, to be collected once it has exited.
#[derive(Debug)]
pub struct Victim {
    pid: i32,
    #[cfg(target_os = "linux")]
    fd: Option<std::os::fd::OwnedFd>,
    /// Wait for its exit (its children are re-parented then) but leave collecting it to its
    /// owner: the program itself belongs to tokio.
    collect: bool,
}

/// Ends a program that has not been collected, with everything it started: killed at once (the
/// caller's future may be going away), then leftovers swept and all of it collected on a
/// blocking thread.
pub fn end(started: Started) {
    let victims = terminate(started.pid());
    drop(started);
    in_background(victims);
}

/// Sweeps and collects on a blocking thread: after a program was collected, what it left.
pub fn sweep_in_background() {
    in_background(Vec::new());
}

fn in_background(mut victims: Vec<Victim>) {
    let work = move || {
        victims.extend(sweep());
        reap(victims, Duration::from_secs(10));
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn_blocking(work);
        }
        // No runtime (shutting down): the kills are done; leftovers die with the sidecar.
        Err(_) => drop(work),
    }
}

/// Stops `root`, kills everything below it and then `root` itself (and its process group).
/// Reads `/proc` (kernel memory, not disk). Returns what to [`reap`].
pub fn terminate(root: i32) -> Vec<Victim> {
    let mut victims = Vec::new();
    #[cfg(target_os = "linux")]
    {
        let root_victim = Victim::open(root, false);
        // Stopped, it can neither start nor collect children while its subtree is killed.
        root_victim.signal(libc::SIGSTOP);
        kill_below(&[root], &mut victims);
        root_victim.signal(libc::SIGKILL);
        victims.push(root_victim);
    }
    // SAFETY: killpg only sends a signal; a stale group id fails with ESRCH, harmlessly.
    unsafe {
        libc::killpg(root, libc::SIGKILL);
    }
    victims
}

/// Kills the sidecar's marked children that are not running programs — what programs that
/// exited left behind — with everything below them. Returns what to [`reap`].
pub fn sweep() -> Vec<Victim> {
    let mut victims = Vec::new();
    #[cfg(target_os = "linux")]
    {
        let me = std::process::id().to_string();
        for _ in 0..MAX_ROUNDS {
            // Leftovers are chosen and pinned (pidfd) under the lock programs start under.
            let found: Vec<Victim> = {
                let running = running();
                direct_children()
                    .into_iter()
                    .filter(|p| !p.zombie && !running.contains(&p.pid))
                    .filter(|p| marker_of(p.pid).as_deref() == Some(me.as_str()))
                    .map(|p| Victim::open(p.pid, true))
                    .collect()
            };
            if found.is_empty() {
                break;
            }
            let roots: Vec<i32> = found.iter().map(|v| v.pid).collect();
            for victim in &found {
                victim.signal(libc::SIGSTOP);
            }
            kill_below(&roots, &mut victims);
            for victim in found {
                victim.signal(libc::SIGKILL);
                victims.push(victim);
            }
        }
    }
    victims
}

/// Waits (at most `within`) for the victims to exit, then collects those that are now the
/// sidecar's children. Blocking: run it on a blocking thread.
pub fn reap(victims: Vec<Victim>, within: Duration) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let deadline = std::time::Instant::now() + within;
        let mut waiting: Vec<&Victim> = victims.iter().filter(|v| v.fd.is_some()).collect();
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    processes = waiting.len(),
                    "killed processes did not exit in time"
                );
                break;
            }
            let mut polls: Vec<libc::pollfd> = waiting
                .iter()
                .filter_map(|v| v.fd.as_ref())
                .map(|fd| libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let millis = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: `polls` is a valid array of pollfd for the duration of the call.
            let ready =
                unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, millis) };
            if ready < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                break;
            }
            let mut exited = polls.iter().map(|p| p.revents != 0);
            waiting.retain(|_| !exited.next().unwrap_or(false));
        }
        for victim in victims.iter().filter(|v| v.collect) {
            if let Some(fd) = &victim.fd {
                // SAFETY: an all-zero siginfo_t is a valid out-parameter for waitid.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                // Not our child (collected by its own parent before it died): ECHILD, ignored.
                // SAFETY: waitid writes only into `info`.
                unsafe {
                    libc::waitid(
                        libc::P_PIDFD,
                        fd.as_raw_fd() as libc::id_t,
                        &mut info,
                        libc::WEXITED | libc::WNOHANG,
                    );
                }
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (victims, within);
}

/// Collects zombie children of the sidecar that no code of it waits for: orphans that exited
/// on their own. For the server process only, where every child the sidecar starts is
/// registered (an embedding program's own children would be taken from it).
pub async fn collect_orphans() {
    #[cfg(target_os = "linux")]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut children) = signal(SignalKind::child()) else {
            tracing::warn!("cannot watch SIGCHLD; exited orphans are not collected");
            return;
        };
        while children.recv().await.is_some() {
            let zombies: Vec<i32> = tokio::task::spawn_blocking(move || {
                let running = running();
                direct_children()
                    .into_iter()
                    .filter(|p| p.zombie && !running.contains(&p.pid))
                    .map(|p| p.pid)
                    .collect()
            })
            .await
            .unwrap_or_default();
            for pid in zombies {
                // SAFETY: WNOHANG on a zombie child returns at once.
                unsafe {
                    libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
                }
            }
        }
    }
}

#[cfg(target_os = "linux")]
impl Victim {
    fn open(pid: i32, collect: bool) -> Self {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0).map(|fd| {
            // SAFETY: the descriptor was just returned to us and is owned by nothing else.
            unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
        });
        Victim { pid, fd, collect }
    }

    /// Signals exactly this process (through its pidfd when there is one).
    fn signal(&self, signal: libc::c_int) {
        use std::os::fd::AsRawFd;
        match &self.fd {
            // SAFETY: pidfd_send_signal only sends a signal to the pidfd's process.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    signal,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            },
            // SAFETY: kill only sends a signal.
            None => unsafe {
                libc::kill(self.pid, signal);
            },
        }
    }
}

/// Kills every process below `roots` (not the roots), scanning again until none is left, so
/// children forked meanwhile are found too.
#[cfg(target_os = "linux")]
fn kill_below(roots: &[i32], victims: &mut Vec<Victim>) {
    let mut seen: BTreeSet<i32> = roots.iter().copied().collect();
    for _ in 0..MAX_ROUNDS {
        let table = processes();
        let mut below: BTreeSet<i32> = roots.iter().copied().collect();
        // Parents before children is not guaranteed in /proc order: grow until stable.
        loop {
            let before = below.len();
            let children: Vec<i32> = table
                .iter()
                .filter(|p| below.contains(&p.ppid))
                .map(|p| p.pid)
                .collect();
            below.extend(children);
            if below.len() == before {
                break;
            }
        }
        let fresh: Vec<i32> = below.into_iter().filter(|p| !seen.contains(p)).collect();
        if fresh.is_empty() {
            return;
        }
        for pid in fresh {
            seen.insert(pid);
            let victim = Victim::open(pid, true);
            victim.signal(libc::SIGKILL);
            victims.push(victim);
        }
    }
    tracing::warn!(
        roots = ?roots,
        "descendants kept starting processes while being killed; some may remain"
    );
}

/// One line of `/proc/<pid>/stat`: what the tree walk needs.
#[cfg(target_os = "linux")]
struct Process {
    pid: i32,
    ppid: i32,
    zombie: bool,
}

/// Every process visible in `/proc`.
#[cfg(target_os = "linux")]
fn processes() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .collect()
}

/// One process's `/proc/<pid>/stat`, if it still exists.
#[cfg(target_os = "linux")]
fn stat(pid: i32) -> Option<Process> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself contain ") ".
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(Process {
        pid,
        ppid,
        zombie: state == "Z" || state == "X",
    })
}

/// The sidecar's own children, from the per-thread `children` lists (cheap), or else from a scan
/// of every process.
#[cfg(target_os = "linux")]
fn direct_children() -> Vec<Process> {
    let own = i32::try_from(std::process::id()).unwrap_or(0);
    let listed: Option<Vec<i32>> = std::fs::read_dir("/proc/self/task").ok().and_then(|tasks| {
        let mut pids = Vec::new();
        let mut any = false;
        for task in tasks.filter_map(Result::ok) {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                any = true;
                pids.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
        any.then_some(pids)
    });
    match listed {
        Some(pids) => pids
            .into_iter()
            .filter_map(|pid| stat(pid).filter(|p| p.ppid == own))
            .collect(),
        None => processes().into_iter().filter(|p| p.ppid == own).collect(),
    }
}

/// The marker value in a process's environment (as it was when the process started).
#[cfg(target_os = "linux")]
fn marker_of(pid: i32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{MARKER}=");
    environ
        .split(|b| *b == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|value| String::from_utf8_lossy(value).into_owned())
}
