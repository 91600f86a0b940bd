//! Who may call what: the allow and deny lists of the policy, tenants and agents.

use super::*;

/// Allow and deny lists of tool-name globs (e.g. `ticket_*`), each entry optionally with a
/// condition. Deny wins.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawAccessList {
    /// If set, only tools matching one of these entries.
    pub allow: Option<Vec<RawRule>>,
    /// Never tools matching one of these entries.
    #[serde(default)]
    pub deny: Vec<RawRule>,
}

/// When a tool's calls need approval.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawToolApproval {
    /// A CEL expression over `caller`, `tool`, `args`, `now` and `run`: a call needs approval
    /// only when it is true (or cannot be evaluated). Without it, every call does.
    pub when: String,
}

/// An allow or deny entry: a tool-name glob, or globs with a CEL condition
/// (`{ tools: [send_email], when: "!args.to.endsWith('@acme.com')" }`).
#[derive(Debug, Clone, JsonSchema)]
#[serde(untagged)]
pub enum RawRule {
    /// A tool-name glob, e.g. `ticket_*`.
    Glob(String),
    /// Globs the rule applies to only when its condition holds.
    Conditional(RawConditionalRule),
}

/// Globs with a condition.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConditionalRule {
    /// Tool-name globs, e.g. `[send_email]`.
    pub tools: Vec<String>,
    /// A CEL expression over `caller`, `tool`, `args`, `now` and `run`; the rule applies only
    /// when it is true.
    pub when: String,
}

// By hand rather than `untagged`: a mistyped object entry gets its own error (an unknown field,
// a missing `when`) instead of "did not match any variant".
impl<'de> Deserialize<'de> for RawRule {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = RawRule;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a tool-name glob, or { tools: [globs], when: \"condition\" }")
            }
            fn visit_str<E: serde::de::Error>(self, glob: &str) -> Result<RawRule, E> {
                Ok(RawRule::Glob(glob.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawRule, A::Error> {
                RawConditionalRule::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawRule::Conditional)
            }
        }
        deserializer.deserialize_any(Entry)
    }
}

/// One tenant's policy.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    /// If set, only tools matching one of these entries.
    pub allow: Option<Vec<RawRule>>,
    /// Never tools matching one of these entries.
    #[serde(default)]
    pub deny: Vec<RawRule>,
    /// Overall rate limit for the tenant across all tools, e.g. `1000/min`.
    pub rate_limit: Option<RawRateLimit>,
}
