//! Where configured things are: a URL an HTTP request can carry, a program this machine can run.
//! Checked once, at load, by every part of the config that names one.

use std::path::{Path, PathBuf};

use url::Url;

use super::{FieldError, resolve_path};

/// Checks a configured URL once, at load: http or https, a host, no credentials, a port other
/// than 0, and text an HTTP request can carry (some hosts the URL parser accepts, such as
/// `ex{ample.com`, no request can).
pub fn check_url(url: &Url, at: &str) -> Result<(), FieldError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(FieldError::new(at, "must be an http or https URL"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(FieldError::new(at, "the URL has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(FieldError::new(
            at,
            "credentials in the URL are not allowed; use headers from a secret",
        ));
    }
    if url.port() == Some(0) {
        return Err(FieldError::new(at, "port 0 cannot be connected to"));
    }
    url.as_str().parse::<http::Uri>().map_err(|err| {
        FieldError::new(
            at,
            format!(
                "{:?} cannot be sent in an HTTP request ({err})",
                url.as_str()
            ),
        )
    })?;
    Ok(())
}

/// A URL secrets or keys are sent to or read from (an issuer's keys, a token endpoint): as
/// [`check_url`], and `https` unless its host is a loopback address, so a key set or a token
/// cannot be read or replaced on the way.
pub fn check_secure_url(text: &str, at: &str) -> Result<Url, FieldError> {
    let url = Url::parse(text)
        .map_err(|err| FieldError::new(at, format!("invalid URL {text:?}: {err}")))?;
    check_url(&url, at)?;
    if url.scheme() != "https" && !is_loopback_host(&url) {
        return Err(FieldError::new(
            at,
            "must be an https URL (http is accepted only on a loopback address)",
        ));
    }
    Ok(url)
}

/// Whether the URL's host is a loopback IP address or `localhost`.
pub fn is_loopback_host(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => super::is_loopback(ip.into()),
        Some(url::Host::Ipv6(ip)) => super::is_loopback(ip.into()),
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// The program to run: a relative path with a slash is relative to the catalog's directory, a
/// bare name is looked up on `search` (a PATH value).
pub fn program_path(command: &str, base_dir: &Path, search: Option<&str>) -> PathBuf {
    if command.contains('/') {
        return resolve_path(base_dir, command);
    }
    search
        .into_iter()
        .flat_map(|path| path.split(':'))
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(command))
        .find(|candidate| runnable(candidate).is_ok())
        .unwrap_or_else(|| PathBuf::from(command))
}

/// Why a program cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum NotRunnable {
    /// A bare name that no directory of the PATH holds.
    #[error("program {} is not on the PATH", .0.display())]
    NotOnPath(PathBuf),
    /// The file cannot be looked at (missing, or a directory on the way cannot be read).
    #[error("program {} cannot be used: {source}", .program.display())]
    Unusable {
        program: PathBuf,
        source: std::io::Error,
    },
    /// Not a file, or not one this process may execute.
    #[error("program {} is not an executable file", .0.display())]
    NotExecutable(PathBuf),
}

/// Whether `program` is an executable file, or why not.
pub fn runnable(program: &Path) -> Result<(), NotRunnable> {
    use std::os::unix::{ffi::OsStrExt, fs::PermissionsExt};
    if program.components().count() == 1 && !program.is_absolute() {
        return Err(NotRunnable::NotOnPath(program.to_owned()));
    }
    let metadata = std::fs::metadata(program).map_err(|source| NotRunnable::Unusable {
        program: program.to_owned(),
        source,
    })?;
    let executable = std::ffi::CString::new(program.as_os_str().as_bytes())
        // SAFETY: access only reads the path.
        .map(|path| unsafe { libc::access(path.as_ptr(), libc::X_OK) } == 0)
        .unwrap_or(false);
    if !metadata.is_file() || metadata.permissions().mode() & 0o111 == 0 || !executable {
        return Err(NotRunnable::NotExecutable(program.to_owned()));
    }
    Ok(())
}
