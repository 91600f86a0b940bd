//! A validated `mcp_servers` entry: how to reach the server (a stdio command or a Streamable
//! HTTP URL with its address policy), its tool-name prefix, start-up timeout and message limit,
//! and which of its tools the catalog exposes. Nothing here connects.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use url::Url;

use crate::{
    credentials::CredentialSpec,
    outbound::Destination,
    settings::{
        Env, FieldError, check_url, parse_duration, program_path, raw::RawMcpServer, runnable,
    },
};

/// How to reach a server.
#[derive(Debug, Clone)]
pub enum Transport {
    Stdio {
        program: PathBuf,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
    Http {
        url: Url,
        destination: Destination,
    },
}

/// A validated MCP server entry.
#[derive(Debug, Clone)]
pub struct McpServerConfig {
    pub name: String,
    pub transport: Transport,
    pub prefix: String,
    pub startup_timeout: Duration,
    /// For a URL server: how each call (and the session) authenticates, if it does.
    pub credentials: Option<CredentialSpec>,
    /// The largest single message accepted from the server.
    pub max_message_bytes: usize,
    /// The server-side names of the tools the catalog exposes.
    pub tools: BTreeSet<String>,
}

/// The default largest message from an MCP server: room for a tool output of the default
/// `max_output_bytes` (1 MiB) several times over, JSON escaping and structured content included.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

impl McpServerConfig {
    /// Validates every server; prefixes must be unique, so tool names cannot clash between
    /// servers whatever they list.
    pub fn build_all(
        raw: &BTreeMap<String, RawMcpServer>,
        base_dir: &Path,
        env: &Env,
    ) -> Result<Vec<Self>, FieldError> {
        let mut by_prefix: BTreeMap<String, String> = BTreeMap::new();
        raw.iter()
            .map(|(name, server)| {
                let built = Self::build(name, server, base_dir, env)?;
                if let Some(first) = by_prefix.insert(built.prefix.clone(), name.clone()) {
                    return Err(FieldError::new(
                        format!("mcp_servers.{name}.prefix"),
                        format!(
                            "prefix {:?} is already used by mcp_servers.{first}; give each server its own prefix",
                            built.prefix
                        ),
                    ));
                }
                Ok(built)
            })
            .collect()
    }

    pub fn build(
        name: &str,
        raw: &RawMcpServer,
        base_dir: &Path,
        env: &Env,
    ) -> Result<Self, FieldError> {
        let at = |field: &str| format!("mcp_servers.{name}.{field}");
        let mut credentials = None;
        let transport = match (&raw.command, &raw.url) {
            (Some(command), None) => {
                let (program, args) = command
                    .split_first()
                    .ok_or_else(|| FieldError::new(at("command"), "must name a program"))?;
                let mut program_env: BTreeMap<String, String> = raw
                    .env
                    .iter()
                    .filter_map(|k| env.get(k).map(|v| (k.clone(), v.to_owned())))
                    .collect();
                program_env.extend(raw.set_env.clone());
                let search = program_env
                    .get("PATH")
                    .map(String::as_str)
                    .or_else(|| env.get("PATH"));
                Transport::Stdio {
                    program: program_path(program, base_dir, search),
                    args: args.to_vec(),
                    env: program_env,
                }
            }
            (None, Some(url)) => {
                let parsed = Url::parse(url).map_err(|err| {
                    FieldError::new(at("url"), format!("invalid URL {url:?}: {err}"))
                })?;
                check_url(&parsed, &at("url"))?;
                credentials = raw
                    .credentials
                    .as_ref()
                    .map(|c| CredentialSpec::build(c, &at("credentials"), base_dir))
                    .transpose()?;
                if let Some(CredentialSpec::PassThrough { .. }) = credentials {
                    // The session's own requests (initialize, tools/list) are made for no caller.
                    return Err(FieldError::new(
                        at("credentials.pass_through"),
                        "an MCP server's session is shared by every caller, so its own requests would have no token to pass on; use token_exchange (the session then carries the sidecar's token from the same grant) or client_credentials",
                    ));
                }
                Transport::Http {
                    url: parsed,
                    destination: Destination::build(
                        format!("MCP server {name}"),
                        raw.allow_private_addresses,
                        &raw.allow_private_cidrs,
                        &raw.resolve,
                        at,
                    )?,
                }
            }
            _ => {
                return Err(FieldError::new(
                    format!("mcp_servers.{name}"),
                    "set exactly one of command (stdio) or url (Streamable HTTP)",
                ));
            }
        };
        if matches!(transport, Transport::Stdio { .. })
            && (raw.allow_private_addresses
                || !raw.allow_private_cidrs.is_empty()
                || !raw.resolve.is_empty()
                || raw.credentials.is_some())
        {
            return Err(FieldError::new(
                format!("mcp_servers.{name}"),
                "allow_private_addresses, allow_private_cidrs, resolve and credentials apply to url servers only",
            ));
        }
        let prefix = raw.prefix.clone().unwrap_or_else(|| name.to_owned());
        if prefix.is_empty()
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        {
            return Err(FieldError::new(
                at("prefix"),
                format!("invalid prefix {prefix:?}: use A-Z a-z 0-9 _ -"),
            ));
        }
        let startup_timeout = match &raw.startup_timeout {
            Some(text) => parse_duration(text)
                .map_err(|err| FieldError::new(at("startup_timeout"), err.to_string()))?,
            None => Duration::from_secs(30),
        };
        let max_message_bytes = match raw.max_message_bytes {
            Some(0) => {
                return Err(FieldError::new(
                    at("max_message_bytes"),
                    "must be greater than 0",
                ));
            }
            Some(n) => n,
            None => DEFAULT_MAX_MESSAGE_BYTES,
        };
        Ok(McpServerConfig {
            name: name.to_owned(),
            transport,
            prefix,
            startup_timeout,
            credentials,
            max_message_bytes,
            tools: raw.tools.keys().cloned().collect(),
        })
    }

    /// What about this server cannot work on this machine (a stdio program that is missing or
    /// not executable); see `ProcessSpec::host_problems`.
    pub fn host_problems(&self) -> Vec<FieldError> {
        match &self.transport {
            Transport::Stdio { program, .. } => runnable(program)
                .err()
                .map(|why| {
                    FieldError::new(
                        format!("mcp_servers.{}.command", self.name),
                        why.to_string(),
                    )
                })
                .into_iter()
                .collect(),
            Transport::Http { .. } => Vec::new(),
        }
    }
}
