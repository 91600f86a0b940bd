//! The `process` backend: run a configured program — no shell — with the bound arguments as JSON
//! on stdin; stdout is the output. The environment is cleared except for an allow-list, and when
//! the call ends early (timeout, client cancel, oversized output) the program and every process
//! it started are killed — including descendants that left its process group or session
//! ([`descendants`]); what a program that exited leaves behind is killed too. stdout and stderr
//! are capped.

pub mod descendants;

use std::process::Stdio;

use futures::{FutureExt, future::BoxFuture};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{ExecError, Executor};
use crate::{
    boundary::Permit,
    catalog::{BackendSpec, ProcessSpec},
};

/// Ends the program and everything it started unless the program has been collected: runs on
/// every early exit (timeout, cancel, oversized output, an error).
struct Ending {
    started: Option<descendants::Started>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        if let Some(started) = self.started.take() {
            // The kills are synchronous: the call's future is being dropped, so this is the last
            // chance.
            descendants::end(started);
        }
    }
}

/// Runs `process` tools.
#[derive(Debug, Default)]
pub struct ProcessExecutor;

impl ProcessExecutor {
    async fn run(
        &self,
        tool: &ProcessSpec,
        permit: &Permit,
        max_output: usize,
    ) -> Result<String, ExecError> {
        let input = serde_json::to_vec(permit.arguments())
            .map_err(|err| ExecError::failed(format!("cannot encode arguments: {err}")))?;
        if !tokio::fs::metadata(&tool.working_dir)
            .await
            .is_ok_and(|m| m.is_dir())
        {
            tracing::error!(tool = %permit.tool().name, working_dir = %tool.working_dir.display(), at = %tool.at, "the process tool's working directory is not a directory");
            return Err(ExecError::Misconfigured(
                "the tool is misconfigured: its working directory does not exist; an operator must fix the catalog".into(),
            ));
        }
        let mut command = tokio::process::Command::new(&tool.command);
        command
            .args(&tool.args)
            .env_clear()
            .envs(&tool.env)
            .current_dir(&tool.working_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (mut child, started) = descendants::spawn(&mut command).map_err(|err| {
            tracing::error!(tool = %permit.tool().name, command = %tool.command.display(), at = %tool.at, error = %err, "cannot start the process tool's program");
            spawn_error(&err)
        })?;
        let mut ending = Ending {
            started: Some(started),
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
            // Dropping `ending` kills the program, which also stops a writer blocked on the pipe.
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
        // Collected: its pid may be reused from now on, so never signal it again. What it left
        // behind (its group, and orphans now re-parented to the sidecar) is killed instead.
        if let Some(started) = ending.started.take() {
            // SAFETY: killpg only sends a signal; a stale group id fails with ESRCH, harmlessly.
            unsafe {
                libc::killpg(started.pid(), libc::SIGKILL);
            }
            drop(started);
            descendants::sweep_in_background();
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

/// A program that cannot be started: a configuration mistake (missing, not executable), or a
/// transient shortage (processes, memory, descriptors) worth retrying. Nothing was started.
fn spawn_error(err: &std::io::Error) -> ExecError {
    use std::io::ErrorKind;
    match err.kind() {
        ErrorKind::NotFound | ErrorKind::PermissionDenied => ExecError::Misconfigured(
            "the tool is misconfigured: its program is missing or not executable; an operator must fix the catalog".into(),
        ),
        _ if err.raw_os_error() == Some(libc::ENOEXEC) => ExecError::Misconfigured(
            "the tool is misconfigured: its program is not an executable this machine can run; an operator must fix the catalog".into(),
        ),
        _ => ExecError::NotReached(format!(
            "the tool's program could not be started now ({}); retry later",
            err.kind()
        )),
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
            match &permit.tool().backend {
                BackendSpec::Process(tool) => {
                    self.run(tool, permit, permit.tool().max_output_bytes).await
                }
                _ => Err(ExecError::failed("not a process tool")),
            }
        }
        .boxed()
    }
}
