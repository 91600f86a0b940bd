//! MCP <-> domain conversion: a tool definition as `tools/list` shows it, a `tools/call` as the
//! domain's call, and a call's outcome as the tool result a host reads. Nothing is decided here:
//! every outcome, OK or refused, is the boundary's.

use std::{borrow::Cow, sync::Arc};

use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, MetaObject, NumberOrString, Tool, ToolAnnotations,
};
use serde_json::Value;

use crate::{
    boundary::CallRequest, catalog::ToolVersion, error::Status, outcome::CallOutcome,
    settings::RiskLevel,
};

/// The `_meta` keys a host may send with `tools/call` (all optional), and the ones results carry.
pub mod meta_keys {
    /// The agent run the call belongs to (as `run_id` on the gRPC door).
    pub const RUN_ID: &str = "toolgate/run_id";
    /// The model turn within the run (a whole number).
    pub const STEP: &str = "toolgate/step";
    /// Makes a retried write run once.
    pub const IDEMPOTENCY_KEY: &str = "toolgate/idempotency_key";
    /// Redeems an approved approval (2025-11-25 hosts; 2026-07-28 hosts echo `requestState`).
    pub const APPROVAL_ID: &str = "toolgate/approval_id";
    /// The catalog revision the model was shown (`tools/list` results carry it).
    pub const CATALOG_REVISION: &str = "toolgate/catalog_revision";
    /// Pins a tool version.
    pub const TOOL_VERSION: &str = "toolgate/tool_version";
    /// On results: the ToolStatus, as the gRPC door names it.
    pub const STATUS: &str = "toolgate/status";
    /// On refusals: the refusal's `error_type`.
    pub const ERROR_TYPE: &str = "toolgate/error_type";
    /// On refusals: the stage that refused.
    pub const REFUSED_BY: &str = "toolgate/refused_by";
    pub const RETRYABLE: &str = "toolgate/retryable";
    pub const RETRY_AFTER_MS: &str = "toolgate/retry_after_ms";
    pub const IDEMPOTENT_REPLAY: &str = "toolgate/idempotent_replay";
}

/// A catalog version as `tools/list` shows it: the schema the model may see (bound parameters
/// removed), hints from its risk level, and toolgate's own facts under `_meta`.
pub fn tool(version: &ToolVersion) -> Tool {
    let input_schema = match &version.visible_schema {
        Value::Object(schema) => schema.clone(),
        // Loading refuses non-object schemas; an empty object schema is the safe reading.
        _ => JsonObject::new(),
    };
    let output_schema = match &version.output_schema {
        Some(Value::Object(schema)) => Some(Arc::new(schema.clone())),
        _ => None,
    };
    let mut annotations = ToolAnnotations::default();
    annotations.read_only_hint = Some(version.risk_level == RiskLevel::ReadOnly);
    annotations.destructive_hint = Some(version.risk_level == RiskLevel::Destructive);
    let mut meta = MetaObject::new();
    meta.insert("toolgate/version".into(), Value::from(&*version.version));
    meta.insert(
        "toolgate/risk_level".into(),
        Value::from(version.risk_level.as_str()),
    );
    meta.insert(
        "toolgate/requires_approval".into(),
        Value::from(version.requires_approval),
    );
    let mut tool = Tool::new(
        Cow::Owned(version.name.clone()),
        Cow::Owned(version.description.clone()),
        Arc::new(input_schema),
    );
    tool.output_schema = output_schema;
    tool.annotations = Some(annotations);
    tool.meta = Some(meta);
    tool
}

/// The JSON-RPC id as the call's `call_id` (the boundary makes one when it is unusable).
pub fn call_id(id: &NumberOrString) -> String {
    match id {
        NumberOrString::Number(n) => n.to_string(),
        NumberOrString::String(s) => s.to_string(),
    }
}

/// Why a `tools/call` could not be read as a call: a malformed request, answered with a protocol
/// error (policy decisions never are).
#[derive(Debug, thiserror::Error)]
pub enum Malformed {
    #[error("_meta[\"{key}\"] must be {expected}")]
    Meta {
        key: &'static str,
        expected: &'static str,
    },
}

/// What a `tools/call`'s `_meta` tells toolgate, each key read as its type. A key of another
/// type is a malformed request, never taken as absent: an idempotency key sent as a number must
/// not let a retried write run twice (the gRPC door's fields are typed, so it cannot happen
/// there). Absent, `null` and blank strings are absent, as an empty field is on the gRPC door.
#[derive(Debug, Default)]
pub struct CallMeta<'a> {
    pub run_id: Option<&'a str>,
    pub step: u32,
    pub catalog_revision: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
    pub approval_id: Option<&'a str>,
    pub tool_version: Option<&'a str>,
}

impl<'a> CallMeta<'a> {
    pub fn read(meta: Option<&'a JsonObject>) -> Result<Self, Malformed> {
        let text = |key| text(meta, key);
        Ok(CallMeta {
            run_id: text(meta_keys::RUN_ID)?,
            step: step(meta)?,
            catalog_revision: text(meta_keys::CATALOG_REVISION)?,
            idempotency_key: text(meta_keys::IDEMPOTENCY_KEY)?,
            approval_id: text(meta_keys::APPROVAL_ID)?,
            tool_version: text(meta_keys::TOOL_VERSION)?,
        })
    }
}

/// A `_meta` string: `None` when absent, `null` or blank; malformed when of another type.
fn text<'a>(meta: Option<&'a JsonObject>, key: &'static str) -> Result<Option<&'a str>, Malformed> {
    match meta.and_then(|m| m.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.trim()).filter(|t| !t.is_empty())),
        Some(_) => Err(Malformed::Meta {
            key,
            expected: "a string",
        }),
    }
}

/// The step from `_meta`, 0 when absent.
fn step(meta: Option<&JsonObject>) -> Result<u32, Malformed> {
    match meta.and_then(|m| m.get(meta_keys::STEP)) {
        None | Some(Value::Null) => Ok(0),
        Some(value) => value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or(Malformed::Meta {
                key: meta_keys::STEP,
                expected: "a whole number below 2^32",
            }),
    }
}

/// The domain call of a `tools/call`.
pub fn call_request(
    call_id: String,
    name: &str,
    arguments: Option<&JsonObject>,
    meta: &CallMeta<'_>,
    approval_id: Option<String>,
) -> CallRequest {
    CallRequest {
        call_id,
        name: name.to_owned(),
        arguments_json: match arguments {
            // A map of JSON values always serializes.
            Some(arguments) => serde_json::to_string(arguments).unwrap_or_default(),
            None => "{}".to_owned(),
        },
        version: meta.tool_version.map(str::to_owned),
        idempotency_key: meta.idempotency_key.map(str::to_owned),
        approval_id: approval_id.or_else(|| meta.approval_id.map(str::to_owned)),
    }
}

/// A call's outcome as a tool result: `model_text` as the content, OK or not (a refusal is a tool
/// result with `isError`, never a protocol error), `structuredContent` when the tool declares an
/// output schema and the output is JSON, and the outcome's facts under `_meta`.
pub fn tool_result(outcome: CallOutcome, output_schema_declared: bool) -> CallToolResult {
    let mut meta = MetaObject::new();
    meta.insert(
        meta_keys::STATUS.into(),
        Value::from(outcome.status.as_str()),
    );
    if !outcome.tool_version.is_empty() {
        meta.insert(
            "toolgate/version".into(),
            Value::from(outcome.tool_version.as_str()),
        );
    }
    if let Some(approval_id) = &outcome.approval_id {
        meta.insert(
            meta_keys::APPROVAL_ID.into(),
            Value::from(approval_id.as_str()),
        );
    }
    if outcome.idempotent_replay {
        meta.insert(meta_keys::IDEMPOTENT_REPLAY.into(), Value::from(true));
    }
    if let Some(refusal) = &outcome.refusal {
        meta.insert(
            meta_keys::ERROR_TYPE.into(),
            Value::from(refusal.reason.code()),
        );
        meta.insert(
            meta_keys::REFUSED_BY.into(),
            Value::from(refusal.stage.as_str()),
        );
        meta.insert(meta_keys::RETRYABLE.into(), Value::from(refusal.retryable));
        if let Some(after) = refusal.retry_after {
            meta.insert(
                meta_keys::RETRY_AFTER_MS.into(),
                Value::from(u64::try_from(after.as_millis()).unwrap_or(u64::MAX)),
            );
        }
    }
    let ok = outcome.status == Status::Ok;
    let structured = (ok && output_schema_declared)
        .then(|| serde_json::from_str::<Value>(&outcome.model_text).ok())
        .flatten();
    let content = vec![ContentBlock::text(outcome.model_text)];
    let mut result = match ok {
        true => CallToolResult::success(content),
        false => CallToolResult::error(content),
    };
    result.structured_content = structured;
    result.meta = Some(meta);
    result
}
