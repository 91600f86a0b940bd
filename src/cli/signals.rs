//! The signal dispositions the command line sets at start-up, and the only unsafe code in the
//! CLI: `libc::signal` has no safe counterpart in std.

/// Printing verbs end quietly when their reader goes away (`toolgate tools | head`), like other
/// Unix tools. The server keeps Rust's default of ignoring SIGPIPE: a closed audit pipe must be
/// an error it handles, not its death. Called before any thread is started.
pub(super) fn default_sigpipe() {
    // SAFETY: restoring a signal's default disposition before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A file-size limit (RLIMIT_FSIZE) must make an audit write fail, to be retried from the first
/// byte not written, not kill the sidecar with SIGXFSZ. Called before any thread writes files.
pub(super) fn ignore_sigxfsz() {
    // SAFETY: setting a signal's disposition to ignore, before any thread writes files.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}
