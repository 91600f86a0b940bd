//! The `toolgate.v1` service implementations: take the caller the admission layer identified,
//! convert, call the boundary, convert back. No decisions are made here.

use std::sync::Arc;

use futures::{FutureExt, future::BoxFuture};
use tonic::{Request, Response, Status};

use super::convert;

use crate::{
    approvals,
    boundary::{Boundary, CallRequest, ResponseBudget, Turn},
    identity::{Caller, Door},
    proto::{
        self, approvals_server::Approvals, controls_server::Controls, tool_gate_server::ToolGate,
    },
    settings::LimitsConfig,
    telemetry::spans,
};

/// What both services need: the boundary. Callers were identified by the admission layer.
#[derive(Clone)]
pub struct Gate {
    pub boundary: Arc<Boundary>,
}

/// The caller the admission layer identified from the request's metadata.
fn caller<T>(request: &Request<T>) -> Result<Arc<Caller>, Status> {
    request
        .extensions()
        .get::<crate::admission::Identified>()
        .map(|identified| identified.0.clone())
        // Only a server built without the admission layer gets here: refuse, never guess.
        .ok_or_else(|| Status::unauthenticated("the caller was not identified"))
}

/// What ExecuteTool boxes: one call's future, held for as long as the call runs. Every call in
/// flight pays its size rounded up to the allocator's size class (mimalloc's are 1,280, 1,536,
/// 1,792 bytes here), so the test below holds it to 1,536.
fn single_call(
    boundary: &Boundary,
    turn: Turn,
    call: CallRequest,
    budget: ResponseBudget,
) -> impl Future<Output = Result<Response<proto::ExecuteToolResponse>, Status>> + Send + '_ {
    boundary.execute(turn, call, 0, budget).map(|outcome| {
        Ok(Response::new(proto::ExecuteToolResponse {
            result: Some(convert::tool_result(outcome)),
        }))
    })
}

pub struct ToolGateService {
    gate: Gate,
    limits: LimitsConfig,
    /// Makes the spans of ListTools and ExecuteTools (the boundary makes its calls' own).
    tracer: spans::Tracer,
}

impl ToolGateService {
    pub fn new(gate: Gate, limits: LimitsConfig, tracer: spans::Tracer) -> Self {
        ToolGateService {
            gate,
            limits,
            tracer,
        }
    }

    fn boundary(&self) -> &Boundary {
        &self.gate.boundary
    }

    /// The caller, run, step, shown revision and client deadline common to a request's calls.
    fn turn<T: TurnOfRequest>(&self, request: &Request<T>) -> Result<Turn, Status> {
        let body = request.get_ref();
        let fields = crate::boundary::TurnFields {
            caller: caller(request)?,
            door: crate::identity::Door::Grpc,
            run_id: body.run_id(),
            step: body.step(),
            catalog_revision: Some(body.catalog_revision()),
            // Set by the DeadlineLayer when the request arrived.
            deadline: request
                .extensions()
                .get::<super::deadline::Deadline>()
                .map(|d| d.0),
            trace_parent: remote_context(request),
        };
        Turn::new(fields, &self.limits).map_err(|bad| Status::invalid_argument(bad.0))
    }
}

/// The request fields that make a [`Turn`], shared by ExecuteTool and ExecuteTools.
trait TurnOfRequest {
    fn run_id(&self) -> &str;
    fn step(&self) -> u32;
    fn catalog_revision(&self) -> &str;
}

macro_rules! turn_fields {
    ($($request:ty),*) => {$(
        impl TurnOfRequest for $request {
            fn run_id(&self) -> &str {
                &self.run_id
            }
            fn step(&self) -> u32 {
                self.step
            }
            fn catalog_revision(&self) -> &str {
                &self.catalog_revision
            }
        }
    )*};
}

turn_fields!(
    proto::ExecuteToolRequest,
    proto::ExecuteToolsRequest,
    proto::ExplainToolRequest
);

/// The caller's trace context, put there by the `TraceContextLayer`.
fn remote_context<T>(request: &Request<T>) -> opentelemetry::Context {
    request
        .extensions()
        .get::<spans::RemoteContext>()
        .map(|remote| remote.0.clone())
        .unwrap_or_default()
}

#[tonic::async_trait]
impl ToolGate for ToolGateService {
    async fn list_tools(
        &self,
        request: Request<proto::ListToolsRequest>,
    ) -> Result<Response<proto::ListToolsResponse>, Status> {
        let caller = caller(&request)?;
        let boundary = self.boundary();
        let mut span = spans::list_tools(&self.tracer, &caller.tenant, &remote_context(&request));
        let (tools, catalog_revision) = boundary.list_tools(&caller);
        spans::record_listed(&mut span, tools.len(), &catalog_revision);
        Ok(Response::new(proto::ListToolsResponse {
            tools: tools.iter().map(|t| convert::tool_definition(t)).collect(),
            catalog_revision,
        }))
    }

    /// Written out instead of `async fn`: async_trait's block moves `request` into a local, so
    /// the decoded request would be held twice for as long as the call runs (rust-lang/rust
    /// #62958). The request is taken apart first, and the call's future owns the turn, the call
    /// and the response budget.
    fn execute_tool<'life0, 'async_trait>(
        &'life0 self,
        request: Request<proto::ExecuteToolRequest>,
    ) -> BoxFuture<'async_trait, Result<Response<proto::ExecuteToolResponse>, Status>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let turn_and_call = self.turn(&request).and_then(|turn| {
            let call = request
                .into_inner()
                .call
                .ok_or_else(|| Status::invalid_argument("ExecuteToolRequest.call is required"))?;
            Ok((turn, convert::call_request(call)))
        });
        let (turn, call) = match turn_and_call {
            Ok(turn_and_call) => turn_and_call,
            Err(status) => return Box::pin(std::future::ready(Err(status))),
        };
        let budget = ResponseBudget::new(self.limits.max_message_bytes, 1);
        Box::pin(single_call(self.boundary(), turn, call, budget))
    }

    async fn execute_tools(
        &self,
        request: Request<proto::ExecuteToolsRequest>,
    ) -> Result<Response<proto::ExecuteToolsResponse>, Status> {
        let mut turn = self.turn(&request)?;
        let body = request.into_inner();
        if body.calls.len() > self.limits.max_batch_calls {
            return Err(Status::invalid_argument(format!(
                "{} calls in one ExecuteTools request; the limit is {}",
                body.calls.len(),
                self.limits.max_batch_calls
            )));
        }
        // The batch span is the parent of its calls' spans.
        let span = spans::execute_tools(
            &self.tracer,
            &turn.caller.tenant,
            body.calls.len(),
            body.parallel,
            &turn.trace_parent,
        );
        turn.trace_parent = span.context(&turn.trace_parent);
        let calls = body.calls.into_iter().map(convert::call_request).collect();
        let max_parallel = usize::try_from(body.max_parallel).unwrap_or(usize::MAX);
        let outcomes = self
            .boundary()
            .execute_batch(&turn, calls, body.parallel, max_parallel)
            .await;
        drop(span);
        Ok(Response::new(proto::ExecuteToolsResponse {
            results: outcomes.into_iter().map(convert::tool_result).collect(),
        }))
    }

    async fn explain_tool(
        &self,
        request: Request<proto::ExplainToolRequest>,
    ) -> Result<Response<proto::ExplainToolResponse>, Status> {
        let turn = self.turn(&request)?;
        let call = request
            .into_inner()
            .call
            .ok_or_else(|| Status::invalid_argument("ExplainToolRequest.call is required"))?;
        let explained = self
            .boundary()
            .explain_tool(&turn, &convert::call_request(call))
            .await
            .map_err(|err| convert::explain_status(&err))?;
        Ok(Response::new(super::explain::explanation(explained)))
    }

    async fn explain_list_tools(
        &self,
        request: Request<proto::ExplainListToolsRequest>,
    ) -> Result<Response<proto::ExplainListToolsResponse>, Status> {
        let caller = caller(&request)?;
        let explained = self
            .boundary()
            .explain_list_tools(&caller)
            .map_err(|err| convert::explain_status(&err))?;
        Ok(Response::new(super::explain::visibility(explained)))
    }
}

/// Approvals in one ListApprovals page unless the request asks for fewer.
pub const DEFAULT_PAGE_SIZE: usize = 50;
/// The most approvals in one page: 200 previews of at most 1 KiB stay far below the encode limit.
pub const MAX_PAGE_SIZE: usize = 200;

pub struct ApprovalsService {
    gate: Gate,
}

impl ApprovalsService {
    pub fn new(gate: Gate) -> Self {
        ApprovalsService { gate }
    }
}

#[tonic::async_trait]
impl Approvals for ApprovalsService {
    async fn list_approvals(
        &self,
        request: Request<proto::ListApprovalsRequest>,
    ) -> Result<Response<proto::ListApprovalsResponse>, Status> {
        let approver = caller(&request)?;
        let body = request.into_inner();
        let state = convert::approval_state_filter(body.state)?;
        let page_size = match body.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => usize::try_from(n)
                .unwrap_or(MAX_PAGE_SIZE)
                .min(MAX_PAGE_SIZE),
        };
        let after = match body.page_token.as_str() {
            "" => None,
            token => Some(approvals::Cursor::parse(token).ok_or_else(|| {
                convert::decide_status(&approvals::DecideError::InvalidPageToken)
            })?),
        };
        let page = self
            .gate
            .boundary
            .list_approvals(
                &approver,
                state,
                approvals::Order::OldestFirst,
                page_size,
                after.as_ref(),
            )
            .await
            .map_err(|e| convert::decide_status(&e))?;
        Ok(Response::new(proto::ListApprovalsResponse {
            approvals: page
                .approvals
                .into_iter()
                .map(convert::approval_summary)
                .collect(),
            next_page_token: page.next.map(|c| c.token()).unwrap_or_default(),
        }))
    }

    async fn get_approval(
        &self,
        request: Request<proto::GetApprovalRequest>,
    ) -> Result<Response<proto::GetApprovalResponse>, Status> {
        let approver = caller(&request)?;
        let approval = self
            .gate
            .boundary
            .get_approval(&approver, &request.get_ref().approval_id)
            .await
            .map_err(|e| convert::decide_status(&e))?;
        Ok(Response::new(proto::GetApprovalResponse {
            approval: Some(convert::approval(approval)),
        }))
    }

    async fn decide_approval(
        &self,
        request: Request<proto::DecideApprovalRequest>,
    ) -> Result<Response<proto::DecideApprovalResponse>, Status> {
        let approver = caller(&request)?;
        let body = request.into_inner();
        let approval = self
            .gate
            .boundary
            .decide_approval(
                &approver,
                &body.approval_id,
                convert::decision(body.decision),
                &body.reason,
                Door::Grpc,
            )
            .await
            .map_err(|e| convert::decide_status(&e))?;
        Ok(Response::new(proto::DecideApprovalResponse {
            approval: Some(convert::approval(approval)),
        }))
    }
}

pub struct ControlsService {
    gate: Gate,
}

impl ControlsService {
    pub fn new(gate: Gate) -> Self {
        ControlsService { gate }
    }
}

#[tonic::async_trait]
impl Controls for ControlsService {
    async fn set_emergency_deny(
        &self,
        request: Request<proto::SetEmergencyDenyRequest>,
    ) -> Result<Response<proto::SetEmergencyDenyResponse>, Status> {
        let operator = caller(&request)?;
        let new = convert::new_deny(request.into_inner());
        let deny = self
            .gate
            .boundary
            .set_emergency_deny(&operator, new)
            .await
            .map_err(|e| convert::deny_status(&e))?;
        Ok(Response::new(proto::SetEmergencyDenyResponse {
            deny: Some(convert::emergency_deny(deny)),
            shared: self.gate.boundary.emergency_denies_are_shared(),
        }))
    }

    async fn clear_emergency_deny(
        &self,
        request: Request<proto::ClearEmergencyDenyRequest>,
    ) -> Result<Response<proto::ClearEmergencyDenyResponse>, Status> {
        let operator = caller(&request)?;
        let deny = self
            .gate
            .boundary
            .clear_emergency_deny(&operator, &request.get_ref().deny_id)
            .await
            .map_err(|e| convert::deny_status(&e))?;
        Ok(Response::new(proto::ClearEmergencyDenyResponse {
            deny: Some(convert::emergency_deny(deny)),
            shared: self.gate.boundary.emergency_denies_are_shared(),
        }))
    }

    async fn list_emergency_denies(
        &self,
        request: Request<proto::ListEmergencyDeniesRequest>,
    ) -> Result<Response<proto::ListEmergencyDeniesResponse>, Status> {
        let operator = caller(&request)?;
        let denies = self
            .gate
            .boundary
            .list_emergency_denies(&operator)
            .map_err(|e| convert::deny_status(&e))?;
        Ok(Response::new(proto::ListEmergencyDeniesResponse {
            denies: denies.into_iter().map(convert::emergency_deny).collect(),
            shared: self.gate.boundary.emergency_denies_are_shared(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `make` returns, without making one.
    fn returned_size<'a, F>(
        _make: fn(&'a Boundary, Turn, CallRequest, ResponseBudget) -> F,
    ) -> usize {
        size_of::<F>()
    }

    /// mimalloc rounds 1,537 bytes up to 1,792: 256 more bytes per call in flight.
    #[test]
    fn a_waiting_call_fits_the_allocators_1536_byte_class() {
        let size = returned_size(single_call);
        assert!(
            size <= 1536,
            "ExecuteTool's future is {size} bytes, over mimalloc's 1,536-byte size class"
        );
    }
}
