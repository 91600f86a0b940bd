//! What tool output may carry back to the model.

use super::*;

/// An output guard: which detectors screen a tool's output, and what each does.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOutputGuard {
    /// What every secret detector does (aws_access_key, github_token, gitlab_token,
    /// slack_token, private_key, jwt, authorization_header, connection_string_password):
    /// redact, block or off. Unset in a tool's section, the catalog's applies; unset in both,
    /// they redact.
    pub secrets: Option<RawGuardAction>,
    /// One built-in detector's action, over `secrets`; the personal-data detectors (email,
    /// payment_card, iban, phone) are off unless named here.
    #[serde(default)]
    pub detectors: BTreeMap<String, RawGuardAction>,
    /// The catalog's own detectors: a name and a regex.
    #[serde(default)]
    pub custom: Vec<RawCustomDetector>,
}

/// What a detector does with what it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RawGuardAction {
    /// Replace each match with `[REDACTED:<detector>]`.
    Redact,
    /// Withhold the whole output: the call ends `output_blocked`.
    Block,
    /// Do not look.
    Off,
}

/// A detector of the catalog's own.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCustomDetector {
    /// Its name, as redactions, audit events and metrics show it: lower-case letters, digits
    /// and '_'.
    pub name: String,
    /// A regex (Rust `regex` syntax: no look-around or backreferences, linear time). A group
    /// named `secret` (`(?P<secret>...)`) marks the part of a match that is redacted.
    pub pattern: String,
    /// What it does with a match (default redact).
    #[serde(default = "redact")]
    pub action: RawGuardAction,
}

fn redact() -> RawGuardAction {
    RawGuardAction::Redact
}
