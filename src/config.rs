//! Loading a catalog file into the parts of a running sidecar: the plain sections ([`settings`],
//! which imports nothing of the sidecar), then what needs the sidecar's own modules — identity
//! keys, trace export, HTTP upstreams, MCP servers and the catalog itself. Modules below this one
//! (catalog, executors, identity, …) use `settings`; only this step and the server above it see
//! the whole [`Config`].

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use crate::settings::{
    self, ApprovalsConfig, AuditConfig, ConfigError, DEMO_CATALOG, DEMO_SOURCE, Env, FieldError,
    LimitsConfig, Loaded, Sections, ServerConfig, SignIn, StateConfig, catalog_dir, raw,
    resolve_path,
};
use crate::{
    catalog::{Catalog, CatalogInputs, Discovered, McpSource},
    executor::{Upstream, mcp::McpServerConfig},
    identity::{IdentityConfig, JwtSettings},
    telemetry::{OtlpProtocol, TelemetryConfig},
};

/// A loaded, validated configuration.
#[derive(Debug)]
pub struct Config {
    /// Where it came from (a path or `<embedded demo>`).
    pub source: String,
    /// The catalog file, when it came from one (watched for changes).
    pub file: Option<PathBuf>,
    /// What was read to build this config, so a change made right after loading is not missed
    /// and a reload can tell which sections changed.
    pub loaded: Loaded,
    pub server: ServerConfig,
    pub identity: IdentityConfig,
    pub limits: LimitsConfig,
    pub approvals: ApprovalsConfig,
    pub audit: AuditConfig,
    /// Where rate limits, approvals and idempotency results live.
    pub state: StateConfig,
    pub telemetry: TelemetryConfig,
    /// The catalog as loaded (MCP tools appear once their servers list them).
    pub catalog: Catalog,
    /// What the catalog is built from, for rebuilding it as MCP servers list their tools.
    pub catalog_inputs: CatalogInputs,
    /// The live side of the catalog's `upstreams` (its clients and slots), by name: the HTTP
    /// executor's, never the catalog's.
    pub upstreams: BTreeMap<String, Upstream>,
    /// How to reach each MCP server (started once, with the process).
    pub mcp_servers: Vec<McpServerConfig>,
    /// The shadow candidate catalog file (`shadow_catalog`), resolved against this file's
    /// directory; loaded and checked on its own, so a broken one never fails this config.
    pub shadow_catalog: Option<PathBuf>,
}

impl Config {
    /// Loads and validates a catalog file.
    pub fn load_file(path: &Path, env: &Env) -> Result<Config, ConfigError> {
        let source = path.display().to_string();
        // Relative paths inside are relative to the file's directory, which for a bare file name
        // (`--config catalog.yaml`) would be "": anchor it to the current directory now.
        let path = &std::path::absolute(path).map_err(|err| ConfigError {
            file: source.clone(),
            path: ".".into(),
            message: format!("cannot resolve the path: {err}"),
        })?;
        let text = settings::yaml_bounds::read_bounded(path).map_err(|err| ConfigError {
            file: source.clone(),
            path: ".".into(),
            message: err.to_string(),
        })?;
        let base_dir = catalog_dir(path);
        let loaded = Loaded::of(&text, &base_dir);
        let mut config = Self::from_yaml(&text, &source, &base_dir, env)?;
        config.file = Some(path.to_path_buf());
        config.loaded = loaded;
        Ok(config)
    }

    /// The embedded demo catalog, with the environment (`OTEL_*`, …) like any catalog.
    pub fn demo(env: &Env) -> Result<Config, ConfigError> {
        Self::from_yaml(DEMO_CATALOG, DEMO_SOURCE, Path::new("."), env)
    }

    /// Parses and validates YAML text; `base_dir` resolves relative file paths inside it.
    pub fn from_yaml(
        text: &str,
        source: &str,
        base_dir: &Path,
        env: &Env,
    ) -> Result<Config, ConfigError> {
        let in_file = |err: FieldError| ConfigError {
            file: source.to_owned(),
            path: err.path,
            message: err.message,
        };
        let raw = settings::parse_yaml(text).map_err(in_file)?;
        build(raw, source, base_dir, env).map_err(in_file)
    }
}

/// The plain sections first, then the parts built by the sidecar's modules.
fn build(
    raw: raw::RawConfig,
    source: &str,
    base_dir: &Path,
    env: &Env,
) -> Result<Config, FieldError> {
    settings::check_version(&raw)?;
    let telemetry = TelemetryConfig::build(raw.telemetry.as_ref(), env)?;
    let traces_grpc = telemetry
        .endpoint
        .as_deref()
        .filter(|_| telemetry.protocol == OtlpProtocol::Grpc);
    let Sections {
        server,
        limits,
        approvals,
        audit,
        state,
    } = Sections::build(&raw, base_dir, env, traces_grpc, &telemetry.service_name)?;
    let identity = IdentityConfig {
        dev_identity: raw.identity.dev_identity,
        dev_identity_on_network: raw.identity.allow_unauthenticated_network_callers,
        jwt: JwtSettings::build(&raw.identity.jwt, base_dir, env)?,
        max_identity_bytes: limits.max_identity_bytes,
        mcp_resource: server.mcp.as_ref().map(|mcp| mcp.resource.clone()),
        console_client_id: server
            .console
            .as_ref()
            .and_then(|console| match &console.sign_in {
                SignIn::Oidc(oidc) => Some(oidc.client_id.clone()),
                SignIn::Dev => None,
            }),
        delegation: crate::identity::delegation::DelegationKeys::from_raw(&raw.identity, base_dir)?,
    };
    identity.validate(server.listen)?;
    if let Some(console) = &server.console
        && let SignIn::Oidc(oidc) = &console.sign_in
        && let Some(jwt) = &identity.jwt
        && !jwt.trusts(oidc.issuer.as_str().trim_end_matches('/'))
    {
        return Err(FieldError::new(
            "server.console.oidc.issuer",
            format!(
                "{} is not an issuer identity.jwt trusts: its keys and claims mapping verify the console's ID tokens",
                oidc.issuer
            ),
        ));
    }
    if let Some(mcp) = &server.mcp {
        identity
            .check_listener(mcp.listen)
            .map_err(|err| FieldError::new("server.mcp.listen", err.to_string()))?;
    }
    let upstreams = raw
        .upstreams
        .iter()
        .map(|(name, upstream)| {
            Ok((
                name.clone(),
                Upstream::build(name, upstream, base_dir, env)?,
            ))
        })
        .collect::<Result<BTreeMap<_, _>, FieldError>>()?;
    let mcp_servers = McpServerConfig::build_all(&raw.mcp_servers, base_dir, env)?;
    let shadow_catalog = match raw.shadow_catalog.as_deref().map(str::trim) {
        Some("") => return Err(FieldError::new("shadow_catalog", "must not be blank")),
        Some(path) => Some(resolve_path(base_dir, path)),
        None => None,
    };
    let catalog_inputs = CatalogInputs {
        raw,
        approvals: approvals.clone(),
        limits: limits.clone(),
        base_dir: base_dir.to_path_buf(),
        env: env.clone(),
        upstreams: upstreams
            .iter()
            .map(|(name, upstream)| (name.clone(), upstream.base().clone()))
            .collect(),
        mcp_servers: mcp_servers
            .iter()
            .map(|server| McpSource {
                name: server.name.clone(),
                prefix: server.prefix.clone(),
            })
            .collect(),
    };
    let catalog = catalog_inputs.build(&Discovered::new())?;
    Ok(Config {
        source: source.to_owned(),
        file: None,
        server,
        identity,
        limits,
        approvals,
        audit,
        state,
        telemetry,
        catalog,
        catalog_inputs,
        upstreams,
        mcp_servers,
        shadow_catalog,
        loaded: Loaded::default(),
    })
}
