//! The `process` backend: run a configured program — no shell — with the bound arguments as JSON
//! on stdin; stdout is the output. The environment is cleared except for an allow-list, the
//! program runs in its own process group, and when the call ends early (timeout, client cancel,
//! oversized output) the whole group is killed. stdout and stderr are capped.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
};

use futures::{FutureExt, future::BoxFuture};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{ExecError, Executor};
use crate::{
    boundary::Permit,
    config::{Env, FieldError, raw::RawProcessExecutor, resolve_path},
};

/// A configured process tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessTool {
    pub command: PathBuf,
    pub args: Vec<String>,
    /// The program's whole environment, resolved at load.
    pub env: BTreeMap<String, String>,
    pub working_dir: PathBuf,
    pub max_stderr_bytes: usize,
}

impl ProcessTool {
    pub fn build(
        raw: &RawProcessExecutor,
        at: &str,
        base_dir: &Path,
        env: &Env,
    ) -> Result<Self, FieldError> {
        if raw.command.trim().is_empty() {
            return Err(FieldError::new(
                format!("{at}.command"),
                "must not be blank",
            ));
        }
        let mut program_env = BTreeMap::new();
        for name in &raw.env {
            if let Some(value) = env.get(name) {
                program_env.insert(name.clone(), value.to_owned());
            }
        }
        program_env.extend(raw.set_env.clone());
        let working_dir = raw
            .working_dir
            .as_deref()
            .map(|dir| resolve_path(base_dir, dir))
            .unwrap_or_else(|| base_dir.to_path_buf());
        // A relative command with a slash is relative to the catalog file, like other paths.
        let command = if raw.command.contains('/') {
            resolve_path(base_dir, &raw.command)
        } else {
            PathBuf::from(&raw.command)
        };
        Ok(ProcessTool {
            command,
            args: raw.args.clone(),
            env: program_env,
            working_dir,
            max_stderr_bytes: raw.max_stderr_bytes.unwrap_or(2048),
        })
    }
}

/// Kills the process group unless the program has been reaped: runs on every early exit.
struct GroupGuard {
    pgid: Option<i32>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            // SAFETY: killpg only sends a signal; a stale group id fails with ESRCH, harmlessly.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

/// Runs `process` tools.
#[derive(Debug, Default)]
pub struct ProcessExecutor;

impl ProcessExecutor {
    async fn run(
        &self,
        tool: &ProcessTool,
        permit: &Permit,
        max_output: usize,
    ) -> Result<String, ExecError> {
        let input = serde_json::to_vec(permit.arguments())
            .map_err(|err| ExecError::failed(format!("cannot encode arguments: {err}")))?;
        let mut child = tokio::process::Command::new(&tool.command)
            .args(&tool.args)
            .env_clear()
            .envs(&tool.env)
            .current_dir(&tool.working_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| {
                tracing::error!(command = %tool.command.display(), error = %err, "cannot start process tool");
                ExecError::Misconfigured(format!("the tool's program could not be started ({})", err.kind()))
            })?;
        let mut guard = GroupGuard {
            pgid: child.id().and_then(|id| i32::try_from(id).ok()),
        };
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ExecError::failed("the tool's program has no pipes"));
        };
        let feed = async move {
            // A program that exits without reading its input is not an error here.
            let _ = stdin.write_all(&input).await;
            drop(stdin);
        };
        // stderr is drained alongside stdout so the program never blocks on it, but an oversized
        // stdout must not wait for stderr's end: a descendant may hold stderr open for as long
        // as it lives.
        let stderr_read = read_capped(stderr, tool.max_stderr_bytes, PastCap::Drain);
        tokio::pin!(stderr_read);
        let mut stderr_done = None;
        let out = {
            let out_read =
                async { tokio::join!(feed, read_capped(stdout, max_output, PastCap::Stop)).1 };
            tokio::pin!(out_read);
            loop {
                tokio::select! {
                    out = &mut out_read => break out,
                    err = &mut stderr_read, if stderr_done.is_none() => stderr_done = Some(err),
                }
            }
        };
        let (out, out_overflow) =
            out.map_err(|e| ExecError::failed(format!("cannot read the tool's output: {e}")))?;
        if out_overflow {
            // Dropping the guard kills the group, which also stops a writer blocked on the pipe.
            return Err(ExecError::OutputTooLarge(format!(
                "the tool's output exceeded {max_output} bytes"
            )));
        }
        let (err, _) = match stderr_done {
            Some(done) => done,
            None => stderr_read.await,
        }
        .unwrap_or_default();
        let status = child
            .wait()
            .await
            .map_err(|e| ExecError::failed(format!("cannot wait for the tool: {e}")))?;
        // Reaped: the group id may be reused from now on, so never signal it again. Descendants
        // the program left behind are still killed through the group.
        if let Some(pgid) = guard.pgid.take() {
            // SAFETY: as above.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
        if !status.success() {
            let code = status
                .code()
                .map_or_else(|| "a signal".to_owned(), |c| format!("status {c}"));
            let stderr = String::from_utf8_lossy(&err);
            let stderr = stderr.trim();
            return Err(ExecError::failed_with(
                format!("the tool exited with {code}"),
                stderr,
            ));
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// What to do with bytes past the cap.
#[derive(Clone, Copy)]
enum PastCap {
    /// Stop reading: closing the pipe tells the program (SIGPIPE) that nobody listens.
    Stop,
    /// Keep reading and discard, so the program never blocks on a full pipe.
    Drain,
}

/// Reads up to `cap` bytes; reports whether more was written.
async fn read_capped(
    mut reader: impl AsyncRead + Unpin,
    cap: usize,
    past_cap: PastCap,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut overflow = false;
    let mut buffer = [0u8; 8192];
    loop {
        let n = reader.read(&mut buffer).await?;
        if n == 0 {
            return Ok((kept, overflow));
        }
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..n.min(room)]);
        if n > room {
            overflow = true;
            if let PastCap::Stop = past_cap {
                return Ok((kept, true));
            }
        }
    }
}

impl Executor for ProcessExecutor {
    fn execute<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, Result<String, ExecError>> {
        async move {
            match &permit.tool().executor {
                super::ExecutorSpec::Process(tool) => {
                    self.run(tool, permit, permit.tool().max_output_bytes).await
                }
                _ => Err(ExecError::failed("not a process tool")),
            }
        }
        .boxed()
    }
}
