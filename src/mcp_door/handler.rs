//! The MCP door's request handler (rmcp's `ServerHandler`): `tools/list` is the boundary's
//! ListTools for this caller, `tools/call` is `Boundary::execute` with nothing skipped. The
//! caller is the one the door's admission identified from the HTTP request's headers, never
//! anything the host or the model sends.

use std::{borrow::Cow, sync::Arc, time::Duration};

use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CacheScope, CallToolRequestParams, CallToolResponse, ClientCapabilities, ElicitRequest,
        ElicitRequestParams, Implementation, InputRequest, InputRequests, InputRequiredResult,
        ListToolsResult, MetaObject, NumberOrString, PaginatedRequestParams, ProtocolVersion,
        RequestMetaObject, ServerCapabilities, ServerConfig, SubscriptionFilter,
    },
    service::{RequestContext, SubscriptionContext},
};
use serde_json::Value;
use tokio::time::Instant;

use super::{
    approval_state::ApprovalStates,
    cancels::Cancels,
    convert::{self, CallMeta, meta_keys},
};
use crate::{
    admission::{AdmissionLayer, Identified},
    boundary::{Boundary, ResponseBudget, Turn},
    error::{Reason, Status},
    identity::{Caller, Door},
    outcome::CallOutcome,
    settings::LimitsConfig,
    telemetry::spans,
};

/// The revisions served, newest first: 2026-07-28 (stateless, per-request metadata) and
/// 2025-11-25 (initialize, served statelessly too).
pub const SERVED_REVISIONS: &[ProtocolVersion] =
    &[ProtocolVersion::V_2026_07_28, ProtocolVersion::V_2025_11_25];

/// The key of the approval's elicitation in an `InputRequiredResult`.
const APPROVAL_INPUT: &str = "toolgate/approval";

/// What the handler of every request shares.
pub struct Handler {
    pub boundary: Arc<Boundary>,
    pub limits: LimitsConfig,
    pub tracer: spans::Tracer,
    /// The deadline of each call (bounded again by its tool's timeout).
    pub request_timeout: Duration,
    /// Where a person decides an approval, `{approval_id}` to replace.
    pub approvals_url: Option<String>,
    pub states: ApprovalStates,
    /// Ends subscriptions when shutdown begins.
    pub admission: AdmissionLayer,
    /// The calls in flight a 2025-11-25 host's `notifications/cancelled` may name.
    pub cancels: Arc<Cancels>,
}

/// What one `tools/call` asks, wherever it was read (by rmcp, or by the plain-call path).
pub(super) struct Asked<'a> {
    pub caller: &'a Arc<Caller>,
    pub params: &'a CallToolRequestParams,
    /// The request's `_meta`, taken out of its params.
    pub meta: &'a RequestMetaObject,
    pub parts: Option<&'a http::request::Parts>,
    pub id: &'a NumberOrString,
}

/// The HTTP request's parts rmcp keeps with a request.
fn http_parts(context: &RequestContext<RoleServer>) -> Option<&http::request::Parts> {
    context.extensions.get::<http::request::Parts>()
}

/// The caller the door's admission identified.
pub(super) fn caller(parts: Option<&http::request::Parts>) -> Result<Arc<Caller>, McpError> {
    parts
        .and_then(|parts| parts.extensions.get::<Identified>())
        .map(|identified| identified.0.clone())
        // Only a door built without its admission gets here: refuse, never guess.
        .ok_or_else(|| McpError::internal_error("the caller was not identified", None))
}

/// The caller's trace context: `_meta.traceparent` first (SEP-414), then the HTTP headers'.
fn trace_parent(
    parts: Option<&http::request::Parts>,
    meta: Option<&MetaObject>,
) -> opentelemetry::Context {
    if let Some(traceparent) = meta.and_then(|m| m.get_traceparent()) {
        return spans::extract_from_meta(traceparent, meta.and_then(|m| m.get_tracestate()));
    }
    parts
        .and_then(|parts| parts.extensions.get::<spans::RemoteContext>())
        .map(|remote| remote.0.clone())
        .unwrap_or_default()
}

/// What a host's revision changes in a call's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Revision {
    /// Before 2026-07-28: the result, always.
    Legacy,
    /// 2026-07-28 or later: an approval to get is asked as an input request of a host that can
    /// open URLs.
    Modern,
}

impl Revision {
    pub(super) fn of(version: Option<&ProtocolVersion>) -> Revision {
        match version.is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str()) {
            false => Revision::Legacy,
            true => Revision::Modern,
        }
    }
}

/// Whether a host with these capabilities opens a URL it is asked to (URL elicitation).
pub(super) fn opens_urls(capabilities: Option<ClientCapabilities>) -> bool {
    capabilities
        .and_then(|caps| caps.elicitation)
        .is_some_and(|elicitation| elicitation.url.is_some())
}

impl Handler {
    /// The turn of one `tools/call`, from the caller and `_meta`; a malformed identifier refuses
    /// the request, as the gRPC door refuses it.
    fn turn(
        &self,
        caller: Arc<Caller>,
        meta: &CallMeta<'_>,
        trace_parent: opentelemetry::Context,
    ) -> Result<Turn, McpError> {
        let fields = crate::boundary::TurnFields {
            caller,
            door: Door::Mcp,
            run_id: meta.run_id.unwrap_or_default(),
            step: meta.step,
            catalog_revision: meta.catalog_revision,
            deadline: Some(Instant::now() + self.request_timeout),
            trace_parent,
        };
        Turn::new(fields, &self.limits).map_err(|bad| McpError::invalid_params(bad.0, None))
    }

    /// Runs one `tools/call` through the boundary: the outcome, and the approval a 2026-07-28
    /// host's `requestState` redeemed. The host cancelling (dropping the HTTP request, `cancelled`
    /// or a notice naming it) drops the call: the boundary audits it CANCELLED and stops its
    /// backend, as for a gRPC cancel.
    pub(super) async fn execute(
        &self,
        asked: Asked<'_>,
        cancelled: impl std::future::Future<Output = ()>,
    ) -> Result<(CallOutcome, Option<String>), McpError> {
        let Asked {
            caller,
            params,
            meta,
            parts,
            id,
        } = asked;
        // rmcp moves a request's `_meta` out of its params; `params.meta` is the fallback.
        let meta = match (meta.0.is_empty(), params.meta.as_ref()) {
            (true, Some(params_meta)) => Some(&params_meta.0),
            _ => Some(&meta.0),
        };
        let fields = CallMeta::read(meta.map(|m| &m.0))
            .map_err(|err| McpError::invalid_params(err.to_string(), None))?;
        let trace_parent = trace_parent(parts, meta);
        let turn = self.turn(caller.clone(), &fields, trace_parent)?;
        // A 2026-07-28 host's retry echoes the state the approval was asked for with.
        let redeemed = match &params.request_state {
            Some(state) => Some(
                self.states
                    .open(state, caller, &params.name)
                    .map_err(|err| McpError::invalid_params(err.to_string(), None))?,
            ),
            None => None,
        };
        let call_id = convert::call_id(id);
        let notice = self.cancels.register(caller, call_id.clone());
        let call = convert::call_request(
            call_id,
            &params.name,
            params.arguments.as_ref(),
            &fields,
            redeemed.clone(),
        );
        let budget = ResponseBudget::new(self.limits.max_message_bytes, 1);
        let outcome = tokio::select! {
            outcome = self.boundary.execute(&turn, call, 0, &budget) => outcome,
            () = cancelled => {
                return Err(McpError::invalid_request("the request was cancelled", None));
            }
            () = notice.token.cancelled() => {
                return Err(McpError::invalid_request("the request was cancelled by notifications/cancelled", None));
            }
        };
        Ok((outcome, redeemed))
    }

    /// The answer a host reads: the tool result or, for a 2026-07-28 host that can open URLs
    /// (asked only when there is an approval to get), the approval as an input request.
    pub(super) fn respond(
        &self,
        outcome: CallOutcome,
        redeemed: Option<String>,
        caller: &Caller,
        params: &CallToolRequestParams,
        revision: Revision,
        opens_urls: impl FnOnce() -> bool,
    ) -> CallToolResponse {
        if revision == Revision::Modern {
            let pending = outcome
                .refusal
                .as_ref()
                .is_some_and(|r| r.reason == Reason::ApprovalPending);
            let ask = match outcome.status {
                Status::ApprovalRequired => outcome.approval_id.clone(),
                // Still pending on the retry: ask again, unless the host said no.
                _ if pending && !Self::declined(params) => redeemed,
                _ => None,
            };
            if let Some(approval_id) = ask
                && opens_urls()
                && let Some(input) = self.approval_input(caller, &outcome, &approval_id)
            {
                return input.into();
            }
        }
        let declared = self.declares_output_schema(&outcome, &caller.tenant);
        convert::tool_result(outcome, declared).into()
    }

    /// For a 2026-07-28 host that can open a URL: the approval to get, as an input request, and
    /// the sealed state its retry echoes; none when no approvals URL is configured.
    fn approval_input(
        &self,
        caller: &Caller,
        outcome: &CallOutcome,
        approval_id: &str,
    ) -> Option<InputRequiredResult> {
        let url = self.approvals_url.as_ref()?;
        let url = url.replace("{approval_id}", approval_id);
        let message = format!(
            "{} needs an approval ({approval_id}) before it runs with these arguments. Someone other than you decides it at {url}; continue once it is approved.",
            outcome.tool
        );
        let params = ElicitRequestParams::UrlElicitationParams {
            meta: None,
            message,
            url,
            elicitation_id: approval_id.to_owned(),
        };
        let mut requests = InputRequests::new();
        requests.insert(
            APPROVAL_INPUT.to_owned(),
            InputRequest::Elicitation(ElicitRequest::new(params)),
        );
        let state = self.states.seal(caller, &outcome.tool, approval_id);
        let mut meta = MetaObject::new();
        meta.insert(meta_keys::APPROVAL_ID.into(), Value::from(approval_id));
        meta.insert(meta_keys::STATUS.into(), Value::from("APPROVAL_REQUIRED"));
        Some(InputRequiredResult::new(Some(requests), Some(state)).with_meta(meta))
    }

    /// Whether the host answered the approval's elicitation with anything but "accept".
    fn declined(params: &CallToolRequestParams) -> bool {
        params
            .input_responses
            .as_ref()
            .and_then(|responses| responses.get(APPROVAL_INPUT))
            .and_then(|response| response.get("action"))
            .and_then(Value::as_str)
            .is_some_and(|action| action != "accept")
    }

    /// Whether the outcome's tool declares an output schema (only asked of OK, JSON-looking
    /// outputs).
    fn declares_output_schema(&self, outcome: &CallOutcome, tenant: &str) -> bool {
        let text = outcome.model_text.trim_start();
        if outcome.status != Status::Ok || !(text.starts_with('{') || text.starts_with('[')) {
            return false;
        }
        self.boundary
            .catalog()
            .catalog
            .resolve(&outcome.tool, Some(&outcome.tool_version), tenant)
            .is_ok_and(|version| version.output_schema.is_some())
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        );
        info.protocol_version = ProtocolVersion::V_2026_07_28;
        info.server_info = Implementation::new("toolgate", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Tools governed by toolgate: every call is decided again by the sidecar (scopes, schemas, rate limits, approvals). A result with isError carries a TOOL_ERROR text saying what happened and what to do.".to_owned(),
        );
        info
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(SERVED_REVISIONS)
    }

    /// 2026-07-28 hosts may listen for `notifications/tools/list_changed`.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        (requested.tools_list_changed == Some(true))
            .then(|| SubscriptionFilter::builder().tools_list_changed().build())
    }

    /// Announces a catalog change only when it changes what this caller sees (its revision);
    /// ends when the host goes, or when shutdown begins.
    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        let caller = caller(http_parts(subscription.request_context()))?;
        let mut changes = self.boundary.watch_catalog();
        let (_, mut seen) = self.boundary.list_tools(&caller);
        loop {
            tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                () = self.admission.drain_started() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                }
            }
            let (_, revision) = self.boundary.list_tools(&caller);
            if revision == seen {
                continue;
            }
            seen = revision;
            if subscription
                .sink()
                .notify_tool_list_changed()
                .await
                .is_err()
            {
                return Ok(());
            }
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let parts = http_parts(&context);
        let caller = caller(parts)?;
        let meta: Option<&MetaObject> = Some(&context.meta.0);
        let mut span = spans::list_tools(&self.tracer, &caller.tenant, &trace_parent(parts, meta));
        let (tools, catalog_revision) = self.boundary.list_tools(&caller);
        spans::record_listed(&mut span, tools.len(), &catalog_revision);
        let mut result =
            ListToolsResult::with_all_items(tools.iter().map(|t| convert::tool(t)).collect());
        let mut meta = MetaObject::new();
        meta.insert(
            meta_keys::CATALOG_REVISION.into(),
            Value::from(catalog_revision),
        );
        result.meta = Some(meta);
        // What one caller sees is not another's: never shared, re-listed on every change.
        result.cache_scope = Some(CacheScope::Private);
        result.ttl_ms = Some(0);
        Ok(result)
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let parts = http_parts(&context);
        let caller = caller(parts)?;
        let asked = Asked {
            caller: &caller,
            params: &params,
            meta: &context.meta,
            parts,
            id: &context.id,
        };
        let (outcome, redeemed) = self.execute(asked, context.ct.cancelled()).await?;
        let revision = Revision::of(context.protocol_version().as_ref());
        Ok(
            self.respond(outcome, redeemed, &caller, &params, revision, || {
                opens_urls(context.client_capabilities())
            }),
        )
    }
}
