//! A stdio MCP server: its process (started in its own process group with a cleared
//! environment, ended with everything it started), and [`LineGuard`], the framing that passes
//! its output on one JSON-RPC line at a time and answers a line over the size limit instead of
//! buffering it.

use std::{
    collections::BTreeMap,
    path::Path,
    pin::Pin,
    task::{Context, Poll},
};

use rmcp::{ServiceExt, model::ServerJsonRpcMessage, transport::async_rw::AsyncRwTransport};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, ReadBuf};

use super::{
    McpServerConfig, Slot,
    errors::oversized_error,
    scan::IdScanner,
    set,
    supervisor::{Connection, ListChanged},
};
use crate::{executor::process::descendants, tasks::Tasks};

/// A stdio server's process.
pub(super) struct StdioProcess {
    child: tokio::process::Child,
    started: Option<descendants::Started>,
}

impl Drop for StdioProcess {
    fn drop(&mut self) {
        if let Some(started) = self.started.take() {
            // Killed with everything it started; its own exit is collected by tokio (the
            // child's handle goes to tokio's orphan queue with `self.child`).
            descendants::end(started);
        }
        let _ = self.child.start_kill();
    }
}

/// Starts the server's program and speaks MCP over its stdin and stdout; its stderr is drained
/// into debug logs.
pub(super) async fn connect(
    config: &McpServerConfig,
    program: &Path,
    args: &[String],
    env: &BTreeMap<String, String>,
    slot: &Slot,
    handler: ListChanged,
    tasks: &Tasks,
) -> Result<Connection, String> {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(env)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let (mut child, started) = descendants::spawn(&mut command)
        .map_err(|err| format!("cannot start {}: {err}", program.display()))?;
    set(&slot.pid, child.id());
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err("the server's process has no pipes".into());
    };
    let process = StdioProcess {
        child,
        started: Some(started),
    };
    // Keep the pipe drained; the server's own log lines are debug output here.
    let server = config.name.clone();
    tasks.spawn("mcp-stderr", async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::debug!(server = %server, line = %line, "MCP server stderr");
        }
    });
    let reader = LineGuard::new(stdout, config.max_message_bytes, config.name.clone());
    // The guard enforces the limit; rmcp's own (16 MiB) would drop a line silently.
    let transport = AsyncRwTransport::new(reader, stdin).with_max_line_length(usize::MAX);
    let service = handler
        .serve(transport)
        .await
        .map_err(|err| err.to_string())?;
    Ok(Connection {
        service,
        _process: Some(process),
    })
}

/// Reads a stdio server's output and passes on whole lines (one JSON-RPC message each) of at
/// most `limit` bytes. A longer line is not kept: it is cut off (rmcp then ignores the fragment
/// as unparsable), read to its end while [`IdScanner`] looks for its top-level `id`, and replaced
/// by an error response to that id, so the call it answered ends at once.
pub struct LineGuard<R> {
    inner: R,
    limit: usize,
    server: String,
    /// Bytes of the current line passed on so far.
    line_len: usize,
    /// The current line is over the limit and is being skipped.
    skipping: bool,
    scanner: IdScanner,
    /// Bytes to hand out before reading more (a cut-off line's end, an error response).
    pending: Vec<u8>,
    scratch: Box<[u8]>,
    eof: bool,
}

impl<R> LineGuard<R> {
    pub fn new(inner: R, limit: usize, server: String) -> Self {
        LineGuard {
            inner,
            limit,
            server,
            line_len: 0,
            skipping: false,
            scanner: IdScanner::default(),
            pending: Vec::new(),
            scratch: vec![0; 16 * 1024].into_boxed_slice(),
            eof: false,
        }
    }

    /// Processes `n` bytes of `scratch`, appending what passes to `out`.
    fn process(&mut self, n: usize, out: &mut ReadBuf<'_>) {
        let mut at = 0;
        while at < n {
            let chunk = &self.scratch[at..n];
            let line_end = chunk.iter().position(|b| *b == b'\n');
            let take = line_end.map_or(chunk.len(), |i| i + 1);
            let piece = &chunk[..take];
            self.scanner.feed(piece);
            if !self.skipping && self.line_len + take > self.limit {
                self.skipping = true;
                // End the fragment rmcp has buffered so far; it is discarded as unparsable.
                if self.line_len > 0 {
                    self.pending.push(b'\n');
                }
            }
            if !self.skipping {
                // Behind anything pending, so the order of what rmcp reads is kept.
                if self.pending.is_empty() {
                    out.put_slice(piece);
                } else {
                    self.pending.extend_from_slice(piece);
                }
                self.line_len += take;
            }
            if line_end.is_some() {
                if self.skipping {
                    self.answer_oversized();
                }
                self.line_len = 0;
                self.skipping = false;
                self.scanner = IdScanner::default();
            }
            at += take;
        }
    }

    fn answer_oversized(&mut self) {
        match self.scanner.response_id() {
            Some(id) => {
                tracing::warn!(server = %self.server, limit = self.limit, "an MCP server's response was over its size limit; its call ends as output_too_large");
                let answer = ServerJsonRpcMessage::error(oversized_error(self.limit), Some(id));
                if let Ok(mut line) = serde_json::to_vec(&answer) {
                    line.push(b'\n');
                    self.pending.extend_from_slice(&line);
                }
            }
            None => {
                tracing::warn!(server = %self.server, limit = self.limit, "dropped an MCP server message over its size limit")
            }
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineGuard<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(out.remaining());
                out.put_slice(&this.pending[..n]);
                this.pending.drain(..n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            // Never read more than fits: passed bytes go straight to `out`.
            let want = out.remaining().min(this.scratch.len());
            if want == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut this.scratch[..want]);
            match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Ready(Ok(())) => {}
            }
            let n = buf.filled().len();
            if n == 0 {
                this.eof = true;
                continue;
            }
            let before = out.filled().len();
            this.process(n, out);
            if out.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
            // Everything read was skipped (or is pending): go on.
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::executor::mcp::errors::OVERSIZED_CODE;

    #[tokio::test]
    async fn the_line_guard_passes_small_lines_and_answers_big_ones() {
        use tokio::io::AsyncReadExt;
        let big = format!(
            "{{\"result\":{{\"text\":\"{}\"}},\"jsonrpc\":\"2.0\",\"id\":3}}\n",
            "x".repeat(100_000)
        );
        let input = format!("{{\"id\":1,\"result\":{{}}}}\n{big}{{\"id\":2,\"result\":{{}}}}\n");
        let mut guard = LineGuard::new(input.as_bytes(), 1000, "s".into());
        let mut out = String::new();
        guard.read_to_string(&mut out).await.unwrap();
        let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines[0], r#"{"id":1,"result":{}}"#);
        // The cut-off fragment, which the JSON parser ignores, then the answer for id 3.
        assert!(lines[1].len() <= 1000 && serde_json::from_str::<Value>(lines[1]).is_err());
        let answer: Value = serde_json::from_str(lines[2]).unwrap();
        assert_eq!(answer["id"], 3);
        assert_eq!(answer["error"]["code"], OVERSIZED_CODE);
        assert_eq!(answer["error"]["data"]["limit"], 1000);
        assert_eq!(lines[3], r#"{"id":2,"result":{}}"#);
        assert_eq!(lines.len(), 4);
    }
}
